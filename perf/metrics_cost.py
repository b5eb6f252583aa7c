"""The cost of metrics on throughput: one server, the same load without then with a /metrics scraper.

Metrics are always recorded, so what can be switched off is the scraping:
this runs N requests x G tokens at concurrency C against one server, without
and with a client fetching /metrics every second, for R rounds in the order
ABBA... (so a shared machine's drift does not land on one side only). Usage:
    .venv/bin/python -m perf.metrics_cost [--model PATH] [--requests 64] [--rounds 2] [--concurrency 32] [--gen-tokens 50]
"""

from __future__ import annotations

import argparse
import os
import re
import statistics
import threading
import time
from dataclasses import dataclass

import httpx
import psutil

from cllm.model_file import resolve_model
from perf.http_load import run_load
from perf.prompts import make_prompts
from perf.quick import serve


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
    frontend_cpu: float = 0.0  # CPU seconds the frontend process used
    engine_cpu: float = 0.0

    def run(self, url: str, args, children: dict[str, psutil.Process]) -> None:
        cpu = {name: sum(p.cpu_times()[:2]) for name, p in children.items()}
        run = run_load(url, make_prompts(args.requests), args.concurrency, args.gen_tokens)
        self.frontend_cpu += sum(children["frontend"].cpu_times()[:2]) - cpu["frontend"]
        self.engine_cpu += sum(children["engine"].cpu_times()[:2]) - cpu["engine"]
        self.tokens += run["generated_tokens"]
        self.seconds += run["seconds"]
        self.errors += run["errors"]


def server_children(proc) -> dict[str, psutil.Process]:
    children = psutil.Process(proc.pid).children()
    return {name: next(p for p in children if f"{name}_proc" in " ".join(p.cmdline())) for name in ("frontend", "engine")}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model")
    ap.add_argument("--requests", type=int, default=64, help="per run")
    ap.add_argument("--rounds", type=int, default=2, help="pairs of runs, one without and one with scraping")
    ap.add_argument("--concurrency", type=int, default=32)
    ap.add_argument("--gen-tokens", type=int, default=50)
    ap.add_argument("--threads", type=int, default=os.cpu_count())
    ap.add_argument("--port", type=int, default=18081)
    args = ap.parse_args()
    model = resolve_model(args.model)
    url = f"http://127.0.0.1:{args.port}"

    plain, scraped = Tally(), Tally()
    scrapes: list[float] = []
    proc = serve(model, args.port, args.concurrency, args.threads)
    try:
        run_load(url, make_prompts(args.concurrency), args.concurrency, 5)  # warm-up
        children = server_children(proc)
        for i in range(2 * args.rounds):
            if i % 4 in (0, 3):
                plain.run(url, args, children)
                continue
            scraper = Scraper(url, 1.0)
            scraper.start()
            scraped.run(url, args, children)
            scraper.stopping.set()
            scraper.join(30)
            scrapes += scraper.seconds
    finally:
        proc.terminate()
        proc.wait(60)

    name = re.sub(r"\.gguf$", "", os.path.basename(model))
    print(f"{name}: {args.rounds} x 2 runs of {args.requests} requests x {args.gen_tokens} tokens, concurrency {args.concurrency}, {args.threads} threads")
    for label, t in (("no scraping", plain), ("/metrics every 1 s", scraped)):
        print(
            f"  {label:18} : {t.tokens / t.seconds:7.1f} tok/s  ({t.tokens} tokens in {t.seconds:.1f} s, {t.errors} errors;"
            f" CPU: frontend {t.frontend_cpu / t.seconds * 1e3:.0f} ms/s, engine {t.engine_cpu / t.seconds * 1e3:.0f} ms/s,"
            f" {t.tokens / t.engine_cpu:.1f} tokens per engine CPU second)"
        )
    if scrapes:
        print(f"  scrapes            : {len(scrapes)}, median {statistics.median(scrapes) * 1e3:.1f} ms, max {max(scrapes) * 1e3:.1f} ms")
    print(f"  ratio              : {(scraped.tokens / scraped.seconds) / (plain.tokens / plain.seconds):.3f}")


if __name__ == "__main__":
    main()
