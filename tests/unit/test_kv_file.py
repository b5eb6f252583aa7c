"""A cache file any byte of which changed is never used: the reader and the disk cache's store, no model.

Bytes stand in for cells (the store never looks into them). A file is damaged at one place at a time, in its
header, its tokens, or its cells (the first, a middle and the last byte, and 16 KB near the end): a new
store drops it at its start (header, tokens) or when its cells are loaded, before they could go into a
stream; either way the file is removed, one warning names it, and it is counted. A file of format 1, which
had no hash of its cells, is dropped the same way.
"""

from __future__ import annotations

import logging
import os
import random
import struct
import time
import zlib

import msgspec
import numpy as np
import pytest

from cllm.core.protocol import SamplingParams
from engine_proc.kv import kv_file
from engine_proc.kv.disk_cache import HOLD_WRITES, SUFFIX, DiskCache, fingerprint
from engine_proc.scheduler import Scheduler, SchedulerSettings
from engine_proc.sequence import Sequence
from tests.conftest import wait_until
from tests.unit.test_scheduler import run
from tests.unit.test_slots import TokenFiles

IDENT = {"model": "a", "kv": "f16"}
MIB = 1 << 20
TOKENS = np.arange(1000, 1300, dtype=np.int32)
CELLS = np.random.default_rng(3).integers(0, 256, 300_000, np.uint8)


def written(root) -> str:
    """A store's file of TOKENS' CELLS, written by one engine's life."""
    disk = DiskCache(str(root), 64 * MIB, IDENT)
    disk.put(TOKENS, CELLS)
    disk.close()
    (path,) = (root / fingerprint(IDENT)).glob("*" + SUFFIX)
    return str(path)


def header(path: str) -> tuple[kv_file.Header, int]:
    """A file's header, read with no fingerprint to match, and its length."""
    with open(path, "rb") as f:
        (n,) = struct.unpack("<I", f.read(len(kv_file.MAGIC) + 4)[len(kv_file.MAGIC) :])
        return msgspec.msgpack.decode(f.read(n), type=kv_file.Header), n


def places(path: str) -> dict[str, tuple[int, int]]:
    """(offset, length) of each damage in a file, from its layout (kv_file): magic, header's length, header,
    tokens, cells. One byte of the header, of the tokens, the cells' first, middle and last; 16 KB near the end."""
    head, n = header(path)
    tokens = len(kv_file.MAGIC) + 4 + n
    cells = tokens + 4 * head.n_tokens
    end = cells + head.n_bytes
    return {
        "header": (len(kv_file.MAGIC) + 4 + n // 2, 1),
        "tokens": (tokens + 2 * head.n_tokens, 1),
        "cells start": (cells, 1),
        "cells middle": ((cells + end) // 2, 1),
        "cells end": (end - 1, 1),
        "16 KB near the end": (end - 20_000, 16_384),
    }


def damage(path: str, offset: int, n: int) -> None:
    """Every bit of ``n`` bytes at ``offset`` flipped, in place."""
    with open(path, "r+b") as f:
        f.seek(offset)
        data = f.read(n)
        f.seek(offset)
        f.write(bytes(b ^ 0xFF for b in data))


WHERE = ("header", "tokens", "cells start", "cells middle", "cells end", "16 KB near the end")


@pytest.mark.parametrize("where", WHERE)
def test_a_file_with_any_byte_changed_is_dropped_before_its_cells_are_used(tmp_path, caplog, where):
    path = written(tmp_path)
    disk = DiskCache(str(tmp_path), 64 * MIB, IDENT)  # the intact file: found, its cells as written
    assert (disk.load(disk.lookup(TOKENS, 299, 1)[0]) == CELLS).all() and disk.rejected == 0
    disk.close()
    damage(path, *places(path)[where])
    with caplog.at_level(logging.WARNING, "cllm.engine"):
        disk = DiskCache(str(tmp_path), 64 * MIB, IDENT)
        entry, n = disk.lookup(TOKENS, 299, 1)
        if where in ("header", "tokens"):  # dropped as the store starts: never found
            assert entry is None and n == 0
        else:  # found by its tokens; its cells fail their hash when loaded
            assert n == 299 and disk.load(entry) is None
        assert disk.lookup(TOKENS, 299, 1) == (None, 0)
    warned = [r.getMessage() for r in caplog.records]
    assert len(warned) == 1 and f"{path} dropped" in warned[0], warned
    assert disk.rejected == 1 and not os.path.exists(path) and disk.stats() == (0, 0)
    disk.close()


def test_a_file_of_format_1_is_dropped(tmp_path, caplog):
    """As cllm wrote them before the hashes: magic ...\\x01, header (fingerprint, counts, the tokens' CRC)."""
    folder = tmp_path / fingerprint(IDENT)
    folder.mkdir()
    header = msgspec.msgpack.encode([fingerprint(IDENT), len(TOKENS), CELLS.nbytes, zlib.crc32(TOKENS.tobytes())])
    old = folder / ("old" + SUFFIX)
    old.write_bytes(b"CLLMKV\x00\x01" + struct.pack("<I", len(header)) + header + TOKENS.tobytes() + CELLS.tobytes())
    with caplog.at_level(logging.WARNING, "cllm.engine"):
        disk = DiskCache(str(tmp_path), 64 * MIB, IDENT)
    assert [r.getMessage() for r in caplog.records] == [
        f"prefix cache file {old} dropped: not a cllm prefix cache file of this version"
    ]
    assert disk.rejected == 1 and not old.exists() and disk.lookup(TOKENS, 299, 1) == (None, 0)
    disk.close()


def test_the_reader_checks_tokens_and_cells_against_the_header(tmp_path):
    """What slot files (llama-server's /slots restore) and the store both read through."""
    fp = fingerprint(IDENT)
    path = str(tmp_path / "slot.bin")
    kv_file.write_file(path, kv_file.file_head(fp, TOKENS, CELLS), TOKENS, CELLS)
    with open(path, "rb") as f:
        header, tokens = kv_file.read_tokens(f, fp)
        cells = np.frombuffer(f.read(), np.uint8)
    assert (tokens == TOKENS).all()
    kv_file.check_cells(header, cells)
    changed = cells.copy()
    changed[len(changed) // 2] ^= 1
    for wrong in (changed, cells[:-1]):
        with pytest.raises(ValueError, match="cells do not match their checksum"):
            kv_file.check_cells(header, wrong)
    with pytest.raises(ValueError, match="tokens do not match their checksum"):
        kv_file.check_tokens(header, TOKENS + 1)


def test_a_held_writer_leaves_only_its_temporary_file_until_the_hold_goes(tmp_path, monkeypatch):
    """HOLD_WRITES, for tests only: the writer waits with a whole temporary file while the named file exists."""
    hold = tmp_path / "hold"
    hold.write_bytes(b"")
    monkeypatch.setenv(HOLD_WRITES, str(hold))
    disk = DiskCache(str(tmp_path / "kv"), 64 * MIB, IDENT)
    disk.put(TOKENS, CELLS)
    folder = tmp_path / "kv" / fingerprint(IDENT)
    tmp = wait_until(lambda: list(folder.glob("*" + kv_file.TMP)), 10, 0.01)
    time.sleep(0.3)  # held: not renamed, however long it waits
    assert list(folder.glob("*" + kv_file.TMP)) == tmp and os.path.getsize(tmp[0]) > CELLS.nbytes
    assert not list(folder.glob("*" + SUFFIX)) and disk.writing()
    hold.unlink()
    disk.close()
    assert not list(folder.glob("*" + kv_file.TMP)) and len(list(folder.glob("*" + SUFFIX))) == 1


def test_a_prompt_whose_best_file_is_dropped_is_served_as_if_it_had_never_been_there(tmp_path):
    """Two files share a conversation's start, the longer damaged: the scheduler's lookup drops it and looks
    again, and the shorter one serves the prompt, as it would have without the damaged file."""
    conv = np.arange(1000, 1300, dtype=np.int32)
    shorter, longer = np.concatenate((conv[:200], [5, 6] * 20)).astype(np.int32), conv
    disk = DiskCache(str(tmp_path), 64 * MIB, IDENT)
    for tokens in (shorter, longer):  # cells: the tokens' bytes, as TokenFiles saves them
        disk.put(tokens, tokens.view(np.uint8))
    disk.close()
    path = str(tmp_path / fingerprint(IDENT) / next(e.name for e in disk.entries.values() if len(e.tokens) == 300))
    damage(path, *places(path)["cells middle"])
    kv = TokenFiles(2)
    sched = Scheduler(
        SchedulerSettings(2, 2, 64, 4096, prefix_cache=True, exact=False),
        kv,
        disk=DiskCache(str(tmp_path), 64 * MIB, IDENT),
    )
    turn = Sequence(0, np.concatenate((conv, np.array([7, 8, 9], np.int32))), SamplingParams(max_tokens=2), None)
    run(sched, kv, [turn], random.Random(1))
    stats = sched.cache.stats()
    assert stats.disk_rejected == 1 and stats.disk_hits == 1 and stats.hit_tokens == 200
    assert not os.path.exists(path)
