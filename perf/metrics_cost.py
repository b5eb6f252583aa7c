"""The cost of metrics on throughput: one server, the same load without then with a /metrics scraper.

Metrics are always recorded, so what can be switched off is the scraping:
this runs N requests x G tokens at concurrency C against one server, without
and with a client fetching /metrics every second, for R rounds in the order
ABBA... (so a shared machine's drift does not land on one side only). Usage:
    .venv/bin/python -m perf.metrics_cost [--model PATH] [--requests 64] [--rounds 2] [--concurrency 32] [--gen-tokens
    50]
"""

from __future__ import annotations

import argparse
import os
import re
import statistics
import threading
import time
from dataclasses import dataclass, field

import httpx

from cllm.bench import dialects, http_load
from cllm.core.model_file import resolve_model
from perf import servers


class Scraper(threading.Thread):
    """GET /metrics every ``interval`` seconds until stopped; keeps each scrape's time."""

    def __init__(self, url: str, interval: float):
        super().__init__(daemon=True)
        self.url, self.interval = url, interval
        self.stopping = threading.Event()
        self.seconds: list[float] = []

    def run(self) -> None:
        with httpx.Client(base_url=self.url, timeout=30) as client:
            while not self.stopping.wait(self.interval):
                t = time.perf_counter()
                client.get("/metrics").raise_for_status()
                self.seconds.append(time.perf_counter() - t)


@dataclass
class Tally:
    tokens: int = 0
    seconds: float = 0.0
    errors: int = 0
    cpu: dict[str, float] = field(default_factory=dict)  # CPU seconds by process role

    def run(self, url: str, args, pid: int) -> None:
        cell = http_load.run_cell(
            url,
            dialects.make_dialect("cllm"),
            args.concurrency,
            args.requests,
            26,
            args.gen_tokens,
            False,
            [pid],
            progress=False,
        )
        self.tokens += cell["generated_tokens"]
        self.seconds += cell["seconds"]
        self.errors += cell["errors"]
        for role, seconds in cell["cpu_seconds"].items():
            self.cpu[role] = self.cpu.get(role, 0.0) + seconds


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model")
    ap.add_argument("--requests", type=int, default=64, help="per run")
    ap.add_argument("--rounds", type=int, default=2, help="pairs of runs, one without and one with scraping")
    ap.add_argument("--concurrency", type=int, default=32)
    ap.add_argument("--gen-tokens", type=int, default=50)
    ap.add_argument("--threads", type=int, default=os.cpu_count())
    args = ap.parse_args()
    model = resolve_model(args.model)

    plain, scraped = Tally(), Tally()
    scrapes: list[float] = []
    settings = servers.Settings(model, args.threads, args.concurrency, seq_ctx=256)
    with servers.start("cllm", settings) as server:
        http_load.warm_up(server.url, dialects.make_dialect("cllm"), args.concurrency)
        for i in range(2 * args.rounds):
            if i % 4 in (0, 3):
                plain.run(server.url, args, server.proc.pid)
                continue
            scraper = Scraper(server.url, 1.0)
            scraper.start()
            scraped.run(server.url, args, server.proc.pid)
            scraper.stopping.set()
            scraper.join(30)
            scrapes += scraper.seconds

    name = re.sub(r"\.gguf$", "", os.path.basename(model))
    print(
        f"{name}: {args.rounds} x 2 runs of {args.requests} requests x {args.gen_tokens} tokens, concurrency "
        f"{args.concurrency}, {args.threads} threads"
    )
    for label, t in (("no scraping", plain), ("/metrics every 1 s", scraped)):
        print(
            f"  {label:18} : {t.tokens / t.seconds:7.1f} tok/s  ({t.tokens} tokens in {t.seconds:.1f} s, {t.errors} "
            "errors;"
            f" CPU: frontend {t.cpu['frontend'] / t.seconds * 1e3:.0f} ms/s, engine "
            f"{t.cpu['engine'] / t.seconds * 1e3:.0f} ms/s,"
            f" {t.tokens / t.cpu['engine']:.1f} tokens per engine CPU second)"
        )
    if scrapes:
        print(
            f"  scrapes            : {len(scrapes)}, median {statistics.median(scrapes) * 1e3:.1f} ms, max "
            f"{max(scrapes) * 1e3:.1f} ms"
        )
    print(f"  ratio              : {(scraped.tokens / scraped.seconds) / (plain.tokens / plain.seconds):.3f}")


if __name__ == "__main__":
    main()
