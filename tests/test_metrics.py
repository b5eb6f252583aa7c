"""/metrics and /health's live figures against the shared real server."""

from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor

from prometheus_client.parser import text_string_to_metric_families

from cllm.core.protocol import EngineStats, PrefixCacheStats
from frontend_proc.engine.metrics import Metrics, TokenRate
from tests.test_api import generate, stream_events

WAIT = 60.0

# The contract: family (as the parser names it: counters lose "_total") and type.
FAMILIES = {
    "cllm_requests": "counter",
    "cllm_requests_running": "gauge",
    "cllm_requests_waiting": "gauge",
    "cllm_engine_threads": "gauge",
    "cllm_prompt_tokens": "counter",
    "cllm_generation_tokens": "counter",
    "cllm_reranked_documents": "counter",
    "cllm_lora_requests": "counter",
    "cllm_time_to_first_token_seconds": "histogram",
    "cllm_time_per_output_token_seconds": "histogram",
    "cllm_e2e_request_latency_seconds": "histogram",
    "cllm_engine_step_seconds": "histogram",
    "cllm_batch_size": "histogram",
    "cllm_kv_cache_usage_ratio": "gauge",
    "cllm_engine_restarts": "counter",
    "cllm_prefix_cache_hit_tokens": "counter",
    "cllm_prefix_cache_lookups": "counter",
    "cllm_prefix_cache_cells": "gauge",
    "cllm_prefix_cache_restored": "counter",
    "cllm_prefix_cache_host_bytes": "gauge",
    "cllm_prefix_cache_disk_hits": "counter",
    "cllm_prefix_cache_disk_entries": "gauge",
    "cllm_prefix_cache_disk_bytes": "gauge",
    "cllm_prefix_cache_disk_load_seconds": "counter",
    "cllm_prefix_cache_disk_rejected": "counter",
    "cllm_decode_steps": "counter",
    "cllm_decode_steps_graph_reused": "counter",
    "cllm_spec_drafted_tokens": "counter",
    "cllm_spec_accepted_tokens": "counter",
    "cllm_spec_step_drafted_tokens": "histogram",
    "cllm_spec_step_accepted_tokens": "histogram",
    "cllm_model_loads": "counter",
    "cllm_model_load_seconds": "histogram",
    "cllm_model_unloads": "counter",
    "cllm_model_wake_seconds": "histogram",
    "cllm_responses_stored": "gauge",
    "cllm_responses_stored_oldest_age_seconds": "gauge",
}
PER_REQUEST_HISTOGRAMS = (
    "cllm_time_to_first_token_seconds",
    "cllm_time_per_output_token_seconds",
    "cllm_e2e_request_latency_seconds",
)


def scrape(http) -> dict[str, dict[tuple, float]]:
    """Every sample of the cllm families, as {sample name: {sorted labels: value}}."""
    r = http.get("/metrics")
    assert r.status_code == 200
    assert r.headers["content-type"].startswith("text/plain")
    samples: dict[str, dict[tuple, float]] = {}
    for family in text_string_to_metric_families(r.text):
        if family.name.startswith("cllm_"):
            for s in family.samples:
                samples.setdefault(s.name, {})[tuple(sorted(s.labels.items()))] = s.value
    return samples


def value(samples: dict, name: str, **labels) -> float:
    """The sum of the samples that carry these labels (an engine figure: over every engine)."""
    want = set(labels.items())
    return sum(v for key, v in samples.get(name, {}).items() if want <= set(key))


def wait_idle(http, generated_tokens: int = 0) -> dict:
    """Until the frontend has the figures the engine sent on going idle, after
    generating at least ``generated_tokens`` in all (bounded); returns /health?level=full."""
    deadline = time.monotonic() + WAIT
    while time.monotonic() < deadline:
        data = http.get("/health", params={"level": "full"}).json()["data"]
        if (
            data["queue"] == {"in_flight": 0, "running": 0, "waiting": 0}
            and data["engine"]["generated_tokens"] >= generated_tokens
        ):
            return data
        time.sleep(0.05)
    raise AssertionError(f"the server did not go idle: {data['queue']}, {data['engine']}")


def test_every_family_exists_with_its_type(http):
    http.get("/health")  # so the labelled counter has a sample
    r = http.get("/metrics")
    families = {f.name: f.type for f in text_string_to_metric_families(r.text) if f.name.startswith("cllm_")}
    assert families == FAMILIES
    for name in (
        "cllm_requests_total",
        "cllm_prompt_tokens_total",
        "cllm_generation_tokens_total",
        "cllm_engine_restarts_total",
    ):
        assert f"\n{name}" in r.text, name
    assert "_created" not in r.text


def test_metrics_move_by_the_right_amounts(server, http):
    engine_before = wait_idle(http)["engine"]
    max_tokens = 8
    before = scrape(http)

    with ThreadPoolExecutor(3) as pool:
        done = list(
            pool.map(
                lambda p: generate(http, prompt=p, max_tokens=max_tokens, ignore_eos=True),
                ["One", "Two two", "Three three three"],
            )
        )
    events = stream_events(http, "/generate_stream", prompt="Four", max_tokens=max_tokens, ignore_eos=True)
    stream_prompt = http.post("/encode", json={"text": "Four"}).json()["data"]["length"]
    # The OpenAI routes go the same way; two choices are two sequences in one request.
    chat = http.post(
        "/v1/chat/completions",
        json={"messages": [{"role": "user", "content": "Five"}], "max_tokens": max_tokens, "ignore_eos": True, "n": 2},
    )
    assert chat.status_code == 200, chat.text
    usage = chat.json()["usage"]
    assert http.post("/generate", json={"prompt": 5}).status_code == 400
    assert http.get("/generate").status_code == 405
    assert http.get("/no/such/page").status_code == 404
    # The engine counts every token it sampled (no EOS here): then it has reported its last step.
    engine_after = wait_idle(http, engine_before["generated_tokens"] + 6 * max_tokens)["engine"]
    after = scrape(http)

    def delta(name, **labels):
        return value(after, name, **labels) - value(before, name, **labels)

    assert delta("cllm_requests_total", route="/generate", status="200") == 3
    assert delta("cllm_requests_total", route="/generate_stream", status="200") == 1
    assert delta("cllm_requests_total", route="/generate", status="400") == 1
    assert delta("cllm_requests_total", route="/generate", status="405") == 1
    assert delta("cllm_requests_total", route="unmatched", status="404") == 1
    assert delta("cllm_requests_total", route="/encode", status="200") == 1
    assert delta("cllm_requests_total", route="/v1/chat/completions", status="200") == 1
    assert delta("cllm_requests_total", route="/metrics", status="200") == 1  # the first scrape

    assert (
        delta("cllm_prompt_tokens_total")
        == sum(d["prompt_tokens"] for d in done) + stream_prompt + usage["prompt_tokens"]
    )
    assert usage["completion_tokens"] == 2 * max_tokens
    assert (
        delta("cllm_generation_tokens_total")
        == sum(d["generated_tokens"] for d in done) + events[-1]["generated_tokens"] + 2 * max_tokens
    )
    assert delta("cllm_generation_tokens_total") == 6 * max_tokens
    # Per request: 5 latencies; per sequence: 6 first tokens and 6 times per token.
    for name, count in zip(PER_REQUEST_HISTOGRAMS, (6, 6, 5)):
        assert delta(f"{name}_count") == count, name
        assert delta(f"{name}_bucket", le="+Inf") == count, name
        assert delta(f"{name}_sum") > 0, name

    # Engine histograms: one observation per step, every step since the engine started.
    steps = engine_after["steps"] - engine_before["steps"]
    assert steps >= max_tokens
    assert delta("cllm_engine_step_seconds_count") == steps
    assert value(after, "cllm_engine_step_seconds_count") == engine_after["steps"]
    assert delta("cllm_batch_size_count") == steps
    assert delta("cllm_batch_size_sum") >= 6 * max_tokens  # a sequence is in every step that gives it a token
    # Decode steps: those after a sequence's first token; the stream alone decodes 7 steps of the same shape,
    # and llama.cpp reuses the graph of the step before in all of them but the first.
    decoded, reused = delta("cllm_decode_steps_total"), delta("cllm_decode_steps_graph_reused_total")
    assert max_tokens - 1 <= decoded <= steps
    assert max_tokens - 2 <= reused <= decoded
    for name in ("cllm_engine_step_seconds", "cllm_batch_size", *PER_REQUEST_HISTOGRAMS):
        buckets = sorted((float(dict(k)["le"]), v) for k, v in after[f"{name}_bucket"].items())
        counts = [v for _, v in buckets]
        assert counts == sorted(counts) and counts[-1] == value(after, f"{name}_count"), name

    assert value(after, "cllm_requests_running") == 0
    assert value(after, "cllm_requests_waiting") == 0
    assert value(after, "cllm_kv_cache_usage_ratio") == 0
    assert value(after, "cllm_engine_restarts_total") == 0


def test_gauges_and_health_follow_a_running_request(http):
    body = {"prompt": "Tell me a long story.", "max_tokens": 400, "ignore_eos": True}
    with http.stream("POST", "/generate_stream", json=body) as r:
        lines = r.iter_lines()  # kept: a dropped iterator would close the response
        assert next(lines).startswith("data: ")  # it is decoding
        deadline, seen = time.monotonic() + WAIT, None
        while seen is None and time.monotonic() < deadline:
            samples = scrape(http)
            if value(samples, "cllm_requests_running") >= 1 and value(samples, "cllm_kv_cache_usage_ratio") > 0:
                seen = samples
            else:
                time.sleep(0.1)
        assert seen is not None, "never saw the request running"
        health = http.get("/health", params={"level": "detailed"}).json()["data"]
    # Closing the stream aborts the request: the engine frees its cells.
    assert 0 < value(seen, "cllm_kv_cache_usage_ratio") <= 1
    assert health["queue"]["in_flight"] == 1
    engine = health["engine"]
    assert engine["kv_used"] > 0 and engine["kv_total"] == 8192 and 0 < engine["kv_usage_ratio"] <= 1
    wait_idle(http)
    samples = scrape(http)
    assert value(samples, "cllm_requests_running") == 0 and value(samples, "cllm_kv_cache_usage_ratio") == 0


def test_health_detailed_has_live_engine_figures(http):
    generate(http, prompt="Hello", max_tokens=10, ignore_eos=True)
    wait_idle(http)
    detailed = http.get("/health", params={"level": "detailed"}).json()["data"]
    engine = detailed["engine"]
    assert set(engine) == {"kv_used", "kv_total", "kv_usage_ratio", "tokens_per_second_1m", "uptime_seconds"}
    assert engine["tokens_per_second_1m"] > 0
    assert 0 < engine["uptime_seconds"] <= detailed["uptime_seconds"]
    assert detailed["restarts"] == {"engine": 0, "frontend": 0}
    full = http.get("/health", params={"level": "full"}).json()["data"]
    assert set(full["engine"]) == set(engine) | {"steps", "generated_tokens", "parallel"}
    assert full["model"]["kv_bytes"] > 0 and full["model"]["model_bytes"] > 0
    assert "engine" not in http.get("/health").json()["data"]


# ---- units with no model behind them ------------------------------------------

ENGINE = 'model="",replica="0"'  # the labels of an engine of the one model


def series(m: Metrics) -> set[str]:
    """The exposition's lines."""
    return set(m.exposition().decode().splitlines())


def test_engine_ready_after_the_first_counts_as_a_restart():
    m = Metrics()
    m.engine_ready(now=0.0, generation=0)
    m.engine_stats(EngineStats(1, 2, 256, 5, 5, [0.01] * 5, [1] * 5), kv_total=1024, now=1.0)
    m.engine_ready(now=2.0, generation=1)
    assert {
        f"cllm_engine_restarts_total{{{ENGINE}}} 1.0",
        f"cllm_kv_cache_usage_ratio{{{ENGINE}}} 0.25",
        f"cllm_requests_waiting{{{ENGINE}}} 2.0",
        f'cllm_engine_step_seconds_bucket{{le="0.01",{ENGINE}}} 5.0',
    } <= series(m)


def test_prefix_cache_counters_follow_the_engine_counts_across_a_restart():
    m = Metrics()
    m.engine_ready(now=0.0, generation=0)
    for hits, misses, hit_tokens, cells, restored, rejected in ((1, 2, 128, 256, 0, 1), (3, 2, 512, 384, 2, 2)):
        cache = PrefixCacheStats(hits, misses, hit_tokens, cells, restored, host_bytes=1000, disk_rejected=rejected)
        m.engine_stats(EngineStats(0, 0, 0, 1, 1, prefix_cache=cache), kv_total=1024, now=1.0)
    m.engine_ready(now=2.0, generation=1)  # the new engine counts from zero
    m.engine_stats(
        EngineStats(0, 0, 0, 1, 1, prefix_cache=PrefixCacheStats(1, 1, 128, 128, 1, host_bytes=500, disk_rejected=1)),
        kv_total=1024,
        now=3.0,
    )
    assert {
        f'cllm_prefix_cache_lookups_total{{{ENGINE},result="hit"}} 4.0',
        f'cllm_prefix_cache_lookups_total{{{ENGINE},result="miss"}} 3.0',
        f"cllm_prefix_cache_hit_tokens_total{{{ENGINE}}} 640.0",
        f"cllm_prefix_cache_cells{{{ENGINE}}} 128.0",
        f"cllm_prefix_cache_restored_total{{{ENGINE}}} 3.0",
        f"cllm_prefix_cache_host_bytes{{{ENGINE}}} 500.0",
        f"cllm_prefix_cache_disk_rejected_total{{{ENGINE}}} 3.0",
    } <= series(m)


def test_token_rate_over_the_last_minute():
    rate = TokenRate(60.0)
    rate.restart(0.0)
    for t in range(1, 11):  # 100 tokens/s for 10 s
        rate.add(float(t), 100 * t)
    assert rate.rate(10.0) == 100.0  # only 10 s of engine life so far
    assert rate.rate(60.0) == 1000 / 60
    assert rate.rate(65.0) == 500 / 60  # the first 5 s have left the window
    assert rate.rate(200.0) == 0.0
    rate.add(200.0, 1000)  # idle figures
    assert rate.rate(200.0) == 0.0
