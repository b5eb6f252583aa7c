"""Several models on one server: the embedded file under several ids, each its own engines.

One server (with an API key) serves `a` (alias `alpha`, loaded at start), `b`
(two replicas, a q8_0 K cache, loaded on demand) and `huge` (a KV cache no
machine has). A second, smaller one checks --models-max eviction and
keep-alive expiry.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time

import httpx
import openai
import psutil
import pytest
from prometheus_client.parser import text_string_to_metric_families

from cllm.core.model_file import embedded_model_path
from tests.conftest import ROOT, alive, family, start_server, wait_until
from tests.test_metrics import scrape, value

KEY = "pool-test-key"
WAIT = 90.0
# A system prompt of a few hundred tokens: the start that chat turns share.
SYSTEM = "You are a careful assistant. " + " ".join(
    f"Rule {i}: answer briefly and name your sources." for i in range(40)
)


def write_config(tmp_path, body: str) -> str:
    path = tmp_path / "models.yaml"
    path.write_text(body.replace("FILE", embedded_model_path()))
    return str(path)


def engines(srv, model: str) -> list[psutil.Process]:
    """The live engine processes of one model (its id is in the launch JSON on their command line)."""
    return [
        p
        for p in alive(family(srv.proc))
        if "engine_proc" in " ".join(p.cmdline()) and f'"model_id":"{model}"' in " ".join(p.cmdline())
    ]


def status(http: httpx.Client) -> dict[str, str]:
    return {m["id"]: m["status"]["value"] for m in http.get("/models").json()["data"]}


@pytest.fixture(scope="module")
def pool(tmp_path_factory):
    config = write_config(
        tmp_path_factory.mktemp("pool"),
        """
models:
  - {id: a, path: FILE, aliases: [alpha], ctx-size: 1024, parallel: 2}
  - {id: b, path: FILE, ctx-size: 4096, parallel: 4, replicas: 2, cache-type-k: q8_0}
  - {id: huge, path: FILE, ctx-size: 100000000, parallel: 1}
""",
    )
    with start_server("--config", config, env={"CLLM_API_KEY": KEY}) as srv:
        yield srv


@pytest.fixture(scope="module")
def http(pool):
    with httpx.Client(base_url=pool.url, timeout=300, headers={"Authorization": f"Bearer {KEY}"}) as c:
        yield c


@pytest.fixture(scope="module")
def oai(pool):
    return openai.OpenAI(base_url=f"{pool.url}/v1", api_key=KEY, max_retries=0)


def complete(oai, model: str, prompt: str = "The capital of France is", **kw) -> openai.types.Completion:
    return oai.completions.create(model=model, prompt=prompt, max_tokens=kw.pop("max_tokens", 8), temperature=0, **kw)


def test_models_list_every_model_with_its_status(pool, http, oai):
    assert status(http) == {"a": "loaded", "b": "unloaded", "huge": "unloaded"}
    listed = {m.id: m for m in oai.models.list().data}
    assert set(listed) == {"a", "b", "huge"} and listed["a"].aliases == ["alpha"]
    assert httpx.get(f"{pool.url}/models").status_code == 401  # the registry's routes want the key too


def test_routing_by_name_alias_and_default(http, oai):
    assert complete(oai, "a").model == "a"
    assert complete(oai, "alpha").model == "a"
    r = http.post("/generate", json={"prompt": "The capital of France is", "max_tokens": 4, "temperature": 0})
    assert r.status_code == 200  # no model: the default, `a`
    assert status(http) == {"a": "loaded", "b": "unloaded", "huge": "unloaded"}


@pytest.mark.parametrize("name", ["gpt-4", "../x", "/etc/passwd", "a/../b"])
def test_unknown_model_is_404_in_each_api_shape(http, oai, name):
    with pytest.raises(openai.NotFoundError) as e:
        complete(oai, name)
    assert e.value.body["code"] == "model_not_found" and e.value.body["param"] == "model"
    r = http.post("/models/load", json={"model": name})
    assert r.status_code == 404 and r.json()["error"] == "model not found"
    r = http.post("/generate", json={"prompt": "x", "model": name})
    assert r.status_code == 404


def test_load_on_demand_with_a_q8_0_cache(pool, http, oai):
    reply = complete(oai, "b")  # not loaded: this request starts its two engines and waits
    assert reply.model == "b" and "Paris" in reply.choices[0].text
    assert status(http)["b"] == "loaded" and len(engines(pool, "b")) == 2
    assert '"cache-type-k":"q8_0"' in " ".join(engines(pool, "b")[0].cmdline())
    h = http.get("/health", params={"level": "detailed"}).json()["data"]
    assert h["healthy"] and [(e["model"], e["replica"], e["status"]) for e in h["engines"]] == [
        ("a", 0, "serving"),
        ("b", 0, "serving"),
        ("b", 1, "serving"),
    ]


def test_metrics_props_and_slots_take_model_as_llama_servers_router_does(http):
    """?model= on /metrics keeps that model's series (the server-wide families have no model label), on /props and
    /slots answers for that model; an unloaded model's figures are read, not loaded; an unknown name is a 404."""
    for name, model, replicas, slots in (("b", "b", {"0", "1"}, 8), ("alpha", "a", {"0"}, 2)):
        r = http.get("/metrics", params={"model": name})
        assert r.status_code == 200 and r.headers["content-type"].startswith("text/plain")
        families = {f.name: f for f in text_string_to_metric_families(r.text)}
        assert {s.labels["model"] for f in families.values() for s in f.samples} == {model}
        assert {s.labels["replica"] for s in families["cllm_requests_running"].samples} == replicas
        assert families["cllm_model_loads"].samples and "cllm_requests" not in families
        assert http.get("/props", params={"model": name}).json()["total_slots"] == slots
        assert len(http.get("/slots", params={"model": name}).json()) == slots
    assert http.get("/metrics", params={"model": "huge"}).text == ""  # never loaded: no series yet
    assert status(http)["huge"] == "unloaded"
    for route in ("/metrics", "/props", "/slots"):
        r = http.get(route, params={"model": "nope"})
        assert r.status_code == 404 and "`nope`" in r.text, route


def test_replicas_route_shared_prefixes_together_and_spread_the_rest(http, oai):
    complete(oai, "b")
    wait_until(lambda: status(http)["b"] == "loaded", WAIT)
    before = scrape(http)
    for question in ("What is 2 + 2?", "Name a color.", "Name a fruit.", "What is the sky's color?"):
        oai.chat.completions.create(
            model="b",
            messages=[{"role": "system", "content": SYSTEM}, {"role": "user", "content": question}],
            max_tokens=4,
            temperature=0,
        )

    def lookups(samples, replica, result):
        return value(samples, "cllm_prefix_cache_lookups_total", model="b", replica=replica, result=result)

    def four_more():
        """The scrape and each replica's lookups since ``before``, once the four requests are all counted."""
        after = scrape(http)
        seen = {r: sum(lookups(after, r, k) - lookups(before, r, k) for k in ("hit", "miss")) for r in "01"}
        return (after, seen) if sum(seen.values()) == 4 else None

    after, seen = wait_until(four_more, WAIT)
    [replica] = [r for r in "01" if seen[r] == 4]  # every turn went to the replica that had the prefix
    assert lookups(after, replica, "hit") - lookups(before, replica, "hit") >= 3  # and found it in its cache

    before = after
    for i in range(4):  # short, unrelated prompts: nothing to steer by, so they take turns
        complete(oai, "b", prompt=f"Count to {i + 3}:", max_tokens=2)

    assert wait_until(four_more, WAIT)[1] == {"0": 2, "1": 2}


def test_a_model_too_large_for_memory_is_refused(http, oai):
    with pytest.raises(openai.InternalServerError) as e:
        complete(oai, "huge")
    assert e.value.status_code == 503 and "insufficient memory" in e.value.body["message"]
    r = http.post("/models/load", json={"model": "huge"})
    assert r.status_code == 503 and "MiB are available" in r.json()["message"]
    assert status(http)["huge"] == "unloaded"


def test_one_engine_crashing_leaves_the_other_model_streaming(pool, http, oai):
    complete(oai, "b")
    events: list = []
    errors: list = []

    def stream_b():
        try:
            for chunk in oai.completions.create(
                model="b",
                prompt="Once upon a time",
                max_tokens=120,
                temperature=0,
                stream=True,
                extra_body={"ignore_eos": True},
            ):
                events.append(chunk)
        except Exception as e:  # noqa: BLE001 - the assertion below reports it
            errors.append(e)

    def call_a():
        try:
            complete(oai, "a", max_tokens=400, extra_body={"ignore_eos": True})
        except Exception as e:  # noqa: BLE001
            errors.append(e)

    streamer, victim = threading.Thread(target=stream_b), threading.Thread(target=call_a)
    streamer.start()
    victim.start()
    wait_until(lambda: len(events) >= 5, WAIT)
    [engine_a] = engines(pool, "a")
    engine_a.send_signal(signal.SIGKILL)
    streamer.join(WAIT)
    victim.join(WAIT)
    assert events[-1].choices[0].finish_reason == "length"  # b never noticed
    assert len(errors) == 1 and isinstance(errors[0], openai.InternalServerError) and errors[0].status_code == 503
    wait_until(lambda: engines(pool, "a") and engines(pool, "a")[0].pid != engine_a.pid, WAIT)
    assert wait_until(lambda: _serves(oai, "a"), WAIT).model == "a"  # restarted


def _serves(oai, model):
    try:
        return complete(oai, model)
    except openai.InternalServerError:
        return None


def test_unload_stops_the_engines_and_a_request_loads_again(pool, http, oai):
    complete(oai, "b")
    r = http.post("/models/unload", json={"model": "b"})
    assert r.status_code == 200 and r.json() == {"success": True}
    assert status(http)["b"] == "unloaded" and engines(pool, "b") == []
    r = http.post("/models/unload", json={"model": "b"})
    assert r.status_code == 400 and r.json()["error"] == "model is not running"
    assert http.post("/models/load", json={"model": "b"}).json() == {"success": True}
    assert len(engines(pool, "b")) == 2
    text = scrape(http)
    assert value(text, "cllm_model_unloads_total", model="b", reason="request") == 1
    assert value(text, "cllm_model_loads_total", model="b", result="ok") >= 2


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")
def test_sigterm_leaves_no_process_and_no_ring(pool):
    procs = family(pool.proc)
    rings = [fd for p in procs[1:] for fd in _memfds(p)]
    assert len(procs) == 1 + 1 + 1 + 2 and rings  # supervisor, frontend, a, b's two replicas
    assert pool.stop() == 0
    assert alive(procs) == []
    holders = [p for p in psutil.process_iter() if p.pid != pool.proc.pid and _memfds(p) & set(rings)]
    assert holders == []


def _memfds(proc: psutil.Process) -> set[tuple[int, int]]:
    """The ring segments a process holds, by inode (Linux: every ring is a memfd named cllm-ring)."""
    fds = f"/proc/{proc.pid}/fd"
    found = set()
    try:
        for fd in os.listdir(fds):
            if os.readlink(f"{fds}/{fd}").startswith("/memfd:cllm-ring"):
                st = os.stat(f"{fds}/{fd}")
                found.add((st.st_dev, st.st_ino))
    except OSError:  # gone meanwhile
        pass
    return found


def test_models_max_evicts_the_least_recently_used_and_keep_alive_expires(tmp_path):
    config = write_config(
        tmp_path,
        """
models-max: 2
models:
  - {id: a, path: FILE, ctx-size: 512, parallel: 1}
  - {id: c, path: FILE, ctx-size: 512, parallel: 1}
  - {id: d, path: FILE, ctx-size: 512, parallel: 1, keep-alive: 2}
""",
    )
    with start_server("--config", config) as srv, srv.client() as http:

        def gen(model):
            r = http.post("/generate", json={"prompt": "Hello", "max_tokens": 2, "model": model})
            assert r.status_code == 200, r.text

        gen("c")
        gen("a")  # a is now the more recently used
        assert status(http) == {"a": "loaded", "c": "loaded", "d": "unloaded"}
        gen("d")  # a third: c, the least recently used idle one, makes room
        assert status(http) == {"a": "loaded", "c": "unloaded", "d": "loaded"}
        assert engines(srv, "c") == []
        t0 = time.monotonic()
        wait_until(lambda: status(http)["d"] == "unloaded", 30)
        assert time.monotonic() - t0 > 1.0 and engines(srv, "d") == []
        metrics = scrape(http)
        assert value(metrics, "cllm_model_unloads_total", model="c", reason="evicted") == 1
        assert value(metrics, "cllm_model_unloads_total", model="d", reason="keep-alive") == 1


@pytest.mark.parametrize(
    "body,message",
    [
        ("models:\n  - {id: a, path: FILE}\n  - {id: b, path: FILE, aliases: [a]}\n", "model name a is used twice"),
        ("models:\n  - {id: a, path: FILE, cache-type-v: q8_0, flash-attn: 'off'}\n", "needs flash attention"),
        ("models:\n  - {id: '../x', path: FILE}\n", "invalid setting"),
        ("default-model: z\nmodels:\n  - {id: a, path: FILE}\n", "default-model z is not in the registry"),
    ],
)
def test_bad_registries_are_one_clear_line(tmp_path, body, message):
    r = subprocess.run(
        [sys.executable, "-m", "cllm.cli", "serve", "--config", write_config(tmp_path, body)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert r.returncode == 2 and message in r.stderr and r.stderr.count("\n") == 1, r.stderr


def test_models_dir_serves_each_file_by_its_stem(tmp_path):
    os.symlink(embedded_model_path(), tmp_path / "small.gguf")
    with (
        start_server("--models-dir", str(tmp_path), "--ctx-size", "512", "--parallel", "1") as srv,
        srv.client() as http,
    ):
        assert status(http) == {"small": "loaded"}
        r = http.post(
            "/v1/chat/completions",
            json={"model": "small", "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 2},
        )
        assert r.status_code == 200 and r.json()["model"] == "small"
        assert json.loads(http.get("/model/info").text)["data"]["gpu_layers"] == 0  # no GPU backend here
