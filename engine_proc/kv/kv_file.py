"""The file of one KV stream's cells: a prefix cache entry on disk (disk_cache), a llama-server slot file (slot_files).

MAGIC, the header's length, the header (msgpack: the fingerprint of the
settings the cells were made with, the counts, the hashes of the tokens and
of the cells), the tokens (int32), the cells as llama_state_seq_get_data
wrote them. A file is written under a temporary name, fsynced and renamed,
so its name never holds part of one; a reader checks every part before it
trusts the cells: a changed byte anywhere (a damaged disk, a partial copy, a
planted file) makes the file refused, never a model's memory.

The hashes are xxHash's XXH3 (64 bits): it reads memory about as fast as the
copy into a stream does (see check_cells), where zlib's CRC-32 would have
added most of a restart's load time again.
"""

from __future__ import annotations

import os
import struct
from collections.abc import Callable

import msgspec
import numpy as np
import xxhash

MAGIC = b"CLLMKV\x00\x02"  # the format's name and version (1 had no hash of its cells: its files are refused)
TMP = ".tmp"  # a file being written: ".{name}.{pid}.tmp" beside its final name

_LEN = struct.Struct("<I")


class Header(msgspec.Struct, array_like=True):
    fingerprint: str
    n_tokens: int
    n_bytes: int  # of the cells, as llama_state_seq_get_data wrote them
    tokens_hash: int  # xxh3_64 of the tokens
    cells_hash: int  # xxh3_64 of the cells


def file_head(fp: str, tokens: np.ndarray, data: np.ndarray) -> bytes:
    """What a file of these cells begins with: the format's name, its header's length, the header."""
    header = msgspec.msgpack.encode(Header(fp, len(tokens), data.nbytes, _hash(tokens), _hash(data)))
    return MAGIC + _LEN.pack(len(header)) + header


def check_tokens(header: Header, tokens: np.ndarray) -> None:
    """ValueError unless these are the header's tokens."""
    if len(tokens) != header.n_tokens or _hash(tokens) != header.tokens_hash:
        raise ValueError("its tokens do not match their checksum")


def check_cells(header: Header, data: np.ndarray) -> None:
    """ValueError unless ``data`` are the header's cells. A mapped file is hashed where its pages are, no copy: the
    pages the hash reads in are the ones the copy into a stream then reads (perf/results/2026-11-27-cache-checksum.md).
    """
    if data.nbytes != header.n_bytes or _hash(data) != header.cells_hash:
        raise ValueError("its cells do not match their checksum")


def _hash(a: np.ndarray) -> int:
    return xxhash.xxh3_64_intdigest(np.ascontiguousarray(a).data.cast("B"))


def write_file(
    path: str, head: bytes, tokens: np.ndarray, data: np.ndarray, before_rename: Callable[[], None] | None = None
) -> int:
    """Write a file under a temporary name, fsync it, rename it into place; its size. OSError: nothing at ``path``
    changed. ``before_rename``: called once the temporary file is whole (the disk cache's hold for tests)."""
    folder, name = os.path.split(path)
    tmp = os.path.join(folder, f".{name}.{os.getpid()}{TMP}")
    try:
        with open(tmp, "wb") as f:
            f.write(head)
            f.write(tokens.tobytes())
            f.write(data.data)
            f.flush()
            os.fsync(f.fileno())
        if before_rename is not None:
            before_rename()
        os.replace(tmp, path)
    except OSError:
        remove_quietly(tmp)
        raise
    _fsync_dir(folder)
    return len(head) + tokens.nbytes + data.nbytes


def read_tokens(f, fp: str) -> tuple[Header, np.ndarray]:
    """The header and tokens of an open file, left at its cells; ValueError if it is not a whole file of ours for
    ``fp``."""
    header = read_header(f, fp)
    tokens = np.frombuffer(f.read(header.n_tokens * 4), np.int32)
    check_tokens(header, tokens)
    if os.fstat(f.fileno()).st_size != f.tell() + header.n_bytes:
        raise ValueError("its length is wrong")
    return header, tokens


def read_header(f, fp: str) -> Header:
    """The file's header, read from its start; ValueError if it is not one of ours for ``fp``."""
    start = f.read(len(MAGIC) + _LEN.size)
    if len(start) < len(MAGIC) + _LEN.size or start[: len(MAGIC)] != MAGIC:
        raise ValueError("not a cllm prefix cache file of this version")
    (n,) = _LEN.unpack(start[len(MAGIC) :])
    header = msgspec.msgpack.decode(f.read(n), type=Header)
    if header.fingerprint != fp:
        raise ValueError("another model's or other settings' cells")
    return header


def remove_quietly(path: str) -> None:
    try:
        os.remove(path)
    except OSError:
        pass


def _fsync_dir(path: str) -> None:
    """Make the rename durable (where a folder can be fsynced; not every system allows it)."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)
