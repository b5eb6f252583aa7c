"""Where one streamed request's time goes, cllm against llama-server, at c=1.

One stream of fresh short prompts (100 tokens each, ignore_eos), the two
servers taking turns round by round. For each it prints:
  - TTFT and the decode rate after the first token (medians), and tok/s end to end;
  - the serving CPU per token: the CPU time of every thread of the server but
    llama.cpp's two busiest (cllm: its frontend, supervisor and the engine's
    own bookkeeping threads; llama-server: its HTTP and slot threads);
  - llama_decode's own time per token: llama-server's `timings` against
    cllm's engine driven in this process, the same prompt, one after the other
    (a short one, and the ~700-token one of perf.chat_turns' repeat workload).
With llama.cpp's threads on every CPU, each millisecond of serving CPU is taken
from them, so the first two figures are what the last two add up to.
Usage:
    .venv/bin/python -m perf.stream_cost [--model PATH] [--rounds 4] [--requests 12]
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
from typing import Any

import httpx
import psutil

from cllm.bench.prompts import make_prompts
from cllm.core.config import ServeConfig
from cllm.core.protocol import SamplingParams, Submit
from perf import servers
from perf.chat_turns import SYSTEMS, alternate
from perf.prefix_cache import handbook, stream

COMPUTE_THREADS = 2  # llama.cpp's: the engine's main thread and its one OpenMP worker, with --threads 2


def thread_seconds(pid: int) -> dict[tuple[int, int], float]:
    """CPU seconds of every thread of the server's process tree, by (pid, tid)."""
    out = {}
    root = psutil.Process(pid)
    for proc in (root, *root.children(recursive=True)):
        try:
            for t in proc.threads():
                out[(proc.pid, t.id)] = t.user_time + t.system_time
        except psutil.Error:
            pass
    return out


def serving_seconds(before: dict, after: dict) -> float:
    """CPU seconds spent between the two snapshots by every thread but the busiest COMPUTE_THREADS."""
    spent = sorted((s - before.get(k, 0.0) for k, s in after.items()), reverse=True)
    return sum(spent[COMPUTE_THREADS:])


def streams(client: httpx.Client, prompts: list[str]) -> list:
    return [stream(client, "/v1/completions", {"prompt": p, "max_tokens": 100, "ignore_eos": True}) for p in prompts]


def decode_ms(model: str, threads: int, peer: httpx.Client, rounds: int, context: str) -> tuple[float, float]:
    """Median ms a token in llama_decode at c=1 after the prompt `context` + a round number: llama-server's own
    timings, and cllm's engine in this process."""
    from engine_proc.engine import LLMEngine
    from engine_proc.run import batch

    spent = [0.0]
    decode = batch.Batch.decode

    def timed(self, *args):
        t = time.perf_counter()
        decode(self, *args)
        spent[0] += time.perf_counter() - t

    batch.Batch.decode = timed  # type: ignore[method-assign]
    engine = LLMEngine(model, ServeConfig(parallel=8, ctx_size=8 * 4096, threads=threads))
    theirs, ours = [], []
    try:
        for r in range(rounds):
            prompt = f"{context} {r}"
            j = peer.post(
                "/completion",
                json={"prompt": prompt, "n_predict": 200, "ignore_eos": True, "temperature": 0, "cache_prompt": False},
            ).json()
            theirs.append(j["timings"]["predicted_per_token_ms"])
            tokens = peer.post("/tokenize", json={"content": prompt}).json()["tokens"]
            engine.add(Submit(r + 1, tokens, SamplingParams(max_tokens=200, temperature=0, ignore_eos=True)))
            # The prompt, in as many steps as the budget cuts it into: llama-server's figure leaves it out too.
            while not any(r.outputs for r in engine.step()):
                pass
            spent[0], n = 0.0, 0
            while engine.has_work():
                n += sum(len(r.outputs) for r in engine.step())
            ours.append(spent[0] / n * 1e3)
    finally:
        batch.Batch.decode = decode  # type: ignore[method-assign]
        engine.close()
    return statistics.median(theirs), statistics.median(ours)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    servers.add_arguments(ap, seq_ctx=4096)
    ap.add_argument("--rounds", type=int, default=4)
    ap.add_argument("--requests", type=int, default=12, help="requests a round")
    args = ap.parse_args()
    settings = servers.settings_of(args)
    got: dict[str, dict[str, Any]] = {
        s: {"ttft": [], "rate": [], "e2e": [], "serving": 0.0, "tokens": 0} for s in SYSTEMS
    }
    with (
        servers.start("cllm", settings) as cllm,
        servers.start("llama-server", settings) as peer,
        httpx.Client(base_url=cllm.url, timeout=300) as a,
        httpx.Client(base_url=peer.url, timeout=300) as b,
    ):
        clients = {"cllm": (a, cllm.proc.pid), "llama-server": (b, peer.proc.pid)}
        for client, _ in clients.values():
            streams(client, ["Warm up the graphs."])
        load0 = os.getloadavg()[0]
        for r, order in enumerate(alternate(args.rounds)):
            prompts = make_prompts(args.requests, 32, seed=1000 + r)
            for system in order:
                client, pid = clients[system]
                before = thread_seconds(pid)
                done = streams(client, prompts)
                g = got[system]
                g["serving"] += serving_seconds(before, thread_seconds(pid))
                for x in done:
                    g["ttft"].append(x.ttft)
                    g["rate"].append((x.completion_tokens - 1) / (x.seconds - x.ttft))
                    g["e2e"].append(x.completion_tokens / x.seconds)
                    g["tokens"] += x.completion_tokens
        decode = {
            name: decode_ms(settings.model, settings.threads, b, args.rounds, context)
            for name, context in (
                ("a short prompt", "Once upon a time, in a land far away, there lived a"),
                ("a ~700-token prompt", handbook(3, 32)[:3000]),
            )
        }
        load1 = os.getloadavg()[0]
    print(
        f"# {os.path.basename(settings.model)}, c=1, 100 tokens, {args.rounds} rounds of {args.requests}, "
        f"{settings.threads} threads; load average {load0:.1f} at the start, {load1:.1f} at the end\n"
    )
    print("| | TTFT median (ms) | decode tok/s (median) | end to end tok/s (median) | serving CPU ms/token |")
    print("|---|---|---|---|---|")
    for system, g in got.items():
        print(
            f"| {system} | {statistics.median(g['ttft']) * 1e3:.1f} | {statistics.median(g['rate']):.1f} "
            f"| {statistics.median(g['e2e']):.1f} | {g['serving'] / g['tokens'] * 1e3:.3f} |"
        )
    c, p = got["cllm"], got["llama-server"]
    print(
        f"| cllm ÷ llama-server | {statistics.median(c['ttft']) / statistics.median(p['ttft']):.3f} "
        f"| {statistics.median(c['rate']) / statistics.median(p['rate']):.3f} "
        f"| {statistics.median(c['e2e']) / statistics.median(p['e2e']):.3f} "
        f"| {c['serving'] / c['tokens'] / (p['serving'] / p['tokens']):.2f} |\n"
    )
    for name, (theirs, ours) in decode.items():
        print(
            f"llama_decode per token, 200 tokens after {name} (median of {args.rounds}): llama-server {theirs:.3f} ms, "
            f"cllm's engine {ours:.3f} ms ({ours / theirs:.3f}x)"
        )


if __name__ == "__main__":
    main()
