"""Soak: many requests, streaming and not, some clients hanging up; nothing may be lost or leak.

Every request must end in exactly one way: a complete answer (a 200 with its
text, or a stream whose last event is `done` with a finish reason), one error
(an HTTP error status, or a stream whose last event carries the error), or a
hang-up the client chose. Anything else (a stream cut short, a connection
error, a second answer) is a lost request. Afterwards the engine must run
nothing, and the RSS of engine and frontend must not grow from the first
`--baseline` requests to the end. Usage:
    .venv/bin/python -m perf.soak [--requests 2000] [--concurrency 64] [--parallel 16] [--max-waiting N]
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import json
import os
import random
import time

import httpx
import psutil

from cllm.bench import http_load
from cllm.bench.prompts import make_prompts
from cllm.core.model_file import resolve_model
from perf import servers

HANG_UP = 0.1  # share of clients that hang up mid-way
STREAM = 0.5  # share of streaming requests


async def one(client: httpx.AsyncClient, prompt: str, rng: random.Random) -> str:
    """How the request ended: "ok", "error <what>", "hung up" or "lost: <why>"."""
    body = {"prompt": prompt, "max_tokens": rng.randint(4, 64), "temperature": rng.choice((0, 0.8))}
    patience = rng.uniform(0.05, 1.0) if rng.random() < HANG_UP else None
    try:
        if rng.random() < STREAM:
            return await _stream(client, body, patience is not None, rng)
        try:
            r = await asyncio.wait_for(client.post("/generate", json=body), patience)
        except asyncio.TimeoutError:
            return "hung up"
        if r.status_code != 200:
            return (
                f"error {r.status_code}" if r.json().get("success") is False else f"lost: bad error body {r.text[:80]}"
            )
        data = r.json()["data"]
        return (
            "ok"
            if _complete(data["generated_tokens"], data["finish_reason"], body)
            else f"lost: incomplete answer {data}"
        )
    except httpx.HTTPError as e:
        return f"lost: {type(e).__name__}"


async def _stream(client: httpx.AsyncClient, body: dict, hang_up: bool, rng: random.Random) -> str:
    events = []
    async with client.stream("POST", "/generate_stream", json=body) as r:
        if r.status_code != 200:
            await r.aread()
            return f"error {r.status_code}" if r.json().get("success") is False else "lost: bad error body"
        async for line in r.aiter_lines():
            if line.startswith("data: "):
                events.append(json.loads(line[6:]))
                if hang_up and len(events) >= rng.randint(1, 4):
                    return "hung up"
    if not events or not events[-1]["done"] or any(e["done"] for e in events[:-1]):
        return "lost: stream without exactly one last event"
    last = events[-1]
    if "error" in last:
        return f"error {last['error']}"
    return "ok" if _complete(last["generated_tokens"], last["finish_reason"], body) else f"lost: bad last event {last}"


def _complete(generated: int, finish: str, body: dict) -> bool:
    return (finish == "stop" and generated < body["max_tokens"]) or (
        finish == "length" and generated == body["max_tokens"]
    )


def rss_mib(proc: psutil.Process) -> float:
    return proc.memory_info().rss / 2**20


async def soak(url: str, prompts: list[str], concurrency: int, procs: dict[str, psutil.Process], baseline: int) -> dict:
    outcomes: collections.Counter = collections.Counter()
    rss: dict[str, dict[str, float]] = {}
    queue = list(reversed(prompts))
    done = 0
    rng = random.Random(7)

    async def worker(client: httpx.AsyncClient) -> None:
        nonlocal done
        while queue:
            outcome = await one(client, queue.pop(), rng)
            outcomes[outcome] += 1
            if outcome == "error 429":
                await asyncio.sleep(1)  # as its Retry-After says
            done += 1
            if done == baseline:
                rss["first"] = {name: rss_mib(p) for name, p in procs.items()}

    limits = httpx.Limits(max_connections=concurrency)
    async with httpx.AsyncClient(base_url=url, timeout=600, limits=limits) as client:
        t0 = time.perf_counter()
        await asyncio.gather(*(worker(client) for _ in range(concurrency)))
        elapsed = time.perf_counter() - t0
        # The engine's running count returns to zero once nothing is in flight.
        for _ in range(300):
            queue_state = (await client.get("/health", params={"level": "detailed"})).json()["data"]["queue"]
            if queue_state == {"in_flight": 0, "running": 0, "waiting": 0}:
                break
            await asyncio.sleep(0.1)
    rss["last"] = {name: rss_mib(p) for name, p in procs.items()}
    return {"outcomes": outcomes, "seconds": elapsed, "rss": rss, "queue_after": queue_state}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model")
    ap.add_argument("--requests", type=int, default=2000)
    ap.add_argument("--concurrency", type=int, default=64)
    ap.add_argument("--parallel", type=int, default=16)
    ap.add_argument(
        "--max-waiting", type=int, help="below concurrency - parallel, some requests get 429 (default: the server's)"
    )
    ap.add_argument("--baseline", type=int, default=200, help="requests done when the first RSS figures are taken")
    ap.add_argument("--threads", type=int, default=os.cpu_count())
    args = ap.parse_args()

    extra = ("--max-waiting", str(args.max_waiting)) if args.max_waiting is not None else ()
    settings = servers.Settings(resolve_model(args.model), args.threads, args.parallel, seq_ctx=512)
    with servers.start("cllm", settings, args=extra) as server:
        procs = {http_load.role(p): p for p in psutil.Process(server.proc.pid).children()}
        result = asyncio.run(soak(server.url, make_prompts(args.requests), args.concurrency, procs, args.baseline))

    outcomes = result["outcomes"]
    lost = sum(n for k, n in outcomes.items() if k.startswith("lost"))
    print(
        f"{args.requests} requests at concurrency {args.concurrency}, --parallel {args.parallel} {' '.join(extra)}: "
        f"{result['seconds']:.0f} s"
    )
    for outcome, n in sorted(outcomes.items()):
        print(f"  {outcome:<40} {n:6d}")
    print(f"  lost requests: {lost}")
    print(f"  engine queue afterwards: {result['queue_after']}")
    for name in ("engine", "frontend"):
        first, last = result["rss"]["first"][name], result["rss"]["last"][name]
        print(
            f"  RSS {name:<8}: {first:7.1f} MiB after {args.baseline} requests, {last:7.1f} MiB at the end "
            f"({last - first:+.1f})"
        )


if __name__ == "__main__":
    main()
