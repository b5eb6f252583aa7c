"""The prefix cache on disk (--cache-dir): entries that outlive the engine.

The store alone first (bytes stand in for cells: it never looks into them),
then servers on the embedded model in exact mode, where a reused cell is the
same bits as a fresh prefill: a conversation's next turn after a restart
(SIGTERM of the server, SIGKILL of the engine, SIGKILL while a file is
being written, its writer held for the test) reuses its cells from disk and gives
the greedy text it gives without the restart; a server with other settings never
uses the files. The default mode across a restart, and damaged files, are
tests/test_damaged_cache_files.py's.
Its streams are in host memory, so the new engine warms nothing (warming
into device streams: tests/unit/test_scheduler.py on fake streams,
tests/test_cache_warming.py on llama.cpp): each lookup reads its file into
the stream its sequence takes.
"""

from __future__ import annotations

import logging
import os
import shutil
import signal
import time

import msgspec
import numpy as np
import pytest

from cllm.core.config import ServeConfig
from cllm.core.model_file import resolve_model
from engine_proc.kv.disk_cache import HOLD_WRITES, SUFFIX, TMP, DiskCache, fingerprint, identity
from tests.conftest import child, health, start_server, wait_until
from tests.test_prefix_cache_exact import doc

IDENT = {"model": "a", "kv": "f16"}
MIB = 1 << 20


def toks(first: int, n: int = 200) -> np.ndarray:
    return np.arange(first, first + n, dtype=np.int32)


def cells(n: int, fill: int) -> np.ndarray:
    return np.full(n, fill, np.uint8)


def write(root, *entries, cap: int = 64 * MIB, ident: dict = IDENT) -> None:
    """One engine's life: these (tokens, cells) handed to the store, its writer done."""
    disk = DiskCache(str(root), cap, ident)
    for tokens, data in entries:
        disk.put(tokens, data)
    disk.close()


def files(root) -> list[str]:
    return sorted(str(p) for p in root.rglob("*" + SUFFIX))


def test_an_entry_outlives_its_engine(tmp_path):
    t = toks(1000)
    write(tmp_path, (t, cells(5000, 7)))
    disk = DiskCache(str(tmp_path), 64 * MIB, IDENT)
    prompt = np.concatenate([t, toks(5, 10)])
    entry, n = disk.lookup(prompt, len(prompt) - 1, 1)
    assert n == len(t) and disk.stats() == (1, 5000)
    assert (disk.load(entry) == 7).all()
    disk.served()  # the cells went into a stream
    assert disk.hits == 1 and disk.load_seconds > 0
    assert disk.lookup(prompt, len(prompt) - 1, 128)[1] == 128  # a multiple of the unit
    assert disk.lookup(toks(3000), 199, 1) == (None, 0)
    disk.close()


def test_a_new_engine_finds_its_files_newest_last_and_warming_one_is_no_use(tmp_path):
    for first in (1000, 2000, 3000):
        write(tmp_path, (toks(first), cells(100, first // 1000)))
    names = files(tmp_path)
    for age, name in enumerate(names):  # their last uses: by name, not by the order written
        os.utime(name, ns=(age * 10**9, age * 10**9))
    disk = DiskCache(str(tmp_path), 64 * MIB, IDENT)
    assert [os.path.join(disk.dir, e.name) for e in disk.found] == names
    disk._forget(disk.found[-1].name)  # the newest, gone since (the cap, another engine)
    newest = disk.newest_found()
    assert os.path.join(disk.dir, newest.name) == names[1] and len(disk.found) == 1
    assert (disk.load(newest, use=False) == int(newest.tokens[0]) // 1000).all()
    assert os.stat(names[1]).st_mtime_ns == 10**9  # warming is not a use: the cap's order stays
    disk.warmed()
    assert disk.hits == 0 and disk.load_seconds > 0
    disk.served(loaded_now=False)  # a prompt reused the warmed stream
    assert disk.hits == 1
    disk.close()


def test_a_longer_entry_replaces_the_files_of_its_prefixes(tmp_path):
    t = toks(1000, 400)
    write(tmp_path, (t[:200], cells(100, 1)))
    write(tmp_path, (t[:300], cells(100, 2)), (t[:250], cells(100, 3)))  # the shorter one adds nothing: not written
    assert len(files(tmp_path)) == 1
    disk = DiskCache(str(tmp_path), 64 * MIB, IDENT)
    entry, n = disk.lookup(t, 399, 1)
    assert n == 300 and (disk.load(entry) == 2).all()
    disk.close()


def test_the_cap_evicts_the_least_recently_used(tmp_path):
    cap = int(3.5 * MIB)  # three files of a MiB and a bit
    a, b, c, d = (toks(k * 1000) for k in range(1, 5))
    write(tmp_path, (a, cells(MIB, 1)), cap=cap)
    time.sleep(0.05)  # files' mtimes apart
    write(tmp_path, (b, cells(MIB, 2)), cap=cap)
    time.sleep(0.05)
    disk = DiskCache(str(tmp_path), cap, IDENT)
    assert disk.load(disk.lookup(a, 199, 1)[0]) is not None  # a is used again: b is now the least recent
    disk.close()
    time.sleep(0.05)
    write(tmp_path, (c, cells(MIB, 3)), cap=cap)
    time.sleep(0.05)
    write(tmp_path, (d, cells(MIB, 4)), cap=cap)
    assert sum(os.path.getsize(f) for f in files(tmp_path)) <= cap
    disk = DiskCache(str(tmp_path), cap, IDENT)
    found = [x for x in (a, b, c, d) if disk.lookup(x, 199, 1)[1]]
    assert [int(x[0]) for x in found] == [1000, 3000, 4000]
    disk.close()
    write(tmp_path, (toks(9000), cells(4 * MIB, 9)), cap=cap)  # larger than the cap: never written
    assert len(files(tmp_path)) == 3


def test_the_cap_counts_every_fingerprint_in_the_folder(tmp_path):
    cap = int(2.5 * MIB)
    write(tmp_path, (toks(1000), cells(MIB, 1)), cap=cap, ident={"other": 1})
    time.sleep(0.05)
    write(tmp_path, (toks(2000), cells(MIB, 2)), (toks(3000), cells(MIB, 3)), cap=cap)
    assert sum(os.path.getsize(f) for f in files(tmp_path)) <= cap
    assert not list((tmp_path / fingerprint({"other": 1})).glob("*" + SUFFIX))  # the least recent, another engine's


def test_broken_and_foreign_files_are_dropped_with_a_line_each(tmp_path, caplog):
    good, other = toks(1000), toks(2000)
    write(tmp_path, (good, cells(4000, 1)))
    write(tmp_path, (other, cells(4000, 2)), ident={"model": "b", "kv": "f16"})
    ours = tmp_path / fingerprint(IDENT)
    (real,) = ours.glob("*" + SUFFIX)
    data = real.read_bytes()
    (ours / ("truncated" + SUFFIX)).write_bytes(data[: len(data) // 2])
    (ours / ("garbage" + SUFFIX)).write_bytes(b"\x00" * 100)
    (foreign,) = (tmp_path / fingerprint({"model": "b", "kv": "f16"})).glob("*" + SUFFIX)
    shutil.copy(foreign, ours / ("foreign" + SUFFIX))
    torn = ours / f".x{SUFFIX}.999999999{TMP}"  # its writer (no such process) died mid-write
    torn.write_bytes(data[:100])
    with caplog.at_level(logging.INFO, "cllm.engine"):
        disk = DiskCache(str(tmp_path), 64 * MIB, IDENT)
    warned = sorted(r.getMessage() for r in caplog.records if r.levelno == logging.WARNING)
    assert len(warned) == 4, warned
    assert any("foreign" in w and "another model's or other settings' cells" in w for w in warned)
    assert any("truncated" in w and "length is wrong" in w for w in warned)
    assert any("garbage" in w and "not a cllm prefix cache file" in w for w in warned)
    assert any("did not finish" in w for w in warned) and not torn.exists()
    assert disk.stats() == (1, 4000) and disk.rejected == 3 and files(tmp_path) == sorted([str(real), str(foreign)])
    assert disk.lookup(other, 199, 1) == (None, 0)  # the foreign file's tokens are never served
    assert (disk.load(disk.lookup(good, 199, 1)[0]) == 1).all()
    disk.close()


def test_a_file_that_changed_since_the_start_is_dropped_at_load(tmp_path, caplog):
    write(tmp_path, (toks(1000), cells(4000, 1)))
    disk = DiskCache(str(tmp_path), 64 * MIB, IDENT)
    entry, _ = disk.lookup(toks(1000), 199, 1)
    (path,) = files(tmp_path)
    with open(path, "r+b") as f:
        f.truncate(os.path.getsize(path) - 10)
    with caplog.at_level(logging.WARNING, "cllm.engine"):
        assert disk.load(entry) is None
    assert len(caplog.records) == 1 and f"{path} dropped: it is truncated" in caplog.records[0].getMessage()
    assert disk.lookup(toks(1000), 199, 1) == (None, 0) and disk.stats() == (0, 0)
    assert disk.rejected == 1 and not os.path.exists(path)
    disk.close()


def test_a_folder_that_cannot_be_written_leaves_the_cache_in_ram(tmp_path, caplog):
    (tmp_path / "file").write_bytes(b"")
    with caplog.at_level(logging.WARNING, "cllm.engine"):
        disk = DiskCache(str(tmp_path / "file" / "cache"), 64 * MIB, IDENT)
        disk.put(toks(1000), cells(4000, 1))
        disk.close()
    assert len(caplog.records) == 1 and "new entries stay in RAM only" in caplog.records[0].getMessage()
    assert not disk.writable and not disk.wants(toks(2000)) and disk.stats() == (0, 0)


def test_every_setting_that_changes_cells_or_the_streams_changes_the_fingerprint(tmp_path):
    model = tmp_path / "m.gguf"
    shutil.copy(resolve_model(None), model)
    base = ServeConfig()

    def fp(config=base, seq_ctx=1024, budget=512, gpu=0, streams=3, path=str(model)) -> str:
        return fingerprint(identity(path, config, seq_ctx, budget, gpu, streams))

    r = msgspec.structs.replace
    seen = {
        fp(),
        fp(r(base, cache_type_k="q8_0")),
        fp(r(base, cache_type_v="q8_0")),
        fp(r(base, flash_attn="off")),
        fp(r(base, prefix_cache_exact=True)),
        fp(r(base, prefix_cache_exact=True), budget=256),
        fp(seq_ctx=2048),
        fp(gpu=10),
        fp(streams=5),  # a saved stream loads only into a context with as many
    }
    assert len(seen) == 9
    assert fp(r(base, threads=3, parallel=5, cache_ram=0)) == fp()  # none of these changes a cell
    assert fp(budget=256) == fp()  # outside exact mode any chunking's cells are the server's
    os.utime(model, ns=(1, 1))
    assert fp() not in seen  # the model file changed


# ---- servers -------------------------------------------------------------------

BLOCK = 128
ARGS = ("--parallel", "2", "--ctx-size", "2048", "--prefix-cache-exact")


def encode(http, text: str) -> list[int]:
    return http.post("/encode", json={"text": text}).json()["data"]["tokens"]


def complete(http, prompt: list[int], **extra) -> tuple[str, int]:
    """The greedy text that follows ``prompt`` and the prompt tokens the cache served."""
    body = {"prompt": prompt, "max_tokens": 8, "temperature": 0, "ignore_eos": True, **extra}
    r = http.post("/v1/completions", json=body)
    assert r.status_code == 200, r.text
    body = r.json()
    return body["choices"][0]["text"], body["usage"]["prompt_tokens_details"]["cached_tokens"]


def turn(k: int) -> str:
    """A turn's new text: more than a block, so that each turn's entry has cells the last one's file lacks."""
    return " " + doc(f"turn {k}", 8)


def blocks(prompt: list[int]) -> int:
    """What exact mode reuses of a prompt whose cells are all cached: whole blocks, the last token left out."""
    return (len(prompt) - 1) // BLOCK * BLOCK


def disk_figures(http) -> dict:
    return {k: v for k, v in health(http)["prefix_cache"].items() if k.startswith("disk_")}


def engine_killed(engine, http, restarts: int) -> None:
    engine.send_signal(signal.SIGKILL)
    restarted(http, restarts)


def restarted(http, restarts: int) -> None:
    wait_until(lambda: (h := health(http, "detailed"))["healthy"] and h["restarts"]["engine"] == restarts, 120)


@pytest.fixture(scope="module")
def cache_dir(tmp_path_factory):
    return tmp_path_factory.mktemp("kv")


def test_a_conversation_goes_on_after_restarts(cache_dir, tmp_path):
    args = (*ARGS, "--cache-dir", str(cache_dir))
    hold = tmp_path / "hold"  # while it exists, an engine's writer holds its whole temporary file before the rename
    with start_server(*args, env={HOLD_WRITES: str(hold)}) as srv, srv.client() as http:
        p1 = encode(http, doc("harbour", 10))  # ~150 tokens: a block
        complete(http, p1)
        p2 = p1 + encode(http, turn(2))
        t2, cached = complete(http, p2)  # no restart: what the turn gives
        assert cached == len(p1) // BLOCK * BLOCK
        assert srv.stop() == 0  # SIGTERM: the server stops, its engine writes what its streams hold

    (written,) = files(cache_dir)  # p2's entry, which holds p1's cells too
    broken = os.path.join(os.path.dirname(written), "broken" + SUFFIX)
    with open(written, "rb") as f, open(broken, "wb") as g:
        g.write(f.read(50_000))  # torn: dropped at start, with a line

    with start_server(*args, env={HOLD_WRITES: str(hold)}) as srv, srv.client() as http:
        assert health(http)["prefix_cache"]["cells"] == 0 and disk_figures(http)["disk_hits"] == 0
        assert complete(http, p2) == (t2, blocks(p2))  # the cells came from disk, bit for bit
        figures = disk_figures(http)
        assert figures["disk_hits"] == 1 and figures["disk_entries"] == 1 and figures["disk_load_seconds"] > 0
        assert sum(f"{broken} dropped" in line for line in srv.stderr_lines) == 1 and not os.path.exists(broken)

        # SIGKILL of the engine once the turn's entry is on disk: the supervisor's restart finds it.
        p3 = p2 + encode(http, turn(3))
        t3, _ = complete(http, p3)
        wait_until(lambda: disk_figures(http)["disk_bytes"] > figures["disk_bytes"], 60)
        engine_killed(child(srv, "engine_proc"), http, 1)
        assert complete(http, p3) == (t3, blocks(p3))
        assert disk_figures(http)["disk_hits"] == 1  # the new engine's count

        # SIGKILL while the next entry is being written (its writer held before the rename): the new engine
        # removes the temporary file, and the turn reuses the last whole file's cells, none of the held one's.
        p4 = p3 + encode(http, turn(4))
        engine, before = child(srv, "engine_proc"), files(cache_dir)
        hold.write_bytes(b"")
        t4, _ = complete(http, p4)
        (held,) = wait_until(lambda: list(cache_dir.rglob("*" + TMP)), 60)
        time.sleep(0.5)  # held: a writer that renamed it would have by now
        assert held.exists() and files(cache_dir) == before
        engine.send_signal(signal.SIGKILL)
        engine.wait(30)
        hold.unlink()  # the next engine writes as usual
        restarted(http, 2)
        assert files(cache_dir) == before and not held.exists()
        assert sum(f"removed {held}, a file its writer did not finish" in line for line in srv.stderr_lines) == 1
        t, cached = complete(http, p4)
        assert t == t4 and blocks(p3) <= cached < blocks(p4)
    assert sum(os.path.getsize(f) for f in files(cache_dir)) > 0


def test_more_files_than_streams_serve_their_prompts_from_disk(tmp_path):
    """Three files, two streams: each prompt, the oldest file's first, is read from its file when it comes,
    into the stream its sequence takes, and gives the text it gave before the restart."""
    args = (*ARGS, "--cache-dir", str(tmp_path))
    with start_server(*args) as srv, srv.client() as http:
        prompts = [encode(http, doc(topic, 10)) for topic in ("harbour", "meadow", "orchard")]
        texts = []
        for k, prompt in enumerate(prompts, 1):
            texts.append(complete(http, prompt)[0])
            wait_until(lambda: len(files(tmp_path)) == k, 60)
        assert srv.stop() == 0

    with start_server(*args) as srv, srv.client() as http:
        for k, (prompt, text) in enumerate(zip(prompts, texts), 1):
            assert complete(http, prompt) == (text, blocks(prompt))
            assert disk_figures(http)["disk_hits"] == k


def test_a_server_with_other_settings_never_uses_the_files(cache_dir):
    assert files(cache_dir), "runs after test_a_conversation_goes_on_after_restarts"
    with (
        start_server(
            "--parallel", "2", "--ctx-size", "4096", "--prefix-cache-exact", "--cache-dir", str(cache_dir)
        ) as srv,
        srv.client() as http,
    ):
        p = encode(http, doc("harbour", 10))
        assert complete(http, p)[1] == 0
        assert disk_figures(http)["disk_hits"] == 0
