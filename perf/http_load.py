"""HTTP load on cLLM's /generate: N requests at concurrency C, G tokens each."""

from __future__ import annotations

import asyncio
import time

import httpx


async def _load(url: str, prompts: list[str], concurrency: int, gen_tokens: int) -> dict:
    queue = list(reversed(prompts))
    latencies: list[float] = []
    generated = 0
    errors = 0

    async def worker(client: httpx.AsyncClient) -> None:
        nonlocal generated, errors
        while queue:
            prompt = queue.pop()
            t = time.perf_counter()
            r = await client.post("/generate", json={"prompt": prompt, "max_tokens": gen_tokens, "ignore_eos": True, "temperature": 0})
            latencies.append(time.perf_counter() - t)
            if r.status_code == 200:
                generated += r.json()["data"]["generated_tokens"]
            else:
                errors += 1

    limits = httpx.Limits(max_connections=concurrency)
    async with httpx.AsyncClient(base_url=url, timeout=600, limits=limits) as client:
        t0 = time.perf_counter()
        await asyncio.gather(*(worker(client) for _ in range(concurrency)))
        elapsed = time.perf_counter() - t0
    latencies.sort()
    return {
        "requests": len(prompts),
        "errors": errors,
        "generated_tokens": generated,
        "seconds": elapsed,
        "tokens_per_second": generated / elapsed,
        "latency_p50": latencies[len(latencies) // 2],
    }


def run_load(url: str, prompts: list[str], concurrency: int, gen_tokens: int) -> dict:
    return asyncio.run(_load(url, prompts, concurrency, gen_tokens))
