"""The GGUF container, as much of it as perf/synth_model.py needs: read a file's metadata (cllm.core.gguf_meta),
write a header.

Stdlib and numpy only, so that it runs on a machine with no `gguf` package. Layout (GGUF v3):
magic, version, tensor count, metadata count; metadata as (key, type, value); tensor infos as (name, dims
innermost first, ggml type, offset into the data section); padding to the alignment; the tensors' data.
"""

from __future__ import annotations

import struct

from cllm.core.gguf_meta import (  # noqa: F401 (read_metadata: perf's tools read files through here)
    ARRAY,
    BOOL,
    FLOAT32,
    INT32,
    SCALAR,
    STRING,
    UINT32,
    read_metadata,
)

ALIGNMENT = 32


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
        if elem in SCALAR:
            import numpy as np

            return head + np.asarray(items, dtype=SCALAR[elem]).tobytes()
        return head + b"".join(_value(elem, v) for v in items)
    return struct.pack(SCALAR[kind], value)


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
