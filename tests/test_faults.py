"""Clients that hang up and processes that die: nothing is lost, nothing is left behind."""

from __future__ import annotations

import json
import signal
import threading
import time

import httpx
import pytest

from tests.conftest import alive, child, family, health, shm_entries, start_server, wait_idle, wait_until

LONG = {"prompt": "Tell me a very long story about a dragon.", "ignore_eos": True, "temperature": 0}


def steps(http: httpx.Client) -> int:
    return health(http)["engine"]["steps"]


# ---- clients that hang up ---------------------------------------------------------


@pytest.fixture(scope="module")
def one_slot():
    """One sequence at a time: an abandoned request that kept running would hold up the next."""
    with start_server("--parallel", "1", "--ctx-size", "1024") as srv:
        yield srv


def test_hanging_up_mid_stream_frees_the_slot(one_slot):
    with one_slot.client() as http:
        before = wait_idle(http)["engine"]["steps"]
        with http.stream("POST", "/generate_stream", json={**LONG, "max_tokens": 1000}) as r:
            assert r.status_code == 200
            lines = (line for line in r.iter_lines() if line.startswith("data: "))
            for _ in range(3):
                assert json.loads(next(lines)[6:])["done"] is False
        # Leaving the block closed the connection mid-stream.
        r = http.post("/generate", json={"prompt": "Hi", "max_tokens": 3, "temperature": 0}, timeout=120)
        assert r.status_code == 200 and r.json()["data"]["generated_tokens"] == 3
        used = wait_idle(http)["engine"]["steps"] - before
    assert used < 200, f"{used} steps: the abandoned stream kept its slot (it wanted 1000)"


def test_hanging_up_before_a_plain_reply_frees_the_slot(one_slot):
    with one_slot.client() as http:
        before = wait_idle(http)["engine"]["steps"]
        with pytest.raises(httpx.ReadTimeout):  # the client gives up and closes the connection
            http.post("/generate", json={**LONG, "max_tokens": 1000}, timeout=httpx.Timeout(60, read=1.0))
        r = http.post("/generate", json={"prompt": "Hi", "max_tokens": 3, "temperature": 0}, timeout=120)
        assert r.status_code == 200 and r.json()["data"]["generated_tokens"] == 3
        used = wait_idle(http)["engine"]["steps"] - before
    # A second of decoding on the embedded model is far fewer steps than the 1000 it wanted.
    assert used < 500, f"{used} steps: the abandoned request kept its slot (it wanted 1000)"


# ---- processes that die -------------------------------------------------------------


class Load:
    """Requests in flight on their own threads; each records how and when it ended."""

    def __init__(self, url: str):
        self.url = url
        self.outcomes: list[dict] = []
        self.threads: list[threading.Thread] = []

    def start(self, stream: bool, **body) -> None:
        t = threading.Thread(target=self._run, args=(stream, body))
        t.start()
        self.threads.append(t)

    def _run(self, stream: bool, body: dict) -> None:
        outcome: dict = {"stream": stream}
        try:
            with httpx.Client(base_url=self.url, timeout=120) as c:
                if stream:
                    with c.stream("POST", "/generate_stream", json=body) as r:
                        outcome["status"] = r.status_code
                        outcome["events"] = [
                            json.loads(line[6:]) for line in r.iter_lines() if line.startswith("data: ")
                        ]
                else:
                    r = c.post("/generate", json=body)
                    outcome["status"], outcome["body"] = r.status_code, r.json()
        except httpx.HTTPError as e:
            outcome["exception"] = type(e).__name__
        outcome["ended"] = time.monotonic()
        self.outcomes.append(outcome)

    def join(self, timeout: float) -> list[dict]:
        deadline = time.monotonic() + timeout
        for t in self.threads:
            t.join(max(0.0, deadline - time.monotonic()))
        assert not any(t.is_alive() for t in self.threads), "a request never ended"
        return self.outcomes


@pytest.fixture(scope="module")
def crashing():
    """A server whose children get killed; at the end nothing of it may remain."""
    shm_before = shm_entries()
    srv = start_server("--parallel", "4", "--ctx-size", "8192")
    seen = family(srv.proc)
    try:
        yield srv, seen
    finally:
        seen += family(srv.proc)
        code = srv.stop(signal.SIGTERM)
        stderr = srv.proc.stderr.read()
    assert code == 0, stderr
    assert not alive(seen)
    assert shm_entries() == shm_before


def test_engine_killed_under_load(crashing):
    srv, seen = crashing
    load = Load(srv.url)
    with srv.client() as http:
        wait_idle(http)
        for i in range(6):  # 4 running, 2 waiting
            load.start(stream=i % 2 == 0, **LONG, max_tokens=2000)
        wait_until(lambda: health(http, "detailed")["queue"]["running"] == 4, 60)
        engine = child(srv, "engine_proc")
        engine.send_signal(signal.SIGKILL)
        killed = time.monotonic()
        outcomes = load.join(30)
        after = http.get("/health", params={"level": "detailed"})

        for o in outcomes:
            assert o["ended"] - killed < 3.0, o
            if o["stream"]:  # the status line went out long ago: the stream says it
                last = o["events"][-1]
                assert o["status"] == 200 and last["done"] is True and last["error"] == "engine failed", o
            else:
                assert o["status"] == 503 and o["body"]["error"] == "engine failed", o
        assert after.status_code == 503
        assert after.json()["data"]["healthy"] is False and after.json()["data"]["status"] == "restarting"

        h = wait_until(lambda: health(http, "detailed")["healthy"] and health(http, "detailed"), 120)
        assert h["restarts"] == {"engine": 1, "frontend": 0}
        r = http.post("/generate", json={"prompt": "Hi", "max_tokens": 3, "temperature": 0})
        assert r.status_code == 200 and r.json()["data"]["generated_tokens"] == 3
        wait_idle(http)
    assert not engine.is_running() or engine.status() == "zombie"
    seen += family(srv.proc)


def test_frontend_killed_under_load(crashing):
    srv, seen = crashing
    load = Load(srv.url)
    with srv.client() as http:
        wait_idle(http)
        for i in range(5):
            load.start(stream=i == 0, **LONG, max_tokens=2000)
        wait_until(lambda: health(http, "detailed")["queue"]["running"] == 4, 60)
        before = steps(http)
        frontend = child(srv, "frontend_proc")
        frontend.send_signal(signal.SIGKILL)
        killed = time.monotonic()
        outcomes = load.join(30)
        # Their connections died with the process that held them.
        assert all("exception" in o and o["ended"] - killed < 3.0 for o in outcomes), outcomes

    with srv.client(timeout=120) as http:  # waits in the backlog while the new frontend starts
        r = http.post("/generate", json={"prompt": "Hi", "max_tokens": 3, "temperature": 0})
        assert r.status_code == 200 and r.json()["data"]["generated_tokens"] == 3
        h = wait_idle(http)
        assert h["restarts"] == {"engine": 1, "frontend": 1}
        # The engine dropped the dead frontend's sequences when the new one said
        # Hello; run to the end they would have taken 2000 steps.
        assert h["engine"]["steps"] - before < 1200
    seen += family(srv.proc)
