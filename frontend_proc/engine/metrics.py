"""What the frontend knows about how serving goes: Prometheus families and live figures.

Everything here moves once per finished request or once per EngineStats
message (at most one a second while the engine is busy), never per token.
A scrape or a /health only reads it: the engine never notices either.
The families live in their own registry, not prometheus_client's global one.
The engine's figures are labelled with its model and replica.
"""

from __future__ import annotations

import copy
from collections import deque
from collections.abc import Iterator, Sequence
from typing import Any, Generic, TypeVar

from prometheus_client import (
    CONTENT_TYPE_LATEST,
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    disable_created_metrics,
    generate_latest,
)
from prometheus_client.metrics_core import Metric

from cllm.core.protocol import EngineStats, PrefixCacheStats

# No *_created series: they double the output and say nothing a restart counter does not.
disable_created_metrics()

TOKEN_RATE_WINDOW = 60.0  # seconds

# Buckets span a small model on a GPU to a large one on a few CPU cores: steps of 5 ms to
# 2.5 s, first tokens within 25 ms to 30 s, 5 ms to 1 s per token, batches of 1-64 sequences.
STEP_BUCKETS = (0.005, 0.01, 0.02, 0.03, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.5, 1.0, 2.5)
TTFT_BUCKETS = (0.025, 0.05, 0.1, 0.2, 0.3, 0.5, 0.75, 1.0, 1.5, 2.0, 3.0, 5.0, 10.0, 30.0)
TPOT_BUCKETS = (0.005, 0.01, 0.015, 0.02, 0.03, 0.04, 0.05, 0.075, 0.1, 0.15, 0.25, 0.5, 1.0)
E2E_BUCKETS = (0.1, 0.25, 0.5, 1.0, 2.0, 3.0, 5.0, 10.0, 20.0, 30.0, 60.0, 120.0, 300.0)
BATCH_BUCKETS = (1, 2, 4, 8, 12, 16, 24, 32, 48, 64, 128, 256)
DRAFT_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512)
LOAD_BUCKETS = (0.25, 0.5, 1.0, 2.0, 5.0, 10.0, 30.0, 60.0, 120.0)
ENGINE = ("model", "replica")
M = TypeVar("M", Counter, Gauge, Histogram)


class Family(Generic[M]):
    """One Prometheus family, declared on Metrics as data; each Metrics makes its own in its registry."""

    def __init__(self, kind: type[M], name: str, doc: str, labels: Sequence[str] = (), buckets: Sequence[float] = ()):
        self.kind: type[M] = kind
        self.name, self.doc, self.labels, self.buckets = name, doc, labels, buckets
        self.attr = ""

    def __set_name__(self, owner: type, attr: str) -> None:
        self.attr = attr

    def __get__(self, metrics: object, owner: type | None = None) -> M:
        # Metrics.__init__ puts the family's metric in the instance, which is what an attribute read finds.
        return vars(metrics)[self.attr]

    def make(self, registry: CollectorRegistry) -> M:
        extra: dict[str, Any] = {"buckets": self.buckets} if self.buckets else {}
        return self.kind(self.name, self.doc, self.labels, registry=registry, **extra)


class Metrics:
    content_type = CONTENT_TYPE_LATEST  # of exposition()

    # attribute = Family(kind, name, help, labels, buckets): registered in this order, /metrics lists them so.
    requests = Family(Counter, "cllm_requests_total", "HTTP responses, by route and status", ("route", "status"))
    running = Family(Gauge, "cllm_requests_running", "Sequences the engine is decoding", ENGINE)
    waiting = Family(Gauge, "cllm_requests_waiting", "Requests waiting for a free engine slot", ENGINE)
    threads = Family(
        Gauge,
        "cllm_engine_threads",
        "llama.cpp threads the engine decodes on now: fewer than set while other programs take its CPUs",
        ENGINE,
    )
    prompt_tokens = Family(Counter, "cllm_prompt_tokens_total", "Prompt tokens of requests that reached the engine")
    generation_tokens = Family(
        Counter, "cllm_generation_tokens_total", "Tokens generated for requests, as their usage says"
    )
    reranked = Family(Counter, "cllm_reranked_documents_total", "Documents scored by the rerank routes", ("model",))
    lora_requests = Family(
        Counter, "cllm_lora_requests_total", "Requests decoded under each LoRA adapter", ("model", "adapter")
    )
    ttft = Family(
        Histogram,
        "cllm_time_to_first_token_seconds",
        "From a request's arrival to its first token",
        buckets=TTFT_BUCKETS,
    )
    tpot = Family(
        Histogram,
        "cllm_time_per_output_token_seconds",
        "Mean time between a request's outputs after the first",
        buckets=TPOT_BUCKETS,
    )
    e2e = Family(
        Histogram,
        "cllm_e2e_request_latency_seconds",
        "From a request's arrival to the end of its response",
        buckets=E2E_BUCKETS,
    )
    step = Family(
        Histogram,
        "cllm_engine_step_seconds",
        "Engine steps: schedule, one llama_decode, sample",
        ENGINE,
        buckets=STEP_BUCKETS,
    )
    batch = Family(Histogram, "cllm_batch_size", "Sequences in one engine step", ENGINE, buckets=BATCH_BUCKETS)
    kv_usage = Family(Gauge, "cllm_kv_cache_usage_ratio", "KV cells held by running sequences / all KV cells", ENGINE)
    cache_hit_tokens = Family(
        Counter, "cllm_prefix_cache_hit_tokens_total", "Prompt tokens whose KV cells came from the prefix cache", ENGINE
    )
    cache_lookups = Family(
        Counter,
        "cllm_prefix_cache_lookups_total",
        "Prefix cache lookups, one per admitted request, by result",
        (*ENGINE, "result"),
    )
    cache_cells = Family(Gauge, "cllm_prefix_cache_cells", "KV cells held by the prefix cache in KV streams", ENGINE)
    cache_restored = Family(
        Counter, "cllm_prefix_cache_restored_total", "Prefix cache hits served from host RAM (--cache-ram)", ENGINE
    )
    cache_host_bytes = Family(
        Gauge, "cllm_prefix_cache_host_bytes", "Host RAM held by the prefix cache's entries", ENGINE
    )
    cache_disk_hits = Family(
        Counter, "cllm_prefix_cache_disk_hits_total", "Prefix cache hits served from files (--cache-dir)", ENGINE
    )
    cache_disk_entries = Family(
        Gauge, "cllm_prefix_cache_disk_entries", "Prefix cache entries in files (--cache-dir)", ENGINE
    )
    cache_disk_bytes = Family(
        Gauge, "cllm_prefix_cache_disk_bytes", "Bytes of the prefix cache's entries in files (--cache-dir)", ENGINE
    )
    cache_disk_load_seconds = Family(
        Counter,
        "cllm_prefix_cache_disk_load_seconds",
        "Time spent reading files for prefix cache hits (--cache-dir)",
        ENGINE,
    )
    cache_disk_rejected = Family(
        Counter,
        "cllm_prefix_cache_disk_rejected_total",
        "Prefix cache files dropped as damaged or not of this format (--cache-dir): removed, their cells never used",
        ENGINE,
    )
    drafted = Family(
        Counter, "cllm_spec_drafted_tokens_total", "Tokens drafted by speculative decoding and verified", ENGINE
    )
    accepted = Family(
        Counter,
        "cllm_spec_accepted_tokens_total",
        "Drafted tokens the sampler agreed with: each saved a decode step",
        ENGINE,
    )
    # llama-server's names for the same counts (tools/server/server-task.cpp), for its dashboards and scrapers.
    spec_tokens = Family(Counter, "llamacpp:spec_decode_num_draft_tokens", "Speculative draft tokens generated", ENGINE)
    spec_accepted = Family(
        Counter, "llamacpp:spec_decode_num_accepted_tokens", "Speculative draft tokens accepted", ENGINE
    )
    spec_drafts = Family(
        Counter,
        "llamacpp:spec_decode_num_drafts",
        "Speculative drafts verified: one a sequence a step that drafted",
        ENGINE,
    )
    step_drafted = Family(
        Histogram,
        "cllm_spec_step_drafted_tokens",
        "Tokens drafted in one engine step, of steps that drafted",
        ENGINE,
        buckets=DRAFT_BUCKETS,
    )
    step_accepted = Family(
        Histogram,
        "cllm_spec_step_accepted_tokens",
        "Drafted tokens accepted in one engine step, of steps that drafted",
        ENGINE,
        buckets=(0, *DRAFT_BUCKETS),
    )
    decode_steps = Family(
        Counter, "cllm_decode_steps_total", "llama_decode calls of decoding sequences' tokens", ENGINE
    )
    reused_steps = Family(
        Counter,
        "cllm_decode_steps_graph_reused_total",
        "Decode steps that reused the step before's compute graph (llama.cpp)",
        ENGINE,
    )
    restarts = Family(Counter, "cllm_engine_restarts_total", "Engines started after the first", ENGINE)
    loads = Family(Counter, "cllm_model_loads_total", "Models loaded, by result (ok, failed)", ("model", "result"))
    load_seconds = Family(
        Histogram,
        "cllm_model_load_seconds",
        "From asking for a model's engines to all of them serving",
        ("model",),
        buckets=LOAD_BUCKETS,
    )
    unloads = Family(Counter, "cllm_model_unloads_total", "Models unloaded, by reason", ("model", "reason"))
    wake_seconds = Family(
        Histogram,
        "cllm_model_wake_seconds",
        "From a request reaching a sleeping model (--sleep-idle-seconds) to its engines serving again",
        ("model",),
        buckets=LOAD_BUCKETS,
    )

    def __init__(self):
        self.registry = CollectorRegistry()
        for attr, family in vars(Metrics).items():
            if isinstance(family, Family):
                vars(self)[attr] = family.make(self.registry)
        self._engines: dict[tuple[str, str], _EngineSeen] = {}
        self.token_rates: dict[tuple[str, str], TokenRate] = {}

    def engine_ready(self, now: float, generation: int, model: str = "", replica: int = 0) -> None:
        """An engine answered; ``generation`` counts the engines of its slot started before it."""
        key = (model, str(replica))
        seen = self._engines.get(key)
        if seen is None:
            seen = self._engines[key] = _EngineSeen()
            for result in ("hit", "miss"):
                self.cache_lookups.labels(*key, result)  # both series exist from the start, at 0
            for counter in (self.drafted, self.accepted, self.spec_tokens, self.spec_accepted, self.spec_drafts):
                counter.labels(*key)
            self.decode_steps.labels(*key)
            self.reused_steps.labels(*key)
            self.restarts.labels(*key)
        if generation > seen.restarts:
            self.restarts.labels(*key).inc(generation - seen.restarts)
            seen.restarts = generation
        self.token_rates.setdefault(key, TokenRate(TOKEN_RATE_WINDOW)).restart(now)
        seen.cache = PrefixCacheStats()  # a new engine counts from zero
        seen.drafted = seen.accepted = seen.drafts = seen.decode_steps = seen.reused_steps = 0

    def engine_stats(self, stats: EngineStats, kv_total: int, now: float, model: str = "", replica: int = 0) -> None:
        key = (model, str(replica))
        self.running.labels(*key).set(stats.running)
        self.waiting.labels(*key).set(stats.waiting)
        self.threads.labels(*key).set(stats.threads)
        self.kv_usage.labels(*key).set(stats.kv_used / kv_total)
        step, batch = self.step.labels(*key), self.batch.labels(*key)
        for seconds in stats.step_seconds:
            step.observe(seconds)
        for size in stats.batch_sizes:
            batch.observe(size)
        self.token_rates[key].add(now, stats.generated_tokens)
        seen = self._engines[key]
        cache, last = stats.prefix_cache, seen.cache
        self.cache_lookups.labels(*key, "hit").inc(cache.hits - last.hits)
        self.cache_lookups.labels(*key, "miss").inc(cache.misses - last.misses)
        self.cache_hit_tokens.labels(*key).inc(cache.hit_tokens - last.hit_tokens)
        self.cache_cells.labels(*key).set(cache.cells)
        self.cache_restored.labels(*key).inc(cache.restored - last.restored)
        self.cache_host_bytes.labels(*key).set(cache.host_bytes)
        self.cache_disk_hits.labels(*key).inc(cache.disk_hits - last.disk_hits)
        self.cache_disk_entries.labels(*key).set(cache.disk_entries)
        self.cache_disk_bytes.labels(*key).set(cache.disk_bytes)
        self.cache_disk_load_seconds.labels(*key).inc(max(0.0, cache.disk_load_seconds - last.disk_load_seconds))
        self.cache_disk_rejected.labels(*key).inc(cache.disk_rejected - last.disk_rejected)
        seen.cache = cache
        drafted, accepted = stats.drafted_tokens - seen.drafted, stats.accepted_tokens - seen.accepted
        self.drafted.labels(*key).inc(drafted)
        self.accepted.labels(*key).inc(accepted)
        self.spec_tokens.labels(*key).inc(drafted)
        self.spec_accepted.labels(*key).inc(accepted)
        self.spec_drafts.labels(*key).inc(stats.drafts - seen.drafts)
        seen.drafted, seen.accepted, seen.drafts = stats.drafted_tokens, stats.accepted_tokens, stats.drafts
        self.decode_steps.labels(*key).inc(stats.decode_steps - seen.decode_steps)
        self.reused_steps.labels(*key).inc(stats.reused_steps - seen.reused_steps)
        seen.decode_steps, seen.reused_steps = stats.decode_steps, stats.reused_steps
        drafted, accepted = self.step_drafted.labels(*key), self.step_accepted.labels(*key)
        for n in stats.step_drafted:
            drafted.observe(n)
        for n in stats.step_accepted:
            accepted.observe(n)

    def engine_gone(self, model: str, replica: int) -> None:
        """A model was unloaded: its engine's gauges go (its counters stay, as counters do)."""
        key = (model, str(replica))
        for gauge in (self.running, self.waiting, self.threads, self.kv_usage, self.cache_cells):
            try:
                gauge.remove(*key)
            except KeyError:
                pass
        self.token_rates.pop(key, None)

    def token_rate(self, now: float) -> float:
        """Tokens per second over the last minute, all engines together."""
        return sum(rate.rate(now) for rate in self.token_rates.values())

    def request_done(self, route: str, status: int, t_start: float, t_end: float, generations: list) -> None:
        """One HTTP exchange is over, with the Generations it started (usually none or one)."""
        self.requests.labels(route, str(status)).inc()
        for gen in generations:
            self.e2e.observe(t_end - t_start)
            self.prompt_tokens.inc(gen.prompt_tokens)
            self.generation_tokens.inc(gen.completion_tokens)
            for choice in gen.choices:
                stream = choice.stream
                if stream.t_first is not None:
                    self.ttft.observe(stream.t_first - t_start)
                per_output = stream.time_per_output()
                if per_output is not None:
                    self.tpot.observe(per_output)

    def exposition(self, model: str | None = None) -> bytes:
        """Every series, or (`/metrics?model=`, as llama-server's router answers one model's figures) the series
        labelled with that model: the server-wide families (requests, tokens, latencies) have no model label."""
        return generate_latest(self.registry if model is None else _OneModel(self.registry, model))


class _OneModel:
    """A registry's families as one model's series: samples of other models, and unlabelled ones, left out."""

    def __init__(self, registry: CollectorRegistry, model: str):
        self.registry, self.model = registry, model

    def collect(self) -> Iterator[Metric]:
        for family in self.registry.collect():
            samples = [s for s in family.samples if s.labels.get("model") == self.model]
            if samples:
                mine = copy.copy(family)
                mine.samples = samples
                yield mine


class _EngineSeen:
    """An engine slot's running counts as last reported: the counters move by their differences."""

    __slots__ = ("restarts", "cache", "drafted", "accepted", "drafts", "decode_steps", "reused_steps")

    def __init__(self):
        self.restarts = 0
        self.cache = PrefixCacheStats()
        self.drafted = self.accepted = self.drafts = self.decode_steps = self.reused_steps = 0


class TokenRate:
    """Tokens per second over a sliding window, from the engine's running count of generated tokens."""

    def __init__(self, window: float):
        self.window = window
        self._samples: deque[tuple[float, int]] = deque()  # (monotonic time, tokens so far)

    def restart(self, now: float) -> None:
        """A new engine: its count starts from zero."""
        self._samples.clear()
        self._samples.append((now, 0))

    def add(self, now: float, total: int) -> None:
        samples = self._samples
        samples.append((now, total))
        # Keep one sample at or before the window's start: the count to subtract.
        while len(samples) > 1 and samples[1][0] <= now - self.window:
            samples.popleft()

    def rate(self, now: float) -> float:
        if not self._samples:
            return 0.0
        first = base = self._samples[0]
        for sample in self._samples:
            if sample[0] > now - self.window:
                break
            base = sample
        span = min(self.window, now - first[0])
        return (self._samples[-1][1] - base[1]) / span if span > 0 else 0.0
