"""A new engine warms its cache files into empty KV streams before its first request, on the real llama.cpp.

The engine warms only when its KV streams are in device memory (Scheduler.warm; with streams in host memory a
file goes straight into the stream its sequence takes, tests/test_disk_cache.py). It takes where they are from
--n-gpu-layers: more than 0, and it copies between streams at the next llama_decode (llama_memory_seq_cp) and
warms. On a CPU build llama.cpp has no GPU to offload to and keeps every layer and the KV cells in host memory,
but the engine goes by the setting, so `--n-gpu-layers 1` runs its device path here: the files'
llama_state_seq_set_data into empty streams while it is idle, then the next turns reuse the warmed streams (in
place, or copied into the slot their sequence takes). What it cannot show on a CPU: a GPU backend's copies and
their timing (perf/results/2026-11-27-restart-cache-device.md has a GPU's).

Exact mode: a reused cell is the same bits as a fresh prefill's, so each turn after the restart must give the
text, and reuse the tokens, it gives without the restart. A damaged file among them is dropped, never warmed.
"""

from __future__ import annotations

import shutil

from tests.conftest import health, start_server, wait_until
from tests.test_disk_cache import complete, disk_figures, encode, files, turn
from tests.test_prefix_cache_exact import doc
from tests.unit.test_kv_file import damage, header, places

ARGS = ("--parallel", "2", "--ctx-size", "2048", "--prefix-cache-exact", "--n-gpu-layers", "1")


def test_a_new_engine_warms_its_files_and_the_next_turns_reuse_them(tmp_path):
    first, second = tmp_path / "a", tmp_path / "b"
    with start_server(*ARGS, "--cache-dir", str(first)) as srv, srv.client() as http:
        convs = [encode(http, doc(topic, 10)) for topic in ("harbour", "meadow", "orchard")]  # ~150 tokens: a block
        replies, written = [], []
        for conv in convs:
            before = set(files(first))
            replies.append(complete(http, conv))
            (name,) = wait_until(lambda: set(files(first)) - before, 60)
            written.append(name.replace(str(first), str(second)))
        shutil.copytree(first, second)  # the files as they are before the next turns, mtimes kept
        nexts = [conv + encode(http, turn(2)) for conv in convs[:2]]
        expected = [complete(http, p) for p in nexts]  # no restart: each turn reuses its conversation's cells
        assert all(cached > 0 for _, cached in expected)
        assert srv.stop() == 0
    damage(written[2], *places(written[2])["cells middle"])  # the newest file: the first the engine takes up

    with start_server(*ARGS, "--cache-dir", str(second)) as srv, srv.client() as http:
        # idle before its first request: the damaged file is dropped, the other two go into the empty streams
        cells = sum(header(path)[0].n_tokens for path in written[:2])
        figures = wait_until(lambda: (f := health(http)["prefix_cache"])["cells"] == cells and f, 60)
        assert figures["disk_rejected"] == 1 and figures["disk_hits"] == 0 and figures["disk_load_seconds"] > 0
        dropped = f"{written[2]} dropped: its cells do not match their checksum"
        assert sum(dropped in line for line in srv.stderr_lines) == 1
        for k, (p, want) in enumerate(zip(nexts, expected), 1):
            assert complete(http, p) == want  # the same text, the same tokens reused
            # a warmed stream's first reuse counts as a hit from disk
            wait_until(lambda: disk_figures(http)["disk_hits"] == k, 10)
        assert complete(http, convs[2]) == replies[2]  # the dropped file's conversation: prefilled again, as at first
