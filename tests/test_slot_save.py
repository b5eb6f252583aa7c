"""llama-server's POST /slots/{id}?action=save|restore|erase (--slot-save-path) on the real model and engine.

A slot is one of the engine's KV streams; an idle server's request runs in
slot 0, whose stream keeps the request's cells as a cache entry when it
ends. Save writes that entry to a file in the disk cache's format, restore
makes a file's cells a slot's entry again (in another server too), erase
drops it: the next /completion of the same prompt then reports its cached
tokens (all but the last, which is always prefilled) and gives the same
greedy text. Bad requests and foreign, torn or damaged files are refused as
llama-server refuses them, and the answers have llama-server's keys and types.
"""

from __future__ import annotations

import os
import shutil

import httpx
import numpy as np
import pytest

from engine_proc.kv.kv_file import file_head
from tests.conftest import running, start_server
from tests.llama_server import llama_server_on, refused, same_shape
from tests.test_prefix_cache_exact import doc
from tests.unit.test_kv_file import damage, places

ARGS = ("--parallel", "2", "--ctx-size", "2048")
PROMPT = "The capital of France is Paris. The capital of Germany is"
GREEDY = {"temperature": 0, "seed": 1, "n_predict": 8}


def complete(http: httpx.Client, prompt: str = PROMPT, **body) -> dict:
    r = http.post("/completion", json={"prompt": prompt, **GREEDY, **body})
    assert r.status_code == 200, r.text
    return r.json()


def act(http: httpx.Client, slot: int | str, action: str, filename: str | None = None) -> httpx.Response:
    return http.post(f"/slots/{slot}?action={action}", json=None if filename is None else {"filename": filename})


def ok(r: httpx.Response) -> dict:
    assert r.status_code == 200, r.text
    return r.json()


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    return tmp_path_factory.mktemp("slots")


@pytest.fixture(scope="module")
def slots(folder):
    """A server with --slot-save-path and no --cache-dir: only a restore can bring cells back."""
    with start_server(*ARGS, "--slot-save-path", str(folder)) as srv, srv.client() as http:
        yield http


def test_save_erase_restore_then_the_prompt_is_cached(slots, folder):
    first = complete(slots)
    n_cells = first["tokens_evaluated"] + first["tokens_predicted"] - 1  # the last token has no cells yet
    saved = ok(act(slots, 0, "save", "france.bin"))
    assert saved["id_slot"] == 0 and saved["filename"] == "france.bin" and saved["n_saved"] == n_cells
    assert saved["n_written"] == os.path.getsize(folder / "france.bin") and saved["timings"]["save_ms"] > 0
    assert ok(act(slots, 0, "erase")) == {"id_slot": 0, "n_erased": n_cells}
    again = complete(slots)
    assert again["timings"]["cache_n"] == 0  # erased: nothing to reuse
    ok(act(slots, 0, "erase"))
    restored = ok(act(slots, 1, "restore", "france.bin"))  # into another slot than it came from
    assert restored["n_restored"] == n_cells and restored["n_read"] == saved["n_written"] and restored["id_slot"] == 1
    after = complete(slots)
    assert after["timings"]["cache_n"] == first["tokens_evaluated"] - 1
    assert after["timings"]["prompt_n"] == 1 and after["content"] == first["content"]
    # erasing an empty slot is no error; saving one writes a file of no tokens, and restoring it empties a slot
    ok(act(slots, 0, "erase")), ok(act(slots, 1, "erase"))
    assert ok(act(slots, 1, "erase"))["n_erased"] == 0
    assert ok(act(slots, 1, "save", "empty.bin"))["n_saved"] == 0
    assert ok(act(slots, 0, "restore", "empty.bin"))["n_restored"] == 0


def test_an_action_on_a_busy_slot_waits_for_its_request(slots):
    for slot in (0, 1):
        ok(act(slots, slot, "erase"))
    with running(
        str(slots.base_url), "/completion", {"prompt": PROMPT, **GREEDY, "n_predict": 200, "ignore_eos": True}
    ):
        saved = ok(act(slots, 0, "save", "busy.bin"))  # answered once the request ends, with all of its cells
        assert saved["n_saved"] == len(slots.post("/tokenize", json={"content": PROMPT}).json()["tokens"]) + 200 - 1


def test_a_restore_survives_a_restart(tmp_path):
    """Exact mode: a reused cell is the same bits as a fresh prefill's, so the text is the same to the token."""
    args = (*ARGS, "--prefix-cache-exact", "--slot-save-path", str(tmp_path))
    prompt = doc("harbours", 25)
    with start_server(*args) as srv, srv.client() as http:
        first = complete(http, prompt)
        assert first["tokens_evaluated"] > 256
        saved = ok(act(http, 0, "save", "harbours.bin"))
        assert saved["n_saved"] == first["tokens_evaluated"] // 128 * 128  # exact mode keeps whole prompt blocks
    with start_server(*args) as srv, srv.client() as http:
        assert ok(act(http, 0, "restore", "harbours.bin"))["n_restored"] == saved["n_saved"]
        after = complete(http, prompt)
        assert after["timings"]["cache_n"] == saved["n_saved"] and after["content"] == first["content"]


def test_foreign_torn_and_other_files_are_refused_and_the_slot_still_serves(slots, folder):
    complete(slots)
    ok(act(slots, 0, "save", "good.bin"))
    data = (folder / "good.bin").read_bytes()
    (folder / "torn.bin").write_bytes(data[: len(data) // 2])
    (folder / "garbage.bin").write_bytes(b"\x00" * 100)
    shutil.copy(folder / "good.bin", folder / "changed.bin")
    damage(str(folder / "changed.bin"), *places(str(folder / "changed.bin"))["cells middle"])
    tokens, cells = np.arange(10, dtype=np.int32), np.zeros(64, np.uint8)
    (folder / "foreign.bin").write_bytes(
        file_head("another model's fingerprint", tokens, cells) + tokens.tobytes() + cells.tobytes()
    )
    for name, why in (
        ("torn.bin", "length is wrong"),
        ("garbage.bin", "not a cllm prefix cache file"),
        ("changed.bin", "its cells do not match their checksum"),
        ("foreign.bin", "another model's or other settings' cells"),
        ("missing.bin", "no file missing.bin"),
    ):
        error = refused(act(slots, 0, "restore", name), 400, "Unable to restore slot", why)
        assert error["type"] == "invalid_request_error"
    ok(act(slots, 0, "erase")), ok(act(slots, 1, "erase"))
    assert complete(slots)["timings"]["cache_n"] == 0  # nothing of those files came in


def test_bad_requests_are_refused_as_llama_server_refuses_them(slots, http):
    refused(act(http, 0, "save", "a.bin"), 501, "--slot-save-path")  # the shared server has none
    for slot in ("x", "-1", "2", "1.5", "\u0661"):
        refused(act(slots, slot, "erase"), 400, "Invalid slot ID")
    refused(act(slots, 0, "frob"), 400, "Invalid action")
    refused(slots.post("/slots/0"), 400, "Invalid action")
    for name in (
        "",
        "../a.bin",
        "a/b.bin",
        "a\\b",
        "a..b",
        ".",
        "a.",
        " a",
        "a ",
        "a:b",
        "a?b",
        "a\x01",
        "a\u2215b",
        "x" * 256,
    ):
        refused(act(slots, 0, "save", name), 400, "Invalid filename")
    refused(slots.post("/slots/0?action=save", json={}), 400, "filename")
    refused(slots.post("/slots/0?action=restore", json={"filename": 5}), 400, "filename")
    refused(slots.post("/slots/0?action=restore", content=b"{"), 400)
    assert ok(act(slots, 0, "erase"))["id_slot"] == 0  # a body is not needed, nor read


def test_with_replicas_a_slot_id_names_one_engines_stream(tmp_path):
    with start_server(
        "--replicas", "2", "--parallel", "1", "--ctx-size", "1024", "--slot-save-path", str(tmp_path)
    ) as srv:
        with srv.client() as http:
            first = complete(http)
            saved = [ok(act(http, slot, "save", f"{slot}.bin"))["n_saved"] for slot in (0, 1)]
            # the engine that served it
            assert sorted(saved) == [0, first["tokens_evaluated"] + first["tokens_predicted"] - 1]
            refused(act(http, 2, "erase"), 400, "Invalid slot ID")


def test_without_the_prefix_cache_there_is_nothing_to_save(tmp_path):
    with start_server(
        "--parallel", "1", "--ctx-size", "512", "--no-prefix-cache", "--slot-save-path", str(tmp_path)
    ) as srv:
        with srv.client() as http:
            complete(http)
            refused(act(http, 0, "save", "a.bin"), 501, "prefix cache")
    assert not list(tmp_path.iterdir())


def test_the_same_keys_types_and_refusals_as_llama_server(slots, tmp_path_factory):
    from cllm.core.model_file import resolve_model

    theirs_dir = tmp_path_factory.mktemp("llama-server-slots")
    with llama_server_on(resolve_model(None), tmp_path_factory, *ARGS, "--slot-save-path", str(theirs_dir)) as theirs:
        both = (slots, theirs)
        for c in both:
            complete(c, id_slot=0)
        for action, name in (("save", "cmp.bin"), ("restore", "cmp.bin"), ("erase", None)):
            ours, their = (ok(act(c, 0, action, name)) for c in both)
            same_shape(ours, their, action)
        for args in ((0, "restore", "missing.bin"), (0, "save", "../x"), (0, "frob"), ("abc", "erase")):
            ours, their = (act(c, *args) for c in both)
            assert ours.status_code == their.status_code == 400, args
            assert ours.json()["error"]["type"] == their.json()["error"]["type"], args
