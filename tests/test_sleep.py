"""--sleep-idle-seconds: an idle model's engines stop (its weights and KV cells freed), /props says is_sleeping,
the prefix cache's files stay, and the next request wakes it and is answered, its wait in its TTFT and in
cllm_model_wake_seconds; with several models each sleeps on its own."""

from __future__ import annotations

import os
import re
import signal
import threading

from cllm.core.model_file import embedded_model_path
from tests.conftest import child, family, health, start_server, wait_until
from tests.test_disk_cache import ARGS, blocks, complete, encode, files
from tests.test_prefix_cache_exact import doc

SLEEP = "3"
ONE = ("--parallel", "1", "--ctx-size", "512", "--sleep-idle-seconds", SLEEP)
ASK = {"prompt": "The capital of France is", "max_tokens": 4, "temperature": 0}


def engines(srv) -> list:
    return [p for p in family(srv.proc)[1:] if "engine_proc" in " ".join(p.cmdline())]


def metric(http, name: str) -> float:
    found = re.search(rf"^{re.escape(name)}(?:{{[^}}]*}})? (\S+)$", http.get("/metrics").text, re.M)
    return float(found[1]) if found else 0.0


def test_an_idle_model_sleeps_keeps_its_cache_files_and_wakes_for_the_next_request(tmp_path):
    cache = tmp_path / "kv"
    with start_server(*ARGS, "--cache-dir", str(cache), "--sleep-idle-seconds", SLEEP) as srv, srv.client() as http:
        prompt = encode(http, doc("harbour", 10))
        text, _ = complete(http, prompt)
        assert http.get("/props").json()["is_sleeping"] is False
        engine = child(srv, "engine_proc")
        wait_until(lambda: http.get("/props").json()["is_sleeping"], 60)
        assert not engine.is_running() or engine.status() == "zombie"
        assert engines(srv) == [] and files(cache)  # weights and KV gone with the engine; its cache on disk stays
        assert http.get("/health").status_code == 200  # asleep is not down
        stderr_before = len(srv.stderr_lines)
        again, cached = complete(http, prompt)  # wakes it
        assert again == text and cached == blocks(prompt)  # the same answer, its prompt read from the files
        assert http.get("/props").json()["is_sleeping"] is False and len(engines(srv)) == 1
        assert metric(http, "cllm_model_wake_seconds_count") == 1
        woke = metric(http, "cllm_model_wake_seconds_sum")
        (line,) = [ln for ln in srv.stderr_lines[stderr_before:] if "route=/v1/completions" in ln]
        assert float(re.search(r"ttft=([0-9.]+)", line)[1]) >= woke > 0


def test_each_model_sleeps_on_its_own(tmp_path):
    for name in ("a", "b"):
        os.symlink(embedded_model_path(), tmp_path / f"{name}.gguf")
    args = ("--models-dir", str(tmp_path), "--parallel", "1", "--ctx-size", "512", "--sleep-idle-seconds", SLEEP)
    with start_server(*args) as srv, srv.client() as http:
        ask = {"prompt": "The capital of France is", "max_tokens": 2, "temperature": 0}
        for name in ("a", "b"):
            assert http.post("/v1/completions", json={**ask, "model": name}).status_code == 200

        def statuses() -> dict:
            return {m["id"]: m["status"]["value"] for m in http.get("/models").json()["data"]}

        def b_asleep() -> dict | None:
            """The statuses right after a request to a (which keeps it awake) once b sleeps: read later, a loaded
            machine's pause could outlast a's own idle seconds."""
            assert http.post("/v1/completions", json={**ask, "model": "a"}).status_code == 200
            now = statuses()
            return now if now["b"] == "sleeping" else None

        assert wait_until(b_asleep, 60, interval=0.5) == {"a": "loaded", "b": "sleeping"}
        assert http.get("/props", params={"model": "b"}).json()["is_sleeping"] is True
        assert http.post("/v1/completions", json={**ask, "model": "a"}).status_code == 200
        assert http.get("/props", params={"model": "a"}).json()["is_sleeping"] is False
        assert http.post("/v1/completions", json={**ask, "model": "b"}).status_code == 200
        assert statuses()["b"] == "loaded"


def answered(http) -> str:
    r = http.post("/v1/completions", json=ASK)
    assert r.status_code == 200, r.text
    return r.json()["choices"][0]["text"]


def reply_text(http) -> str | None:
    r = http.post("/v1/completions", json=ASK)
    return r.json()["choices"][0]["text"] if r.status_code == 200 else None


def test_an_engine_killed_awake_or_while_waking_is_restarted_and_the_model_still_sleeps_and_wakes():
    with start_server(*ONE) as srv, srv.client() as http:
        text = answered(http)
        child(srv, "engine_proc").send_signal(signal.SIGKILL)  # awake and idle: the supervisor starts it again
        # 503 while it restarts; on a slow machine the idle model may fall asleep first, and the request wakes it
        assert wait_until(lambda: reply_text(http), 120, interval=0.5) == text
        wait_until(lambda: http.get("/props").json()["is_sleeping"], 60)  # it sleeps when idle again
        assert engines(srv) == []

        woken = metric(http, "cllm_model_wake_seconds_count")
        replies: list = []
        waking = threading.Thread(target=lambda: replies.append(http.post("/v1/completions", json=ASK)))
        waking.start()
        engine = wait_until(lambda: engines(srv), 30, interval=0.02)[0]
        engine.send_signal(signal.SIGKILL)  # as it starts, long before it has loaded the model
        waking.join(120)
        (reply,) = replies  # the wake waited for the engine started in its place
        assert reply.status_code == 200 and reply.json()["choices"][0]["text"] == text
        assert http.get("/props").json()["is_sleeping"] is False and len(engines(srv)) == 1
        assert metric(http, "cllm_model_wake_seconds_count") == woken + 1


def test_the_frontend_killed_while_the_model_sleeps_leaves_it_asleep_and_the_next_request_wakes_it():
    with start_server(*ONE) as srv:
        with srv.client() as http:
            text = answered(http)
            wait_until(lambda: http.get("/props").json()["is_sleeping"], 60)
        child(srv, "frontend_proc").send_signal(signal.SIGKILL)  # the supervisor starts another on the same socket
        with srv.client(timeout=120) as http:  # waits in the backlog while it starts
            props = http.get("/props").json()  # answered from what its engines said, passed on by the supervisor
            assert props["is_sleeping"] is True and props["total_slots"] == 1 and props["model_path"].endswith(".gguf")
            assert [s["is_processing"] for s in http.get("/slots").json()] == [False] and engines(srv) == []
            assert health(http, "detailed")["restarts"]["frontend"] == 1
            assert answered(http) == text
            assert http.get("/props").json()["is_sleeping"] is False and len(engines(srv)) == 1
