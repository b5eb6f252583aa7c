"""Is a file a whole, sound GGUF? Checked before anything loads a file that came over the network.

llama.cpp's loader trusts more of a file than a server that pulls files for its clients should (Ollama's
CVE-2026-7482 was a heap read past a GGUF's end): here every count, string length, tensor shape, offset and size
is held against the file's real size before the file is kept. What a tensor's type costs in bytes comes from
ggml itself (ggml_type_size, ggml_blck_size in the library llama-cpp-python ships), so a type added to ggml is
known here the day the library has it, and one it does not know is refused.

Layout (GGUF v2/v3, ggml/include/gguf.h): magic, version, tensor count, metadata count; the metadata as (key,
type, value); the tensor infos as (name, n_dims, dims, type, offset into the data section); padding to the
alignment (general.alignment, else 32); the data section.
"""

from __future__ import annotations

import os
import struct
from functools import cache
from typing import BinaryIO

from cllm.core.gguf_meta import ARRAY, SCALAR, STRING, UINT32

MAX_DIMS = 4  # GGML_MAX_DIMS
DEFAULT_ALIGNMENT = 32  # GGUF_DEFAULT_ALIGNMENT
_MIN_KV = 8 + 4 + 1  # the smallest metadata entry: an empty key, its type, a one-byte value
_MIN_TENSOR = 8 + 4 + 8 + 4 + 8  # the smallest tensor info: an empty name, one dimension, type, offset


class GGUFError(ValueError):
    """The file is not a GGUF llama.cpp could load safely: one sentence saying where and why."""


class _Reader:
    """Reads from a file and refuses any read past its end, naming what was being read."""

    def __init__(self, f: BinaryIO, size: int):
        self.f, self.size, self.pos = f, size, 0

    def left(self) -> int:
        return self.size - self.pos

    def take(self, n: int, what: str) -> bytes:
        if n > self.left():
            raise GGUFError(f"{what} at byte {self.pos} needs {n} bytes but the file ends {self.left()} bytes later")
        data = self.f.read(n)
        self.pos += n
        return data

    def skip(self, n: int, what: str) -> None:
        if n > self.left():
            raise GGUFError(f"{what} at byte {self.pos} needs {n} bytes but the file ends {self.left()} bytes later")
        self.f.seek(n, 1)
        self.pos += n

    def unpack(self, fmt: str, what: str) -> tuple:
        return struct.unpack(fmt, self.take(struct.calcsize(fmt), what))

    def string(self, what: str) -> bytes:
        (n,) = self.unpack("<Q", f"the length of {what}")
        return self.take(n, f"{what} ({n} bytes long)")


def check(path: str) -> None:
    """GGUFError unless `path` is a GGUF whose every count, string and tensor lies inside the file."""
    size = os.path.getsize(path)
    with open(path, "rb") as f:
        r = _Reader(f, size)
        magic, version, n_tensors, n_kv = r.unpack("<4sIQQ", "the header")
        if magic != b"GGUF":
            raise GGUFError(f"it does not start with the GGUF magic (it starts with {magic!r})")
        if version not in (2, 3):
            raise GGUFError(f"its GGUF version is {version}; llama.cpp reads versions 2 and 3")
        if n_kv * _MIN_KV > r.left():
            raise GGUFError(f"it claims {n_kv:,} metadata entries, more than its {size:,} bytes can hold")
        if n_tensors * _MIN_TENSOR > r.left():
            raise GGUFError(f"it claims {n_tensors:,} tensors, more than its {size:,} bytes can hold")
        alignment = DEFAULT_ALIGNMENT
        for i in range(n_kv):
            key = r.string(f"metadata key {i}").decode("utf-8", errors="replace")
            (kind,) = r.unpack("<I", f"the type of {key}")
            if key == "general.alignment":
                alignment = _alignment(r, kind)
            else:
                _value(r, kind, key)
        tensors = [_tensor(r, i) for i in range(n_tensors)]
        data = -(-r.pos // alignment) * alignment
    _placed(tensors, data, size, alignment)


def _alignment(r: _Reader, kind: int) -> int:
    if kind != UINT32:
        raise GGUFError(f"general.alignment has type {kind}, not uint32")
    (alignment,) = r.unpack("<I", "general.alignment")
    if alignment == 0 or alignment & (alignment - 1):
        raise GGUFError(f"general.alignment is {alignment}, not a power of two")
    return alignment


def _value(r: _Reader, kind: int, key: str) -> None:
    if kind == STRING:
        r.string(f"the value of {key}")
    elif kind == ARRAY:
        elem, n = r.unpack("<IQ", f"the array header of {key}")
        if elem in SCALAR:
            r.skip(n * struct.calcsize(SCALAR[elem]), f"the {n:,} values of {key}")
        elif elem in (STRING, ARRAY):
            if n * (8 if elem == STRING else 12) > r.left():
                raise GGUFError(f"{key} claims {n:,} elements, more than the rest of the file can hold")
            for j in range(n):
                _value(r, elem, f"{key}[{j}]")
        else:
            raise GGUFError(f"{key} is an array of an unknown type ({elem})")
    elif kind in SCALAR:
        r.skip(struct.calcsize(SCALAR[kind]), f"the value of {key}")
    else:
        raise GGUFError(f"{key} has an unknown type ({kind})")


def _tensor(r: _Reader, i: int) -> tuple[str, int, int]:
    """(name, offset in the data section, size in bytes) of tensor info i."""
    name = r.string(f"the name of tensor {i}").decode("utf-8", errors="replace")
    (n_dims,) = r.unpack("<I", f"the dimension count of {name}")
    if not 1 <= n_dims <= MAX_DIMS:
        raise GGUFError(f"tensor {name} has {n_dims} dimensions; ggml allows 1 to {MAX_DIMS}")
    dims = r.unpack(f"<{n_dims}q", f"the dimensions of {name}")
    ggml_type, offset = r.unpack("<IQ", f"the type and offset of {name}")
    if any(d < 0 for d in dims):
        raise GGUFError(f"tensor {name} has a negative dimension {dims}")
    block, type_size = _type_size(ggml_type)
    if not block:
        raise GGUFError(f"tensor {name} has type {ggml_type}, which ggml does not know")
    if dims[0] % block:
        raise GGUFError(f"tensor {name}'s first dimension {dims[0]} is not a multiple of its type's block ({block})")
    nbytes = dims[0] // block * type_size
    for d in dims[1:]:
        nbytes *= d
    return name, offset, nbytes


def _placed(tensors: list[tuple[str, int, int]], data: int, size: int, alignment: int) -> None:
    """Every tensor aligned, inside the file, on bytes no other tensor has; names unique."""
    if len({t[0] for t in tensors}) != len(tensors):
        raise GGUFError("two tensors have the same name")
    end, last = 0, ""
    for name, offset, nbytes in sorted(tensors, key=lambda t: t[1]):
        if offset % alignment:
            raise GGUFError(f"tensor {name}'s offset {offset} is not a multiple of the alignment {alignment}")
        if data + offset + nbytes > size:
            raise GGUFError(
                f"tensor {name} ({nbytes:,} bytes at byte {data + offset:,}) runs past the file's end ({size:,} bytes)"
            )
        if offset < end:
            raise GGUFError(f"tensor {name} (at data offset {offset:,}) overlaps tensor {last}, which ends at {end:,}")
        end, last = offset + nbytes, name


@cache
def _ggml():
    from cllm.core.llama_bindings import bare

    bare()
    import ctypes

    import llama_cpp.llama_cpp as L
    from llama_cpp._ctypes_extensions import load_shared_library

    lib = load_shared_library("ggml-base", L._base_path)
    lib.ggml_type_size.argtypes = lib.ggml_blck_size.argtypes = [ctypes.c_int]
    lib.ggml_type_size.restype = ctypes.c_size_t
    lib.ggml_blck_size.restype = ctypes.c_int64
    return lib, L.GGML_TYPE_COUNT


def _type_size(ggml_type: int) -> tuple[int, int]:
    """(elements a block, bytes a block) of a ggml type; (0, 0) for a type ggml has not (or no longer) got."""
    lib, count = _ggml()
    if ggml_type >= count:
        return 0, 0
    return lib.ggml_blck_size(ggml_type), lib.ggml_type_size(ggml_type)
