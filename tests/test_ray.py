"""cllm on Ray Serve: `cllm serve --ray local` on a local Ray cluster this module starts and stops.

Two replicas with one thread each, the real model, real clients, through
Serve's HTTP proxy. Ray writes its session under a temporary directory of the
module's own, checked empty after the server stops, as its processes are gone.
"""

from __future__ import annotations

import importlib.util
import json
import os
import re
import shutil
import signal
import tempfile
import threading
import time

import httpx
import openai
import psutil
import pytest

from tests.conftest import alive, family, start_server, wait_until

pytestmark = [
    pytest.mark.ray,
    pytest.mark.skipif(
        importlib.util.find_spec("ray") is None, reason="the ray extra is not installed (make test-ray)"
    ),
]

STOP_TIMEOUT = 60.0
KEY = "ray-test-key"
AUTH = {"Authorization": f"Bearer {KEY}"}


@pytest.fixture(scope="module")
def ray_server():
    temp = tempfile.mkdtemp(prefix="cllm-t", dir="/tmp")  # short: Ray's socket paths live under it
    # Every token its own event (no stream interval), so that a stream's pieces count its tokens.
    srv = start_server(
        "--ray",
        "local",
        "--replicas",
        "2",
        "--threads",
        "1",
        "--parallel",
        "4",
        "--ctx-size",
        "4096",
        "--stream-interval-ms",
        "0",
        env={"TMPDIR": temp, "CLLM_API_KEY": KEY},
    )
    procs = family(srv.proc)
    try:
        yield srv
    finally:
        if srv.proc.poll() is None:
            procs += family(srv.proc)  # the replicas and engines Ray started since, replacements included
        code = srv.stop(signal.SIGTERM)
        wait_until(lambda: not alive(procs), STOP_TIMEOUT)
        left = os.listdir(temp)
        shutil.rmtree(temp, ignore_errors=True)
        assert code == 0, "".join(srv.stderr_lines[-30:])
        assert not left, f"Ray left {left} in its temporary directory"


@pytest.fixture(scope="module")
def http(ray_server):
    with httpx.Client(base_url=ray_server.url, timeout=120, headers=AUTH) as client:
        yield client


def engines(srv) -> list[psutil.Process]:
    return [p for p in alive(family(srv.proc)) if "engine_proc" in " ".join(p.cmdline())]


def replica_metrics(http: httpx.Client, tries: int = 40) -> dict[str, str]:
    """Each replica's /metrics text, by its replica label (Serve sends each scrape to one of them)."""
    seen: dict[str, str] = {}
    for _ in range(tries):
        text = http.get("/metrics").text
        label = re.search(r'cllm_requests_total\{replica="([^"]+)"', text)
        if label:
            seen[label.group(1)] = text
        if len(seen) == 2:
            break
    return seen


def figure(text: str, name: str) -> float:
    return sum(float(v) for v in re.findall(rf"^{name}\{{[^}}]*\}} (\S+)$", text, re.M))


def test_openai_client_and_streams_through_the_serve_proxy(ray_server):
    client = openai.OpenAI(base_url=ray_server.url + "/v1", api_key=KEY, timeout=120)
    reply = client.chat.completions.create(
        model="any",
        messages=[{"role": "user", "content": "What is the capital of France?"}],
        max_tokens=12,
        temperature=0,
    )
    assert reply.choices[0].message.content and reply.usage.completion_tokens > 0
    pieces = [
        c.choices[0].text
        for c in client.completions.create(
            model="any", prompt="Once upon a time", max_tokens=16, temperature=0, stream=True
        )
        if c.choices
    ]
    # A frontend that falls behind the engine still writes what one wake-up finds as one event.
    assert len(pieces) >= 6 and "".join(pieces).strip()


def test_bad_requests_are_cllm_errors_not_ray_tracebacks(http):
    r = http.post("/v1/chat/completions", json={"messages": "not a list"})
    assert r.status_code == 400 and r.json()["error"]["param"] == "messages"
    r = http.post("/generate", content=b"{not json")
    assert r.status_code == 400 and r.json()["success"] is False
    r = http.post("/generate", content=b"x" * (1 << 21))
    assert r.status_code == 413 and r.json()["success"] is False
    r = http.get("/no/such/route")
    assert r.status_code == 404 and r.json()["success"] is False
    r = httpx.post(http.base_url.join("/v1/completions"), json={"prompt": "hi"}, timeout=60)  # no key
    assert r.status_code == 401 and r.json()["error"]["message"]
    assert http.get("/health").json()["data"]["healthy"] is True


def test_metrics_carry_a_replica_label(http):
    seen = replica_metrics(http)
    assert len(seen) == 2, "both replicas answer /metrics"
    for label, text in seen.items():
        samples = [line for line in text.splitlines() if line and not line.startswith("#")]
        assert samples and all(f'replica="{label}"' in line for line in samples)


def test_a_shared_prefix_stays_on_one_replica_and_unrelated_prompts_spread(http):
    before = replica_metrics(http)
    system = "You are a careful assistant for a library. " * 40  # ~1,800 characters, ~350 tokens
    for i in range(6):
        r = http.post(
            "/v1/chat/completions",
            json={
                "messages": [
                    {"role": "system", "content": system},
                    {"role": "user", "content": f"Question {i}: name a book."},
                ],
                "max_tokens": 4,
                "temperature": 0,
            },
        )
        assert r.status_code == 200
    time.sleep(1.5)  # the engines report their cache figures once a second

    def hits() -> dict[str, float] | None:
        now = replica_metrics(http)
        gained = {
            k: figure(now[k], "cllm_prefix_cache_hit_tokens_total")
            - figure(before.get(k, ""), "cllm_prefix_cache_hit_tokens_total")
            for k in now
        }
        return gained if len(gained) == 2 and max(gained.values()) >= 5 * 300 else None

    gained = wait_until(hits, 30, 0.5)
    assert min(gained.values()) < 300, f"one replica took the shared prefix: {gained}"

    for i in range(10):
        assert http.post("/generate", json={"prompt": f"{i} unrelated words {i}", "max_tokens": 2}).status_code == 200
    after = replica_metrics(http)
    served = {
        k: sum(
            float(v)
            for v in re.findall(r'^cllm_requests_total\{[^}]*route="/generate",status="200"\} (\S+)$', after[k], re.M)
        )
        for k in after
    }
    assert len(served) == 2 and min(served.values()) >= 1, f"unrelated requests spread: {served}"


def stream(url: str, out: dict) -> None:
    body = {"prompt": f"Count slowly {id(out)}", "max_tokens": 300, "ignore_eos": True, "temperature": 0}
    out["events"] = []
    try:
        with httpx.stream("POST", url + "/generate_stream", json=body, timeout=120, headers=AUTH) as r:
            out["status"] = r.status_code
            for line in r.iter_lines():
                if line.startswith("data: "):
                    out["events"].append(json.loads(line[6:]))
    except httpx.HTTPError as e:
        out["error"] = e


def test_an_engine_death_fails_only_its_streams_and_the_replica_is_replaced(ray_server, http):
    assert len(engines(ray_server)) == 2
    outs = [{}, {}]
    threads = [threading.Thread(target=stream, args=(ray_server.url, o)) for o in outs]
    # the second starts while the first runs: the router sends it to the other replica
    for t, out in zip(threads, outs):
        t.start()
        wait_until(lambda: len(out.get("events", [])) >= 3, 60)
    victim = engines(ray_server)[0]
    victim.send_signal(signal.SIGKILL)
    killed = time.monotonic()
    for t in threads:
        t.join(120)
    ends = [o["events"][-1] for o in outs]
    failed = [e for e in ends if "error" in e]
    finished = [e for e in ends if e.get("finish_reason") == "length"]
    assert len(failed) == 1 and len(finished) == 1, ends
    assert finished[0]["generated_tokens"] == 300

    def recovered() -> bool:
        live = engines(ray_server)
        return (
            len(live) == 2
            and victim.pid not in [p.pid for p in live]
            and all(
                http.post("/generate", json={"prompt": f"ok {i}", "max_tokens": 2}).status_code == 200 for i in range(4)
            )
        )

    wait_until(recovered, 120, 0.5)
    print(f"recovered in {time.monotonic() - killed:.1f} s")
