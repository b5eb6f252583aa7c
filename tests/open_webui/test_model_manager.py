"""Open WebUI itself (tests/open_webui/requirements.txt pins it, `make test-open-webui` installs it into
perf/cache/open-webui/ and runs this), its Ollama connection pointed at `cllm serve --pulled --allow-pull`: its
model manager pulls a model through its own backend route (POST /ollama/api/pull, which Open WebUI proxies to
cllm's /api/pull and streams back line by line), lists it (GET /api/models, the list its model picker shows),
chats with it (POST /ollama/api/chat) and deletes it (DELETE /ollama/api/delete). The model comes from the
stand-in hub (tests/hub_server.py) through the real huggingface_hub, as in tests/test_pull_api.py.

Without CLLM_TEST_OPEN_WEBUI=1 the module is skipped; with it, a missing Open WebUI fails.
"""

from __future__ import annotations

import json
import os
import subprocess
import time
from collections.abc import Iterator

import httpx
import pytest

from cllm.core.model_file import embedded_model_path
from tests.conftest import ROOT, free_port, start_server
from tests.hub_server import FakeHub, Repo
from tests.test_pull_api import NAME, QUESTION, WHOLE

if not os.environ.get("CLLM_TEST_OPEN_WEBUI"):
    pytest.skip("Open WebUI runs with `make test-open-webui` (CLLM_TEST_OPEN_WEBUI=1)", allow_module_level=True)

OPEN_WEBUI = os.path.join(ROOT, "perf", "cache", "open-webui", "bin", "open-webui")
DEFAULT = "SmolLM2-135M-Instruct.Q4_1:latest"  # the model cllm starts on, as Open WebUI ids an Ollama model
# Its start imports torch, transformers and the rest, and migrates a fresh database: minutes on a busy 2-core machine.
START_TIMEOUT = 900.0
ADMIN = {"name": "Ada", "email": "ada@example.com", "password": "a-long-password-1"}


@pytest.fixture(scope="module")
def cllm(tmp_path_factory) -> Iterator[str]:
    repos = {WHOLE: Repo({"README.md": b"# SmolLM2\n", "SmolLM2-135M-Instruct-Q4_1.gguf": embedded_model_path()})}
    base = {k: v for k, v in os.environ.items() if not k.startswith("HF_")}
    with FakeHub(repos) as hub:
        env = {**base, "HF_ENDPOINT": hub.endpoint, "HF_HOME": str(tmp_path_factory.mktemp("hf-home"))}
        with start_server("--pulled", "--allow-pull", "--ctx-size", "1024", "--parallel", "2", env=env) as srv:
            yield srv.url


@pytest.fixture(scope="module")
def webui(cllm, tmp_path_factory) -> Iterator[httpx.Client]:
    """Open WebUI on a fresh data folder, its one Ollama connection cllm, its OpenAI one off, nothing fetched from
    outside; a client signed in as its first user, whom Open WebUI makes its admin."""
    assert os.path.exists(OPEN_WEBUI), f"{OPEN_WEBUI} is missing: `make test-open-webui` installs it"
    data = tmp_path_factory.mktemp("open-webui")
    env = {
        **os.environ,
        "DATA_DIR": str(data),
        "OLLAMA_BASE_URL": cllm,
        "ENABLE_OPENAI_API": "false",
        "OFFLINE_MODE": "true",
        "HF_HUB_OFFLINE": "1",
        "WEBUI_SECRET_KEY": "cllm-test-secret",
        "ENABLE_VERSION_UPDATE_CHECK": "false",
        "MODELS_CACHE_TTL": "",  # no cached model list: the list after a pull is asked of cllm again
    }
    port = free_port()
    with open(data / "log", "w") as log:
        proc = subprocess.Popen(
            [OPEN_WEBUI, "serve", "--host", "127.0.0.1", "--port", str(port)],
            env=env,
            cwd=data,
            stdout=log,
            stderr=subprocess.STDOUT,
        )
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + START_TIMEOUT
        while not _up(url):
            assert proc.poll() is None, f"Open WebUI exited: {(data / 'log').read_text()[-3000:]}"
            assert time.monotonic() < deadline, f"Open WebUI did not start: {(data / 'log').read_text()[-3000:]}"
            time.sleep(1)
        with httpx.Client(base_url=url, timeout=300) as c:
            r = c.post("/api/v1/auths/signup", json=ADMIN)
            assert r.status_code == 200, r.text
            assert r.json()["role"] == "admin"
            c.headers["Authorization"] = f"Bearer {r.json()['token']}"
            yield c
    finally:
        proc.terminate()
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def _up(url: str) -> bool:
    try:
        return httpx.get(f"{url}/health", timeout=5).status_code == 200
    except httpx.HTTPError:
        return False


def listed(webui: httpx.Client) -> set[str]:
    """The ids of the models Open WebUI's model picker offers, asked afresh."""
    r = webui.get("/api/models", params={"refresh": "true"})
    assert r.status_code == 200, r.text
    return {m["id"] for m in r.json()["data"]}


def test_open_webui_pulls_lists_chats_with_and_deletes_a_model(webui):
    assert listed(webui) == {DEFAULT}

    lines = []
    with webui.stream("POST", "/ollama/api/pull", json={"model": f"hf.co/{NAME}"}) as r:
        assert r.status_code == 200
        lines = [json.loads(line) for line in r.iter_lines() if line.strip()]
    size = os.path.getsize(embedded_model_path())
    files = [p for p in lines if p.get("digest")]
    assert lines[0]["status"] == "pulling manifest" and lines[-1] == {"status": "success"}
    assert files and files[-1]["completed"] == files[-1]["total"] == size

    assert listed(webui) == {DEFAULT, NAME}
    tags = webui.get("/ollama/api/tags").json()["models"]
    assert {m["model"] for m in tags} == {DEFAULT, NAME}

    r = webui.post(
        "/ollama/api/chat",
        json={"model": NAME, "messages": QUESTION, "stream": False, "options": {"temperature": 0, "num_predict": 20}},
    )
    assert r.status_code == 200, r.text
    assert "Paris" in r.json()["message"]["content"]

    r = webui.request("DELETE", "/ollama/api/delete", json={"model": NAME})
    assert r.status_code == 200, r.text
    assert listed(webui) == {DEFAULT}


def test_a_bad_name_comes_back_through_open_webui_as_cllms_sentence(webui):
    r = webui.post("/ollama/api/pull", json={"model": "https://example.com/x.gguf"})
    assert r.status_code == 400 and "Hugging Face" in r.json()["detail"], r.text
