"""Several models and replicas: the figures the engine pool is judged by.

cold     time from the first request to a model that is not loaded to its first token, cllm's registry
         against llama-server's router mode (--models-dir), the same file, R rounds (unloaded in between)
routing  a multi-turn chat workload on 2 replicas: prefix-cache hit rate and time to first token with
         prefix-affinity routing against round robin
kv       how many sequences of one size fit in the same KV memory with f16 and q8_0 caches, and the
         throughput of each filled with that many clients

  python -m perf.pool_bench cold --model FILE [-r 3]
  python -m perf.pool_bench routing --model FILE [--conversations 8 --turns 4 -c 4]
  python -m perf.pool_bench kv --model FILE [--kv-mib 48]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import threading
import time
from typing import Any

import httpx

from cllm.bench.dialects import make_dialect
from cllm.bench.http_load import run_cell, warm_up
from perf import servers

QUESTIONS = (
    "What is a prime number?",
    "Give an example.",
    "Why does it matter?",
    "Say it in one line.",
    "And another?",
)
SYSTEM = "You are a patient tutor. " + " ".join(
    f"Guideline {i}: be brief, be exact, show one example." for i in range(30)
)


def _first_token_seconds(url: str, model: str, messages: list[dict], max_tokens: int) -> tuple[float, str]:
    """Stream a chat completion: seconds to the first content, and the whole text."""
    body = {"model": model, "messages": messages, "max_tokens": max_tokens, "temperature": 0, "stream": True}
    t0 = time.perf_counter()
    first, text = None, []
    with httpx.stream("POST", f"{url}/v1/chat/completions", json=body, timeout=600) as r:
        r.raise_for_status()
        for line in r.iter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            delta = json.loads(line[6:])["choices"]
            piece = delta[0]["delta"].get("content") if delta else None
            if piece:
                first = first or time.perf_counter() - t0
                text.append(piece)
    return first if first is not None else time.perf_counter() - t0, "".join(text)


def chats(url: str, conversations: int, turns: int, concurrency: int, gen_tokens: int) -> list[float]:
    """Multi-turn chats sharing a system prompt, `concurrency` at a time: each turn's time to first token."""
    ttfts: list[float] = []
    lock = threading.Lock()
    todo = list(range(conversations))

    def converse() -> None:
        while True:
            with lock:
                if not todo:
                    return
                n = todo.pop()
            messages = [{"role": "system", "content": f"Conversation {n}. {SYSTEM}"}]
            for turn in range(turns):
                messages.append({"role": "user", "content": QUESTIONS[turn % len(QUESTIONS)]})
                seconds, text = _first_token_seconds(url, "any", messages, gen_tokens)
                messages.append({"role": "assistant", "content": text})
                with lock:
                    ttfts.append(seconds)

    workers = [threading.Thread(target=converse) for _ in range(concurrency)]
    for w in workers:
        w.start()
    for w in workers:
        w.join()
    return ttfts


def _wait_status(url: str, model: str, value: str, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        models = httpx.get(f"{url}/models", timeout=10).json()["data"]
        if any(m["id"] == model and m["status"]["value"] == value for m in models):
            return
        time.sleep(0.1)
    raise RuntimeError(f"{model} did not become {value}")


def cold(args) -> dict:
    d = tempfile.mkdtemp(prefix="cllm-pool-")
    os.symlink(os.path.abspath(args.model), os.path.join(d, "cold.gguf"))
    threads = str(args.threads)
    ask = [{"role": "user", "content": "Say hello."}]
    # The same models, threads, slots and cells on both.
    shared = ["--models-dir", d, "--threads", threads, "--parallel", "4", "--ctx-size", "4096"]
    port, port2 = servers.free_port(), servers.free_port()
    systems = {
        "cllm": (
            [sys.executable, "-m", "cllm.cli", "serve", *shared, "--port", str(port), "--log-level", "warning"],
            port,
        ),
        "llama-server": (
            [servers.LLAMA_SERVER, *shared, "--host", "127.0.0.1", "--port", str(port2), "--no-webui"],
            port2,
        ),
    }
    result: dict[str, Any] = {}
    for system, (cmd, p) in systems.items():
        with servers.launch(system, cmd, p, "/models", label=f"pool-cold-{system}") as srv:
            times = []
            for _ in range(args.rounds):
                if system == "cllm":  # its registry loads the default model at start: unload it for a cold start
                    httpx.post(f"{srv.url}/models/unload", json={"model": "cold"}, timeout=60)
                _wait_status(srv.url, "cold", "unloaded")
                seconds, _ = _first_token_seconds(srv.url, "cold", ask, 4)
                times.append(seconds)
                httpx.post(f"{srv.url}/models/unload", json={"model": "cold"}, timeout=60)
            result[system] = {"first_token_seconds": times, "median": statistics.median(times)}
    result["ratio_cllm_to_llama_server"] = result["cllm"]["median"] / result["llama-server"]["median"]
    return result


def _prefix_counts(url: str) -> tuple[float, float]:
    hit = prompt = 0.0
    for line in httpx.get(f"{url}/metrics", timeout=10).text.splitlines():
        if line.startswith("cllm_prefix_cache_hit_tokens_total{"):
            hit += float(line.rsplit(" ", 1)[1])
        elif line.startswith("cllm_prompt_tokens_total "):
            prompt = float(line.rsplit(" ", 1)[1])
    return hit, prompt


def routing(args) -> dict:
    result: dict[str, Any] = {}
    for mode in ("prefix", "round-robin"):
        settings = servers.Settings(args.model, args.threads, args.parallel, args.seq_ctx)
        with servers.start(
            "cllm",
            settings,
            args=("--replicas", "2", "--replica-routing", mode, "--log-level", "warning"),
            label=f"pool-routing-{mode}",
        ) as srv:
            hit0, prompt0 = _prefix_counts(srv.url)
            ttfts = chats(srv.url, args.conversations, args.turns, args.concurrency, args.gen_tokens)
            time.sleep(2.5)  # the engines' figures arrive when they go idle
            hit, prompt = _prefix_counts(srv.url)
            ttfts.sort()
            result[mode] = {
                "hit_rate": round((hit - hit0) / max(1.0, prompt - prompt0), 4),
                "ttft_p50": round(ttfts[len(ttfts) // 2], 4),
                "ttft_p90": round(ttfts[int(len(ttfts) * 0.9)], 4),
                "requests": len(ttfts),
            }
    return result


def kv(args) -> dict:
    """Sequences of --seq-ctx cells that fit in --kv-mib, f16 against q8_0 (K and V), and their throughput."""
    from cllm.core.model_meta import kv_cache_bytes
    from frontend_proc.core.tokenizer import Tokenizer

    vocab = Tokenizer(args.model).model
    result: dict[str, Any] = {}
    for cache in ("f16", "q8_0"):
        per_seq = kv_cache_bytes(vocab, args.seq_ctx, cache, cache)
        fit = int(args.kv_mib * (1 << 20) // per_seq)
        # --no-prefix-cache: then the engine holds exactly its --parallel sequences' cells.
        settings = servers.Settings(args.model, args.threads, fit, args.seq_ctx)
        with servers.start(
            "cllm",
            settings,
            args=(
                "--cache-type-k",
                cache,
                "--cache-type-v",
                cache,
                "--flash-attn",
                "on",
                "--no-prefix-cache",
                "--log-level",
                "warning",
            ),
            label=f"pool-kv-{cache}",
        ) as srv:
            dialect = make_dialect("cllm")
            warm_up(srv.url, dialect, fit)
            cell = run_cell(srv.url, dialect, fit, 4 * fit, 26, args.gen_tokens, False, progress=False)
        result[cache] = {
            "sequences": fit,
            "kv_bytes_per_sequence": per_seq,
            "tokens_per_second": cell["tokens_per_second"],
        }
    return result


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m perf.pool_bench", description=__doc__.split("\n\n")[0])
    p.add_argument("what", choices=["cold", "routing", "kv"])
    p.add_argument("--model", required=True, help="a GGUF file")
    p.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    p.add_argument("-r", "--rounds", type=int, default=3)
    p.add_argument("--conversations", type=int, default=8)
    p.add_argument("--turns", type=int, default=4)
    p.add_argument("-c", "--concurrency", type=int, default=4)
    p.add_argument("--parallel", type=int, default=4, help="sequences per replica (routing)")
    p.add_argument("--seq-ctx", type=int, default=1024, help="KV cells per sequence")
    p.add_argument("-g", "--gen-tokens", type=int, default=32)
    p.add_argument("--kv-mib", type=float, default=48.0, help="KV memory both caches get (kv)")
    args = p.parse_args(argv)
    print(json.dumps({"cold": cold, "routing": routing, "kv": kv}[args.what](args), indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
