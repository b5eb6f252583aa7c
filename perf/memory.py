"""Memory at defaults: cllm's processes against llama-server's, after the same requests.

Each server is started in turn with its defaults at the same context (`cllm
serve --ctx-size 8192 --parallel 8`, llama-server `-c 8192 -np 8`), sent the
same chat requests (16 by default, 8 at a time: a ~300-token system prompt of
its own each, greedy, 16 tokens), then measured idle: RSS, PSS, USS and peak
RSS summed over the server's process and all its children (psutil; PSS, USS
and the peak where the OS gives them), GPU memory per process where
nvidia-smi answers, and the KV bytes each reserves (cllm's /model/info,
llama-server's log) and what the prefix cache keeps in host RAM (cllm's
/health). RSS counts a page every process maps (shared libraries, the
model file) once per process; PSS splits it among them.

One Markdown file per run goes to perf/results/ (or --out). Usage:
    .venv/bin/python -m perf.memory [--rev 6754278] [--also '--cache-slots 8'] [--requests 16]
"""

from __future__ import annotations

import argparse
import datetime
import os
import re
import shlex
import shutil
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import httpx
import psutil

from perf import servers
from perf.prefix_cache import TOPICS, handbook

MIB = 1 << 20
ROOT = os.path.dirname(servers.PERF)
TIMEOUT = 600.0
FIGURES = ("rss", "pss", "uss", "peak")


def requests(n: int) -> list[list[dict]]:
    """n chat requests, each with a system prompt of its own (so each leaves a cache entry of its own)."""
    return [
        [
            {
                "role": "system",
                "content": "You are the support desk. Answer from this handbook.\n" + handbook(500 + i, 8),
            },
            {"role": "user", "content": f"A customer asks about {TOPICS[i % len(TOPICS)]}: what applies?"},
        ]
        for i in range(n)
    ]


def send_all(url: str, chats: list[list[dict]], concurrency: int, max_tokens: int) -> int:
    """Send every chat, ``concurrency`` at a time; the prompt tokens in all."""
    with httpx.Client(base_url=url, timeout=TIMEOUT) as client:

        def one(messages: list[dict]) -> int:
            r = client.post(
                "/v1/chat/completions", json={"messages": messages, "max_tokens": max_tokens, "temperature": 0}
            )
            r.raise_for_status()
            return r.json()["usage"]["prompt_tokens"]

        with ThreadPoolExecutor(concurrency) as pool:
            return sum(pool.map(one, chats))


def _peak(p: psutil.Process) -> int:
    """The process's peak RSS (Linux's VmHWM); 0 where the OS does not say."""
    try:
        with open(f"/proc/{p.pid}/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0


def nvidia_smi(query: str, timeout: float) -> str:
    """nvidia-smi's CSV answer, without header or units, to one query."""
    return subprocess.run(
        ["nvidia-smi", query, "--format=csv,noheader,nounits"], capture_output=True, text=True, timeout=timeout
    ).stdout


def gpu_bytes() -> dict[int, int]:
    """pid -> GPU memory in use, where nvidia-smi answers; empty otherwise."""
    if shutil.which("nvidia-smi") is None:
        return {}
    try:
        out = nvidia_smi("--query-compute-apps=pid,used_memory", timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return {}
    used = {}
    for line in out.splitlines():
        pid, _, mib = line.partition(",")
        if pid.strip().isdigit() and mib.strip().isdigit():
            used[int(pid)] = int(mib) * MIB
    return used


def measure(pid: int) -> list[dict]:
    """A row of figures (bytes) for the process and each of its descendants."""
    gpu = gpu_bytes()
    rows = []
    root = psutil.Process(pid)
    for p in [root, *root.children(recursive=True)]:
        try:
            with p.oneshot():
                words = p.cmdline()
                # "-m engine_proc", not its config
                name = " ".join(w for w in words[1:3] if not w.startswith("{")) or p.name()
                try:
                    full: Any = p.memory_full_info()
                    pss, uss = getattr(full, "pss", 0), full.uss
                except psutil.AccessDenied:
                    full, pss, uss = p.memory_info(), 0, 0
                rows.append(
                    {
                        "pid": p.pid,
                        "name": name[:40],
                        "rss": full.rss,
                        "pss": pss,
                        "uss": uss,
                        "peak": _peak(p),
                        "gpu": gpu.get(p.pid, 0),
                    }
                )
        except psutil.NoSuchProcess:  # a helper that ended while we looked
            continue
    return rows


def kv_of_llama_server(log: str) -> int:
    """The KV buffers llama-server's log reports (every device's), in bytes."""
    with open(log, errors="replace") as f:
        return int(sum(float(m) for m in re.findall(r"KV buffer size =\s*([\d.]+) MiB", f.read())) * MIB)


def cllm_figures(url: str) -> dict:
    with httpx.Client(base_url=url, timeout=30) as client:
        info = client.get("/model/info").json()["data"]
        health = client.get("/health", params={"level": "full"}).json()["data"]
    cache = health.get("prefix_cache") or {}
    return {
        "kv": info["kv_bytes"],
        "host_cache": cache.get("host_bytes", 0),
        "cells": info["ctx_size"],
        "slots": info.get("cache_slots", 0),
    }


def run_one(name: str, system: str, tree: str, words: tuple[str, ...], args, chats: list[list[dict]]) -> dict:
    """Start one server, send the requests, measure it idle, stop it."""
    port = servers.free_port()
    if system == "llama-server":
        cmd = [
            args.llama_server,
            "--model",
            args.model,
            "--host",
            "127.0.0.1",
            "--port",
            str(port),
            "--threads",
            str(args.threads),
            "--threads-batch",
            str(args.threads),
            "-c",
            str(args.ctx_size),
            "-np",
            str(args.parallel),
            "--no-webui",
        ]
    else:
        settings = servers.Settings(args.model, args.threads, args.parallel, args.ctx_size // args.parallel, words)
        cmd = servers.command("cllm", settings, port)[0]
    label = re.sub(r"[^A-Za-z0-9.-]+", "-", name).strip("-")
    with servers.launch(system, cmd, port, "/health", label=f"memory-{label}", cwd=tree) as server:
        at_start = sum(r["rss"] for r in measure(server.proc.pid))
        prompt_tokens = send_all(server.url, chats, args.concurrency, args.max_tokens)
        time.sleep(args.settle)  # the engine's last bookkeeping, the frontend's last reply
        rows = measure(server.proc.pid)
        extra = (
            cllm_figures(server.url) if system == "cllm" else {"kv": kv_of_llama_server(server.log), "host_cache": None}
        )
    return {"name": name, "rows": rows, "at_start": at_start, "prompt_tokens": prompt_tokens, **extra}


def _mib(b: int | None) -> str:
    return "" if b is None else f"{b / MIB:.0f}"


def markdown(results: list[dict], args, command: str) -> str:
    peer = next((r for r in results if r["name"] == "llama-server"), None)
    gpu = any(row["gpu"] for r in results for row in r["rows"])
    dirty = " (uncommitted changes)" if _git("status", "--porcelain", "--untracked-files=no") else ""
    lines = [
        f"<!-- `{command}`, {datetime.datetime.now(datetime.timezone.utc):%Y-%m-%d %H:%M} UTC, tree "
        f"{_git('rev-parse', '--short', 'HEAD')}{dirty} -->",
        "",
        f"# Memory after {args.requests} chat requests ({args.concurrency} at a time, {args.max_tokens} tokens each): "
        f"{os.path.basename(args.model)}, --ctx-size {args.ctx_size}, --parallel {args.parallel}, {args.threads} "
        "threads",
        "",
        "Sums over each server's processes, MiB. RSS counts shared pages once per process; PSS shares them out.",
        "",
        "| server | processes | RSS | PSS | USS | peak RSS |"
        + (" GPU |" if gpu else "")
        + " RSS at start | KV reserved | host-RAM cache | RSS ÷ llama-server's |",
        "|---|---|---|---|---|---|" + ("---|" if gpu else "") + "---|---|---|---|",
    ]
    for r in results:
        total = {k: sum(row[k] for row in r["rows"]) for k in (*FIGURES, "gpu")}
        r["total"] = total
        ratio = f"{total['rss'] / sum(row['rss'] for row in peer['rows']):.2f}" if peer else ""
        lines.append(
            f"| {r['name']} | {len(r['rows'])} | "
            + " | ".join(_mib(total[k]) for k in FIGURES)
            + (f" | {_mib(total['gpu'])}" if gpu else "")
            + f" | {_mib(r['at_start'])} | {_mib(r['kv'])} | {_mib(r['host_cache'])} | {ratio} |"
        )
    lines += [
        "",
        "Each process, MiB:",
        "",
        "| server | pid | process | RSS | PSS | USS | peak RSS |" + (" GPU |" if gpu else ""),
        "|---|---|---|---|---|---|---|" + ("---|" if gpu else ""),
    ]
    for r in results:
        for row in r["rows"]:
            lines.append(
                f"| {r['name']} | {row['pid']} | `{row['name']}` | "
                + " | ".join(_mib(row[k]) for k in FIGURES)
                + (f" | {_mib(row['gpu'])} |" if gpu else " |")
            )
    return "\n".join(lines) + "\n"


def _git(*words: str) -> str:
    return subprocess.run(["git", *words], cwd=ROOT, capture_output=True, text=True).stdout.strip()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", metavar="PATH", help="GGUF file (default: the embedded SmolLM2)")
    ap.add_argument("--threads", type=int, default=os.cpu_count())
    ap.add_argument("--ctx-size", type=int, default=8192, help="both servers' context: cllm's default")
    ap.add_argument("--parallel", type=int, default=8, help="both servers' sequences: cllm's default")
    ap.add_argument("--requests", type=int, default=16)
    ap.add_argument("--concurrency", type=int, default=8)
    ap.add_argument("--max-tokens", type=int, default=16)
    ap.add_argument("--settle", type=float, default=2.0, help="seconds between the last reply and the measurement")
    ap.add_argument(
        "--rev", action="append", default=[], help="also a cllm of this git revision (unpacked as perf.revision does)"
    )
    ap.add_argument(
        "--also",
        action="append",
        default=[],
        metavar="ARGS",
        help="also a cllm of this tree with these `cllm serve` options",
    )
    ap.add_argument("--no-peer", action="store_true", help="leave llama-server out")
    ap.add_argument("--llama-server", default=servers.LLAMA_SERVER, metavar="PATH")
    ap.add_argument("--out", help="the Markdown file (default: perf/results/<date>-memory.md)")
    args = ap.parse_args()
    args.model = servers.resolve_model(args.model)
    runs = [("cllm", "cllm", ROOT, ())]
    runs += [(f"cllm {a}", "cllm", ROOT, tuple(a.split())) for a in args.also]
    for rev in args.rev:
        commit, tree = servers.unpack(rev)
        runs.append((f"cllm {commit[:7]}", "cllm", tree, ()))
    if not args.no_peer:
        runs.append(("llama-server", "llama-server", ROOT, ()))
    chats = requests(args.requests)
    results = []
    for name, system, tree, words in runs:
        results.append(run_one(name, system, tree, words, args, chats))
        print(f"{name}: RSS {sum(r['rss'] for r in results[-1]['rows']) / MIB:.0f} MiB", flush=True)
    command = "python -m perf.memory " + " ".join(shlex.quote(w) for w in sys.argv[1:])
    text = markdown(results, args, command.strip())
    out = args.out or os.path.join(servers.PERF, "results", f"{datetime.date.today():%Y-%m-%d}-memory.md")
    with open(out, "w") as f:
        f.write(text)
    print(text)
    print(f"written to {out}")


if __name__ == "__main__":
    main()
