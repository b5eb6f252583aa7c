"""The embedded model on a stand-in hub (tests/hub_server.py), by name: `cllm pull`, `cllm serve -hf`, offline,
and the store.

Two made-up repos hold the embedded SmolLM2: whole, and split in three by llama.cpp's rules. The tests run in
order on one HF_HOME: pull with progress lines, pull again (nothing fetched), serve the split model by name and
chat, serve offline every pulled model (the second loaded on demand), then remove one.
"""

from __future__ import annotations

import os
import subprocess
import sys

import httpx
import pytest

from cllm.core.model_file import embedded_model_path
from tests.conftest import ROOT, start_server
from tests.hub_server import FakeHub, Repo, split_gguf

WHOLE = "cllm-test/SmolLM2-135M-Instruct-GGUF"
SPLIT = "cllm-test/SmolLM2-split-GGUF"
SMALL = ("--ctx-size", "1024", "--parallel", "2")
QUESTION = [
    {"role": "system", "content": "You are a helpful assistant who answers in one sentence."},
    {"role": "user", "content": "What is the capital of France?"},
]


@pytest.fixture(scope="module")
def hub(tmp_path_factory):
    parts = split_gguf(
        embedded_model_path(), str(tmp_path_factory.mktemp("split") / "SmolLM2-135M-Instruct-Q4_1.gguf"), 3
    )
    repos = {
        WHOLE: Repo({"README.md": b"# SmolLM2\n", "SmolLM2-135M-Instruct-Q4_1.gguf": embedded_model_path()}),
        SPLIT: Repo({os.path.basename(p): p for p in parts}),
    }
    with FakeHub(repos) as h:
        yield h


@pytest.fixture(scope="module")
def env(hub, tmp_path_factory):
    home = str(tmp_path_factory.mktemp("hf-home"))
    base = {k: v for k, v in os.environ.items() if not k.startswith("HF_")}
    return {**base, "HF_ENDPOINT": hub.endpoint, "HF_HOME": home}


def cllm(env: dict, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "cllm.cli", *args], cwd=ROOT, env=env, capture_output=True, text=True, timeout=300
    )


def chat(url: str, model: str) -> str:
    r = httpx.post(
        f"{url}/v1/chat/completions",
        json={"model": model, "messages": QUESTION, "max_tokens": 20, "temperature": 0},
        timeout=120,
    )
    assert r.status_code == 200, r.text
    return r.json()["choices"][0]["message"]["content"]


def test_pull_shows_progress_in_a_log_and_a_second_pull_fetches_nothing(hub, env):
    done = cllm(env, "pull", WHOLE)  # no tag: neither Q4_K_M nor Q8_0 here, so the repo's first model
    assert done.returncode == 0, done.stderr
    assert f"{WHOLE}:Q4_1: " in done.stdout and "MiB downloaded" in done.stdout
    lines = [ln for ln in done.stderr.splitlines() if ln.startswith("cllm: SmolLM2-135M-Instruct-Q4_1.gguf: ")]
    assert (
        len(lines) >= 3 and lines[-1].endswith("93.8 MiB of 93.8 MiB") and "\r" not in done.stderr
    )  # lines, not a bar

    hub.log.clear()
    again = cllm(env, "pull", f"{WHOLE}:q4_1")
    assert again.returncode == 0 and "already in the cache" in again.stdout
    assert hub.downloads() == [] and [m for m, _, _ in hub.log] == ["GET"]

    listed = cllm(env, "models")
    assert listed.returncode == 0
    (row,) = [ln.split() for ln in listed.stdout.splitlines() if ln.startswith(WHOLE)]
    assert row[:4] == [f"{WHOLE}:Q4_1", "Q4_1", "93.8", "MiB"] and row[4].endswith("SmolLM2-135M-Instruct-Q4_1.gguf")


def test_serve_hf_pulls_a_split_model_by_name_and_answers(hub, env):
    with start_server("-hf", f"{SPLIT}:q4_1", *SMALL, env=env) as srv:
        models = httpx.get(f"{srv.url}/v1/models").json()["data"]
        assert [m["id"] for m in models] == [f"{SPLIT}:Q4_1"]
        assert "Paris" in chat(srv.url, f"{SPLIT}:Q4_1")
        (tag,) = httpx.get(f"{srv.url}/api/tags").json()["models"]
        parts = hub.repos[SPLIT]
        assert tag["name"] == f"{SPLIT}:Q4_1" and tag["size"] == sum(
            parts.meta(p)[0] for p in parts.files
        )  # every part
    assert len([p for p, _ in hub.downloads()]) == 3  # the three parts, once each


def test_offline_serves_every_pulled_model_loading_on_demand(hub, env):
    hub.log.clear()
    # -hf under --offline: the name is looked up in the cache, the hub is not asked (hub.log stays empty)
    with start_server("--offline", "--pulled", "-hf", f"{WHOLE}:Q4_1", *SMALL, env=env) as srv:
        ids = {m["id"]: m["status"]["value"] for m in httpx.get(f"{srv.url}/models").json()["data"]}
        assert set(ids) == {f"{WHOLE}:Q4_1", f"{SPLIT}:Q4_1"}
        assert ids == {f"{WHOLE}:Q4_1": "loaded", f"{SPLIT}:Q4_1": "unloaded"}
        assert "Paris" in chat(srv.url, f"{SPLIT}:Q4_1")  # loaded for this request
        tags = {m["name"] for m in httpx.get(f"{srv.url}/api/tags").json()["models"]}
        assert tags == set(ids)
    assert hub.log == []


def test_rm_removes_a_model_and_offline_then_says_what_is_missing(hub, env, tmp_path):
    gone = cllm(env, "rm", f"{SPLIT}:Q4_1")
    assert gone.returncode == 0 and f"removed {SPLIT}:Q4_1" in gone.stdout
    assert SPLIT not in cllm(env, "ls").stdout
    settings = tmp_path / "cllm.yaml"
    settings.write_text(f"model: {SPLIT}\n")  # a model: that is no file but a name means the repo, as -hf does
    refused = cllm({**env, "HF_HUB_OFFLINE": "1"}, "serve", "--config", str(settings), *SMALL)
    assert (
        refused.returncode == 2
        and "cannot be fetched offline" in refused.stderr
        and f"cllm pull {SPLIT}" in refused.stderr
    )
