"""The GGUF container, as much of it as perf/synth_model.py needs: read a file's metadata, write a header.

Self-contained (stdlib and numpy), so that it runs on a machine with no `gguf` package. Layout (GGUF v3):
magic, version, tensor count, metadata count; metadata as (key, type, value); tensor infos as (name, dims
innermost first, ggml type, offset into the data section); padding to the alignment; the tensors' data.
"""

from __future__ import annotations

import struct
from typing import BinaryIO

ALIGNMENT = 32

# metadata value types
UINT8, INT8, UINT16, INT16, UINT32, INT32, FLOAT32, BOOL, STRING, ARRAY, UINT64, INT64, FLOAT64 = range(13)
_SCALAR = {
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
        if elem in _SCALAR and elem != BOOL:
            import numpy as np

            fmt = _SCALAR[elem]
            return (elem, np.frombuffer(f.read(n * struct.calcsize(fmt)), dtype=fmt).tolist())
        return (elem, [_read_value(f, elem) for _ in range(n)])
    fmt = _SCALAR[kind]
    return struct.unpack(fmt, f.read(struct.calcsize(fmt)))[0]


def read_metadata(path: str) -> dict[str, tuple[int, object]]:
    """key -> (type, value) of a GGUF file's metadata; an array's value is (element type, list)."""
    with open(path, "rb") as f:
        magic, version, _n_tensors, n_kv = struct.unpack("<4sIQQ", f.read(24))
        if magic != b"GGUF" or version < 2:
            raise ValueError(f"{path} is not a GGUF v2/v3 file")
        out = {}
        for _ in range(n_kv):
            key = _read_str(f)
            (kind,) = struct.unpack("<I", f.read(4))
            out[key] = (kind, _read_value(f, kind))
        return out


def _str(s: str) -> bytes:
    b = s.encode("utf-8", errors="surrogateescape")
    return struct.pack("<Q", len(b)) + b


def _value(kind: int, value) -> bytes:
    if kind == STRING:
        return _str(value)
    if kind == ARRAY:
        elem, items = value
        head = struct.pack("<IQ", elem, len(items))
        if elem == STRING:
            return head + b"".join(_str(s) for s in items)
        if elem in _SCALAR:
            import numpy as np

            return head + np.asarray(items, dtype=_SCALAR[elem]).tobytes()
        return head + b"".join(_value(elem, v) for v in items)
    return struct.pack(_SCALAR[kind], value)


def pad(n: int, align: int = ALIGNMENT) -> int:
    return (n + align - 1) // align * align


def header(
    metadata: dict[str, tuple[int, object]], tensors: list[tuple[str, tuple[int, ...], int, int]]
) -> tuple[bytes, list[int]]:
    """A GGUF file's bytes up to its data section, and each tensor's offset in the file.

    tensors: (name, dims innermost first, ggml type, size in bytes), in file order.
    """
    parts = [struct.pack("<4sIQQ", b"GGUF", 3, len(tensors), len(metadata))]
    parts += [_str(k) + struct.pack("<I", kind) + _value(kind, v) for k, (kind, v) in metadata.items()]
    offsets, at = [], 0
    for name, dims, ggml_type, nbytes in tensors:
        parts.append(
            _str(name)
            + struct.pack("<I", len(dims))
            + struct.pack(f"<{len(dims)}Q", *dims)
            + struct.pack("<IQ", ggml_type, at)
        )
        offsets.append(at)
        at = pad(at + nbytes)
    head = b"".join(parts)
    head += b"\0" * (pad(len(head)) - len(head))
    return head, [len(head) + o for o in offsets]
