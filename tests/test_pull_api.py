"""Models managed over HTTP (frontend_proc/core/pulls.py): the real `ollama` client pulls the embedded SmolLM2 from
a stand-in hub (tests/hub_server.py, through the real huggingface_hub) into a server started with --pulled
--allow-pull on an empty cache, chats with it at once, shows, copies and deletes it; /models shows a pull under
way and one that failed; /models/load pulls a model not there yet; a crafted GGUF is refused and removed while the
server keeps serving; and a server without --allow-pull refuses with a 403 naming it.

The tests run in order on one server and one HF_HOME.
"""

from __future__ import annotations

import hashlib
import os
import signal
import threading

import httpx
import ollama
import pytest

from cllm.core.model_file import embedded_model_path
from cllm.hub.store import repo_folder
from tests.conftest import child, start_server, wait_until
from tests.hub_server import FakeHub, Repo
from tests.unit.test_gguf_check import BAD

WHOLE = "cllm-test/SmolLM2-135M-Instruct-GGUF"
NAME = f"{WHOLE}:Q4_1"
CRAFTED = "cllm-test/crafted-GGUF"
KEY = "k" * 32
DEFAULT = "SmolLM2-135M-Instruct.Q4_1"  # the model the server starts on
SMALL = ("--ctx-size", "1024", "--parallel", "2")
QUESTION = [
    {"role": "system", "content": "You are a helpful assistant who answers in one sentence."},
    {"role": "user", "content": "What is the capital of France?"},
]


@pytest.fixture(scope="module")
def hub():
    repos = {
        WHOLE: Repo({"README.md": b"# SmolLM2\n", "SmolLM2-135M-Instruct-Q4_1.gguf": embedded_model_path()}),
        CRAFTED: Repo({"crafted-Q4_K_M.gguf": bytes(BAD["offset past the end"][0]())}),
    }
    with FakeHub(repos) as h:
        yield h


@pytest.fixture(scope="module")
def home(tmp_path_factory):
    return str(tmp_path_factory.mktemp("hf-home"))


@pytest.fixture(scope="module")
def srv(hub, home):
    base = {k: v for k, v in os.environ.items() if not k.startswith("HF_")}
    env = {**base, "HF_ENDPOINT": hub.endpoint, "HF_HOME": home, "HF_HUB_DISABLE_TELEMETRY": "1"}
    with start_server("--pulled", "--allow-pull", "--api-key", KEY, *SMALL, env=env) as s:
        yield s


def client(srv) -> ollama.Client:
    return ollama.Client(host=srv.url, headers={"Authorization": f"Bearer {KEY}"}, timeout=300)


def get(srv, path: str) -> dict:
    r = httpx.get(f"{srv.url}{path}", headers={"Authorization": f"Bearer {KEY}"}, timeout=60)
    assert r.status_code == 200, r.text
    return r.json()


def answer(srv, model: str) -> str:
    reply = client(srv).chat(model=model, messages=QUESTION, options={"num_predict": 20, "temperature": 0})
    return str(reply.message.content)


def serving(srv) -> dict | None:
    """/health?level=detailed's figures once every engine serves (503 while one restarts)."""
    r = httpx.get(f"{srv.url}/health", params={"level": "detailed"}, timeout=60)
    return r.json()["data"] if r.status_code == 200 else None


def status(srv) -> dict[str, str]:
    return {m["id"]: m["status"]["value"] for m in get(srv, "/models")["data"]}


def cached(home: str, repo: str) -> list[str]:
    folder = repo_folder(os.path.join(home, "hub"), repo)
    return [n for _, _, names in os.walk(folder) for n in names]


def test_management_needs_the_key(srv):
    r = httpx.post(f"{srv.url}/api/pull", json={"model": NAME}, timeout=30)
    assert r.status_code == 401
    r = httpx.request("DELETE", f"{srv.url}/api/delete", json={"model": NAME}, timeout=30)
    assert r.status_code == 401


def test_a_pull_streams_progress_and_the_model_answers_at_once(srv, hub, home):
    assert [m["id"] for m in get(srv, "/v1/models")["data"]] == ["SmolLM2-135M-Instruct.Q4_1"]  # an empty cache
    lines = list(client(srv).pull(f"hf.co/{NAME}", stream=True))
    size = os.path.getsize(embedded_model_path())
    with open(embedded_model_path(), "rb") as f:
        sha = hashlib.sha256(f.read()).hexdigest()
    files = [p for p in lines if p.digest]
    assert files and {p.digest for p in files} == {f"sha256:{sha}"} and files[-1].completed == files[-1].total == size
    assert lines[0].status == "pulling manifest" and lines[-1].status == "success"
    assert NAME in {m["name"] for m in get(srv, "/api/tags")["models"]}
    assert NAME in {m["id"] for m in get(srv, "/v1/models")["data"]}
    assert "Paris" in answer(srv, f"hf.co/{NAME}")
    assert "completion" in client(srv).show(NAME).capabilities
    assert {m["id"]: m["status"]["value"] for m in get(srv, "/models")["data"]}[NAME] == "loaded"


def test_copy_gives_an_alias_and_delete_removes_the_pulled_model(srv, home):
    assert client(srv).copy(NAME, "smol").status == "success"
    assert client(srv).show("smol").details.family == "llama"
    with pytest.raises(ollama.ResponseError) as e:
        client(srv).delete("SmolLM2-135M-Instruct.Q4_1")  # started from a file
    assert e.value.status_code == 400 and "deletes only models it pulled" in e.value.error
    assert client(srv).delete(NAME).status == "success"
    assert NAME not in {m["name"] for m in get(srv, "/api/tags")["models"]}
    assert "smol" not in {m["id"] for m in get(srv, "/models")["data"]}
    assert cached(home, WHOLE) == []
    with pytest.raises(ollama.ResponseError) as e:
        client(srv).delete(NAME)
    assert e.value.status_code == 404


def test_models_shows_the_download_and_a_second_request_follows_it(srv, hub):
    hub.pace, hub.log = 4.0, []
    first: list = []
    pulling = threading.Thread(target=lambda: first.extend(client(srv).pull(NAME, stream=True)))
    pulling.start()
    try:
        seen = wait_until(
            lambda: [
                m for m in get(srv, "/models")["data"] if m["id"] == NAME and m["status"]["value"] == "downloading"
            ],
            30,
        )
        assert seen[0]["status"]["progress"]["total"] in (0, os.path.getsize(embedded_model_path()))
        second = client(srv).pull(NAME, stream=False)  # follows the first
        assert second.status == "success"
    finally:
        pulling.join(60)
        hub.pace = 0.0
    listings = [p for _, p, _ in hub.log if p.startswith("/api/models/")]
    assert first[-1].status == "success" and len(hub.downloads()) == 1 and len(listings) == 1
    assert {m["id"]: m["status"]["value"] for m in get(srv, "/models")["data"]}[NAME] == "unloaded"


def test_models_load_of_a_model_not_pulled_pulls_it(srv, home):
    assert client(srv).delete(NAME).status == "success"
    r = httpx.post(
        f"{srv.url}/models/load", json={"model": NAME}, headers={"Authorization": f"Bearer {KEY}"}, timeout=300
    )
    assert r.status_code == 200, r.text
    assert {m["id"]: m["status"]["value"] for m in get(srv, "/models")["data"]}[NAME] == "loaded"
    assert cached(home, WHOLE)


def test_a_crafted_gguf_is_refused_removed_and_the_server_keeps_serving(srv, home):
    with pytest.raises(ollama.ResponseError) as e:
        list(client(srv).pull(f"{CRAFTED}:Q4_K_M", stream=True))
    assert "is not a sound GGUF file" in e.value.error and "runs past the file's end" in e.value.error
    (failed,) = [m for m in get(srv, "/models")["data"] if m["id"] == f"{CRAFTED}:Q4_K_M"]
    assert failed["status"]["value"] == "failed" and "runs past the file's end" in failed["status"]["error"]
    assert cached(home, CRAFTED) == []
    assert "Paris" in answer(srv, NAME)


def pull_while_the_engine_dies(srv, hub) -> list:
    """A pull of NAME (paced, so it streams for seconds) during which the default model's engine is killed; its lines,
    or the ResponseError that ended them."""
    assert client(srv).delete(NAME).status == "success"
    engine = child(srv, "engine_proc")  # the default model's: the only one running
    hub.pace = 4.0
    out: list = []

    def pull() -> None:
        try:
            out.extend(client(srv).pull(NAME, stream=True))
        except ollama.ResponseError as e:
            out.append(e)

    pulling = threading.Thread(target=pull)
    pulling.start()
    try:
        wait_until(lambda: status(srv).get(NAME) == "downloading", 30)
        engine.send_signal(signal.SIGKILL)
    finally:
        pulling.join(120)
        hub.pace = 0.0
    assert not pulling.is_alive()
    assert not engine.is_running() or engine.status() == "zombie"
    served = wait_until(lambda: serving(srv), 120)
    assert served["restarts"]["engine"] >= 1  # the supervisor started it again
    assert "Paris" in answer(srv, DEFAULT)
    return out


def test_an_engine_killed_while_a_pull_streams_is_restarted_and_the_pull_finishes(srv, hub, home):
    """The pull runs in the supervisor: the engine dying under it ends neither the pull nor the server."""
    lines = pull_while_the_engine_dies(srv, hub)
    assert lines[-1].status == "success" and any(p.completed for p in lines if p.digest)
    assert "Paris" in answer(srv, NAME)
    assert [n for n in cached(home, WHOLE) if n.endswith(".incomplete")] == []


def test_a_pull_that_fails_while_an_engine_restarts_ends_with_an_error_and_nothing_is_loaded(srv, hub, home):
    """A download that does not match its checksum, the engine killed meanwhile: the stream's last line is the
    error, the file is gone from the cache, and the model is neither served nor loadable from a partial file."""
    hub.corrupt = True
    try:
        lines = pull_while_the_engine_dies(srv, hub)
    finally:
        hub.corrupt = False
    error = lines[-1]
    assert isinstance(error, ollama.ResponseError) and "does not match the hub's checksum" in error.error
    assert status(srv)[NAME] == "failed"
    assert NAME not in {m["id"] for m in get(srv, "/v1/models")["data"]}
    assert [n for n in cached(home, WHOLE) if n.endswith((".gguf", ".incomplete"))] == []
    with pytest.raises(ollama.ResponseError) as e:
        answer(srv, NAME)
    assert e.value.status_code == 404


def test_names_are_hub_repos_and_create_push_stay_refused(srv):
    for bad in ("https://example.com/x.gguf", "/etc/passwd", "../x", "org/model.gguf"):
        with pytest.raises(ollama.ResponseError) as e:
            client(srv).pull(bad, stream=False)
        assert e.value.status_code == 400 and "Hugging Face" in e.value.error, bad
    r = httpx.post(f"{srv.url}/api/create", json={"model": "x"}, headers={"Authorization": f"Bearer {KEY}"})
    assert r.status_code == 400 and "does not create or push models" in r.text


def test_without_allow_pull_a_pull_is_403_naming_the_option():
    with start_server(*SMALL) as plain:
        with pytest.raises(ollama.ResponseError) as e:
            list(ollama.Client(host=plain.url).pull(NAME, stream=True))
        assert e.value.status_code == 403 and "--allow-pull" in e.value.error
        assert httpx.request("DELETE", f"{plain.url}/api/delete", json={"model": NAME}).status_code == 403
