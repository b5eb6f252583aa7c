"""A GGUF file's metadata, read without llama.cpp: the one reader of it, for a model (Ollama's /api/show) and for
files llama.cpp's API says nothing of (a projector's).

Stdlib and numpy only. Layout (GGUF v2/v3): magic, version, tensor count, metadata count; then the metadata as
(key, type, value). perf/gguf_io.py writes the same container.
"""

from __future__ import annotations

import struct
from typing import BinaryIO

# metadata value types
UINT8, INT8, UINT16, INT16, UINT32, INT32, FLOAT32, BOOL, STRING, ARRAY, UINT64, INT64, FLOAT64 = range(13)
SCALAR = {
    UINT8: "<B",
    INT8: "<b",
    UINT16: "<H",
    INT16: "<h",
    UINT32: "<I",
    INT32: "<i",
    FLOAT32: "<f",
    BOOL: "<?",
    UINT64: "<Q",
    INT64: "<q",
    FLOAT64: "<d",
}


def _read_str(f: BinaryIO) -> str:
    (n,) = struct.unpack("<Q", f.read(8))
    return f.read(n).decode("utf-8", errors="surrogateescape")


def _read_value(f: BinaryIO, kind: int):
    if kind == STRING:
        return _read_str(f)
    if kind == ARRAY:
        elem, n = struct.unpack("<IQ", f.read(12))
        if elem in SCALAR and elem != BOOL:
            import numpy as np

            fmt = SCALAR[elem]
            return (elem, np.frombuffer(f.read(n * struct.calcsize(fmt)), dtype=fmt).tolist())
        return (elem, [_read_value(f, elem) for _ in range(n)])
    fmt = SCALAR[kind]
    return struct.unpack(fmt, f.read(struct.calcsize(fmt)))[0]


def _skip_value(f: BinaryIO, kind: int) -> None:
    if kind == STRING:
        (n,) = struct.unpack("<Q", f.read(8))
        f.seek(n, 1)
    elif kind == ARRAY:
        elem, n = struct.unpack("<IQ", f.read(12))
        if elem in SCALAR:
            f.seek(n * struct.calcsize(SCALAR[elem]), 1)
        else:
            for _ in range(n):
                _skip_value(f, elem)
    else:
        f.seek(struct.calcsize(SCALAR[kind]), 1)


def _header(f: BinaryIO, path: str) -> tuple[int, int]:
    """The tensor and metadata counts, past the magic and version."""
    magic, version, n_tensors, n_kv = struct.unpack("<4sIQQ", f.read(24))
    if magic != b"GGUF" or version < 2:
        raise ValueError(f"{path} is not a GGUF v2/v3 file")
    return n_tensors, n_kv


def read_metadata(path: str, arrays: bool = True) -> dict[str, tuple[int, object]]:
    """key -> (type, value) of a GGUF file's metadata; an array's value is (element type, list).

    ``arrays=False`` leaves the arrays out, read past (a vocabulary is most of a small model's metadata)."""
    with open(path, "rb") as f:
        _, n_kv = _header(f, path)
        out = {}
        for _ in range(n_kv):
            key = _read_str(f)
            (kind,) = struct.unpack("<I", f.read(4))
            if kind == ARRAY and not arrays:
                _skip_value(f, kind)
            else:
                out[key] = (kind, _read_value(f, kind))
        return out


def tensor_names(path: str) -> list[str]:
    """The names of a GGUF file's tensors, in its order (the infos after the metadata: name, dims, type, offset)."""
    with open(path, "rb") as f:
        n_tensors, n_kv = _header(f, path)
        for _ in range(n_kv):
            _read_str(f)
            (kind,) = struct.unpack("<I", f.read(4))
            _skip_value(f, kind)
        names = []
        for _ in range(n_tensors):
            names.append(_read_str(f))
            (n_dims,) = struct.unpack("<I", f.read(4))
            f.seek(8 * n_dims + 4 + 8, 1)
        return names
