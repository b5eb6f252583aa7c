"""A damaged --cache-dir file is never a model's memory: real servers, a real restart, both cache modes.

Server 1 serves one prompt per file, each its own from its first token (so nothing but its own file could serve
it), and stops (SIGTERM): each prompt's cells are in a file. Every file but one is then damaged at one place,
every bit of some bytes flipped (MODES: the header, tokens, the cells' first, a middle and last byte, 16 KB near
the end, the issue's case, where a restarted server reused 384 tokens of such a file and its greedy reply
changed). Server 2, on that folder, serves the same prompts: a damaged file's prompt gets the reply it got with
no cache at all and reuses nothing, the file is removed with one warning naming it, and /metrics counts it; the
intact file serves its prompt across the restart, in the default mode too (tests/test_disk_cache.py's restarts
are in exact mode). The same damage at the store level, every place in one file: tests/unit/test_kv_file.py."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from tests.conftest import health, start_server, wait_until
from tests.test_disk_cache import complete, encode, files
from tests.test_metrics import scrape, value
from tests.unit.test_kv_file import damage, places

TOPICS = ("Harbours", "Meadows", "Orchards", "Glaciers")
# The places each mode's files are damaged at (tests/unit/test_kv_file.py damages every place at the store,
# which knows nothing of the mode): between them, every part of a file.
MODES = {
    "exact": (("--prefix-cache-exact",), ("header", "cells start", "16 KB near the end")),
    "default": ((), ("tokens", "cells middle", "cells end")),
}


def text(topic: str) -> str:
    """About 190 tokens (more than a 128-token block, which exact mode keeps), its own from its first token."""
    return f"{topic}: " + " ".join(f"fact {i} of the {topic.lower()} is {i * 7 % 13}." for i in range(16))


@pytest.mark.parametrize("mode", MODES)
def test_a_damaged_file_is_dropped_and_its_prompt_served_as_without_it(tmp_path, mode):
    flags, where = MODES[mode]
    args = ("--parallel", "2", "--ctx-size", "2048", *flags, "--cache-dir", str(tmp_path))
    with start_server(*args) as srv, srv.client() as http:
        prompts = [encode(http, text(topic)) for topic in TOPICS]
        fresh, written = [], {}
        for k, prompt in enumerate(prompts):
            before = set(files(tmp_path))
            fresh.append(complete(http, prompt))  # nothing cached: the reply of a server without the file
            assert fresh[-1][1] == 0
            (written[k],) = wait_until(lambda: set(files(tmp_path)) - before, 60)
        # The intact file's prompt, its cells in a stream, served as a file serves it: all but the last token, which
        # is decoded again (files keep no logits; a request with logprobs never takes kept ones).
        again = complete(http, prompts[0], logprobs=1)
        assert srv.stop() == 0

    intact, damaged = written[0], {}
    for k, place in enumerate(where, 1):
        damage(written[k], *places(written[k])[place])
        with open(written[k], "rb") as f:
            damaged[k] = (place, f.read())

    with start_server(*args) as srv, srv.client() as http:
        for k, prompt in enumerate(prompts):
            got = complete(http, prompt)
            if k == 0:
                assert got == again and got[1] > 0, "the intact file serves its prompt"
                continue
            place, bad = damaged[k]
            assert got == fresh[k], place  # the reply without any cache, nothing reused
            path = written[k]
            assert not os.path.exists(path) or Path(path).read_bytes() != bad, place  # gone (or written anew)
            assert sum(f"{path} dropped" in line for line in srv.stderr_lines) == 1, place
        # the engine's figures reach the frontend as it goes idle, after the last reply
        figures = wait_until(lambda: (f := health(http)["prefix_cache"])["disk_rejected"] == len(damaged) and f, 10)
        assert figures["disk_hits"] == 1
        assert value(scrape(http), "cllm_prefix_cache_disk_rejected_total") == len(damaged)
        assert os.path.exists(intact)
