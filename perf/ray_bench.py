"""cllm through Ray Serve against plain `cllm serve`, on this machine, in one run.

  hops        mean time of GET /health: plain cllm, the Ray path (Serve proxy -> ingress -> replica),
              and a DeploymentHandle call from this process straight to a replica (one Ray RPC)
  throughput  streamed /generate at c = 1, 8, 32: Ray Serve with 2 replicas x 1 thread (parallel P each)
              against plain `cllm serve` with 1 engine x 2 threads (parallel 2P): tokens/s and TTFT p50
  chat        multi-turn chats on 2 replicas (each turn resending the conversation), 1 and 4 at a time:
              prefix-cache hit rate and TTFT with cllm's router, Ray's power-of-two default, Ray's
              PrefixCacheAffinityRouter
  recovery    SIGKILL one replica's engine under a steady load: seconds until Ray serves from two
              replicas again, and how many requests failed meanwhile

    python -m perf.ray_bench [--model FILE] [--gen-tokens 64] [--out perf/results/X.json]

Where the replicas' threads take every CPU there is no scale-out gain to show: the figures are then the cost of
the Ray path. The load average is recorded with every figure.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import sys
import tempfile
import threading
import time

import httpx
import psutil

from cllm.bench.dialects import make_dialect
from cllm.bench.http_load import run_cell, warm_up
from perf import servers
from perf.pool_bench import chats

CONCURRENCY = (1, 8, 32)
ROUTERS = ("cllm", "power-of-two", "ray-prefix")


def load_average() -> str:
    return " ".join(f"{x:.2f}" for x in os.getloadavg())


def mean_ms(fn, n: int) -> float:
    fn()  # a connection made, a first call done
    t0 = time.perf_counter()
    for _ in range(n):
        fn()
    return 1000 * (time.perf_counter() - t0) / n


def throughput(url: str, gen_tokens: int, prompt_tokens: int) -> dict:
    dialect = make_dialect("cllm")
    warm_up(url, dialect, 8)
    cells = {}
    for c in CONCURRENCY:
        r = run_cell(url, dialect, c, max(8, 3 * c), prompt_tokens, gen_tokens, stream=True, progress=False)
        cells[c] = {
            "tokens_per_second": round(r["tokens_per_second"], 1),
            "ttft_p50": round(r["ttft"]["p50"], 4),
            "errors": r["errors"],
            "load": load_average(),
        }
        print(
            f"  c={c:<3} {cells[c]['tokens_per_second']:7.1f} tok/s  TTFT p50 {cells[c]['ttft_p50']:.3f} s  (load "
            f"{cells[c]['load']})",
            flush=True,
        )
    return cells


def replica_stats() -> dict[str, dict]:
    """What each engine replica reports to the routers, asked of its Ray actor directly (no routing)."""
    import ray

    names = [
        a["name"]
        for a in ray.util.list_named_actors(all_namespaces=True)
        if a["name"].startswith("SERVE_REPLICA::cllm#cllm-engine#")
    ]
    stats = {}
    for name in names:
        try:
            stats[name] = ray.get(ray.get_actor(name, namespace="serve").record_routing_stats.remote(), timeout=5)
        except Exception:  # a replica being replaced
            continue
    return stats


def cache_totals() -> tuple[float, float]:
    stats = replica_stats().values()
    return sum(s["prefix_hit_tokens"] for s in stats), sum(s["prompt_tokens"] for s in stats)


def chat(url: str, conversations: int, turns: int, concurrency: int, gen_tokens: int) -> dict:
    hit0, prompt0 = cache_totals()
    ttfts = sorted(chats(url, conversations, turns, concurrency, gen_tokens))
    time.sleep(2.5)  # the engines report their cache figures once a second
    hit, prompt = cache_totals()
    hit, prompt = hit - hit0, prompt - prompt0
    return {
        "hit_rate": round(hit / max(1.0, prompt), 4),
        "ttft_p50": round(ttfts[len(ttfts) // 2], 4),
        "ttft_p90": round(ttfts[int(len(ttfts) * 0.9)], 4),
        "requests": len(ttfts),
        "load": load_average(),
    }


def engines() -> list[psutil.Process]:
    me = psutil.Process()
    return [p for p in me.children(recursive=True) if "engine_proc" in " ".join(p.cmdline())]


def recovery(url: str) -> dict:
    """Kill one engine under load; time until both replicas answer again (a new replica id among them)."""
    old = set(replica_stats())
    stop = threading.Event()
    outcomes: list[int] = []

    def load() -> None:
        with httpx.Client(timeout=60) as client:
            i = 0
            while not stop.is_set():
                i += 1
                try:
                    outcomes.append(
                        client.post(
                            f"{url}/generate", json={"prompt": f"Tell me about {i}", "max_tokens": 16}
                        ).status_code
                    )
                except httpx.HTTPError:
                    outcomes.append(0)

    workers = [threading.Thread(target=load) for _ in range(2)]
    for w in workers:
        w.start()
    time.sleep(2)
    engines()[0].send_signal(signal.SIGKILL)
    killed = time.monotonic()
    recovered = None
    while time.monotonic() - killed < 180:
        seen = set(replica_stats())
        if len(seen) == 2 and seen - old and httpx.get(f"{url}/health", timeout=30).status_code == 200:
            recovered = time.monotonic() - killed
            break
        time.sleep(0.2)
    stop.set()
    for w in workers:
        w.join()
    failed = [s for s in outcomes if s != 200]
    return {
        "seconds": round(recovered, 2) if recovered is not None else None,
        "requests": len(outcomes),
        "failed": len(failed),
        "failed_statuses": sorted(set(failed)),
        "load": load_average(),
    }


def _parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="python -m perf.ray_bench", description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default=None, help="GGUF file (default: the embedded SmolLM2)")
    ap.add_argument("--parallel", type=int, default=8, help="sequences per Ray replica; plain cllm gets twice as many")
    ap.add_argument("--seq-ctx", type=int, default=1024, help="KV cells per sequence")
    ap.add_argument("--gen-tokens", type=int, default=64)
    ap.add_argument("--prompt-tokens", type=int, default=128)
    ap.add_argument("--conversations", type=int, default=8)
    ap.add_argument("--turns", type=int, default=4)
    ap.add_argument(
        "--chat-concurrency",
        type=lambda v: [int(x) for x in v.split(",")],
        default=[1, 4],
        help="conversations at a time (at 2, as many as replicas, any router keeps each on one replica)",
    )
    ap.add_argument("--out", default=None, help="JSON file for the results")
    return ap


def _plain(model: str, args: argparse.Namespace, result: dict) -> None:
    """Plain `cllm serve` with the same threads: one hop to /health, and throughput."""
    print("plain cllm serve: 1 engine x 2 threads", flush=True)
    with servers.start(
        "cllm", servers.Settings(model, 2, 2 * args.parallel, args.seq_ctx), args=("--log-level", "warning")
    ) as srv:
        with httpx.Client(base_url=srv.url) as client:
            result["hops_ms"] = {"plain_health": round(mean_ms(lambda: client.get("/health"), 200), 3)}
        result["plain"] = throughput(srv.url, args.gen_tokens, args.prompt_tokens)


def _chats(url: str, args: argparse.Namespace, deploy) -> dict:
    """The multi-turn chats under each router, at each concurrency."""
    out = {}
    for router in ROUTERS:
        for c in args.chat_concurrency:
            deploy(router)  # fresh replicas, empty caches: the same conversations run each time
            out[f"{router} c={c}"] = chat(url, args.conversations, args.turns, c, args.gen_tokens)
            print(f"  chat, {router} router, c={c}: {out[f'{router} c={c}']}", flush=True)
    return out


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)

    import ray
    from ray import serve

    from cllm.core.config_load import load_config
    from cllm.core.model_file import resolve_model
    from cllm.ray_serve import application
    from cllm.ray_serve.call import HttpCall

    model = resolve_model(args.model)
    result: dict = {
        "command": "python -m perf.ray_bench " + " ".join(argv if argv is not None else sys.argv[1:]),
        "model": os.path.basename(model),
        "started": time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime()),
    }
    print(f"load average at start: {load_average()}", flush=True)

    _plain(model, args, result)

    temp = tempfile.mkdtemp(prefix="cllm-rb", dir="/tmp")  # short: Ray's socket paths live under it
    port = servers.free_port()
    url = f"http://127.0.0.1:{port}"
    ray.init(num_cpus=2, include_dashboard=False, _temp_dir=temp, log_to_driver=False)
    try:
        serve.start(http_options={"host": "127.0.0.1", "port": port})
        config = load_config(
            None,
            {
                "model": model,
                "replicas": 2,
                "threads": 1,
                "parallel": args.parallel,
                "ctx_size": args.seq_ctx * args.parallel,
                "log_level": "warning",
            },
        )

        def deploy(router: str) -> None:
            serve.delete("cllm")
            # Half a Ray CPU each: Ray's prefix router needs one free for its tree actor.
            serve.run(application(config, router=router, num_cpus=0.5), name="cllm", route_prefix="/")

        print("Ray Serve: 2 replicas x 1 thread, cllm's router", flush=True)
        deploy("cllm")
        handle = serve.get_deployment_handle("cllm-engine", "cllm").options(method_name="call", stream=True)

        with httpx.Client(base_url=url) as client:
            result["hops_ms"]["ray_health"] = round(mean_ms(lambda: client.get("/health"), 200), 3)
        health = HttpCall("GET", "/health", b"", [], b"")
        result["hops_ms"]["handle_to_replica"] = round(mean_ms(lambda: list(handle.remote(health)), 200), 3)
        result["hops_ms"]["load"] = load_average()
        print(
            f"  /health: plain {result['hops_ms']['plain_health']} ms, through Ray {result['hops_ms']['ray_health']} "
            "ms,"
            f" handle -> replica {result['hops_ms']['handle_to_replica']} ms",
            flush=True,
        )
        result["ray"] = throughput(url, args.gen_tokens, args.prompt_tokens)

        result["chat"] = _chats(url, args, deploy)

        deploy("cllm")
        result["recovery"] = recovery(url)
        print(f"  recovery: {result['recovery']}", flush=True)
    finally:
        serve.shutdown()
        ray.shutdown()
        shutil.rmtree(temp, ignore_errors=True)
    result["finished"] = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime())
    if args.out:
        with open(args.out, "w") as f:
            json.dump(result, f, indent=1)
    print(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
