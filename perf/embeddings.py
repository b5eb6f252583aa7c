"""Embeddings: cllm against llama-server --embeddings, and what an embeddings load costs generation.

(a) Throughput: 256 inputs of ~64 tokens, in requests of 32 inputs sent 8 at
once, to cllm and to llama-server started with --embeddings (mean pooling,
cllm's choice for a GGUF that names none) on the same GGUF and threads, taking
turns for R rounds. (b) On cllm: 8 streaming generations of G tokens at once,
alone and with a client sending 32-input embeddings requests back to back
meanwhile; their tok/s, and the inputs/s embedded beside them. Usage:
    .venv/bin/python -m perf.embeddings [--model PATH] [--rounds 1] [--gen-tokens 128]
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import time

import httpx

from perf import servers

WORDS = "river mill bridge lantern orchard harbor meadow quarry violin glacier compass ember thistle canyon".split()


def texts(n: int) -> list[str]:
    """n distinct passages of ~64 tokens each."""
    return [f"Passage {i}: " + " ".join(WORDS[(i * 7 + j * 3) % len(WORDS)] for j in range(56)) for i in range(n)]


async def embed_all(url: str, inputs: list[str], batch: int, concurrency: int) -> float:
    """Inputs per second, the inputs sent in requests of `batch`, `concurrency` at a time."""
    chunks = [inputs[i : i + batch] for i in range(0, len(inputs), batch)]
    queue: asyncio.Queue = asyncio.Queue()
    for c in chunks:
        queue.put_nowait(c)
    async with httpx.AsyncClient(base_url=url, timeout=1800) as http:

        async def worker():
            while not queue.empty():
                chunk = queue.get_nowait()
                r = await http.post("/v1/embeddings", json={"input": chunk, "model": "any"})
                r.raise_for_status()
                assert len(r.json()["data"]) == len(chunk)

        t = time.perf_counter()
        await asyncio.gather(*(worker() for _ in range(concurrency)))
        return len(inputs) / (time.perf_counter() - t)


async def generations(url: str, n: int, gen_tokens: int, load: bool) -> tuple[float, float]:
    """(tok/s of n streaming generations at once, inputs/s embedded meanwhile by a load client; 0 without)."""
    body = {
        "prompt": "Once upon a time",
        "max_tokens": gen_tokens,
        "temperature": 0,
        "stream": True,
        "ignore_eos": True,
    }
    done = asyncio.Event()
    embedded = 0
    async with httpx.AsyncClient(base_url=url, timeout=1800) as http:

        async def stream() -> int:
            tokens = 0
            async with http.stream("POST", "/v1/completions", json=body) as r:
                async for line in r.aiter_lines():
                    if line.startswith("data: {"):
                        tokens += 1
            return tokens - 1  # a chunk a token, then the one with finish_reason

        async def embed_load():
            nonlocal embedded
            batch = texts(32)
            while not done.is_set():
                r = await http.post("/v1/embeddings", json={"input": batch})
                r.raise_for_status()
                embedded += len(batch)

        loader = asyncio.create_task(embed_load()) if load else None
        if load:
            await asyncio.sleep(1.0)  # the load is running when the generations start
        t = time.perf_counter()
        counts = await asyncio.gather(*(stream() for _ in range(n)))
        elapsed = time.perf_counter() - t
        done.set()
        if loader is not None:
            await loader
        assert all(c == gen_tokens for c in counts), counts
        return sum(counts) / elapsed, embedded / elapsed


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    servers.add_arguments(ap, seq_ctx=1024)
    ap.add_argument("--rounds", type=int, default=1)
    ap.add_argument("--gen-tokens", type=int, default=128)
    args = ap.parse_args()
    settings = servers.settings_of(args)
    inputs = texts(256)
    rates: dict[str, list[float]] = {"cllm": [], "llama-server": []}
    with (
        servers.start("cllm", settings) as cllm,
        servers.start(
            "llama-server", settings, args=("--embeddings", "--pooling", "mean"), label="llama-server-embeddings"
        ) as peer,
    ):
        for url in (cllm.url, peer.url):  # warm-up
            asyncio.run(embed_all(url, inputs[:8], 8, 1))
        for _ in range(args.rounds):
            for name, server in (("cllm", cllm), ("llama-server", peer)):
                rates[name].append(asyncio.run(embed_all(server.url, inputs, 32, 8)))
        peer.stop()  # (b) is cllm's alone
        ours, theirs = statistics.median(rates["cllm"]), statistics.median(rates["llama-server"])
        print(
            f"(a) 256 inputs of ~64 tokens, 32 a request, 8 requests at once, {args.rounds} round(s), {args.threads} "
            "threads:"
        )
        print(
            f"    cllm {ours:.1f} inputs/s, llama-server --embeddings {theirs:.1f} inputs/s, ratio {ours / theirs:.2f}",
            flush=True,
        )
        alone, _ = asyncio.run(generations(cllm.url, 8, args.gen_tokens, load=False))
        loaded, beside = asyncio.run(generations(cllm.url, 8, args.gen_tokens, load=True))
    print(f"(b) 8 streaming generations of {args.gen_tokens} tokens on cllm:")
    print(
        f"    alone {alone:.1f} tok/s; beside an embeddings load {loaded:.1f} tok/s ({loaded / alone:.2f}x),"
        f" while {beside:.1f} inputs/s were embedded"
    )


if __name__ == "__main__":
    main()
