"""The next turn of a long conversation after a restart, with the prefix cache on disk (--cache-dir).

A round, on the embedded model (or --model), one cllm server at a time:

  1. server 1 (--cache-dir A): the conversation's first turn, a ~4,000-token system prompt and a question: TTFT
     "cold", a full prefill. Once the idle engine has written the turn's cells to a file, A is copied to B. Then
     the next turn (history, the reply, a new question): TTFT "no restart", the history's cells in a KV stream.
  2. server 2 (--cache-dir B: what server 1 had written before its next turn), after a short request of its own:
     the same next turn: TTFT "after restart", the history's cells from the file.

Both figures are the same request on the same cells (the "cached" column shows it), once without and once after a
restart.

Targets (issue 37): after a restart <= 1.3x no restart, and >= 10x faster than cold. Prints a Markdown
table and writes it to perf/results/<date>-restart-cache.md. Usage:
    .venv/bin/python -m perf.restart_cache [--history-tokens 4000] [--rounds 1] [--parallel 2 --seq-ctx 8192]
"""

from __future__ import annotations

import argparse
import datetime
import os
import shutil
import statistics
import tempfile
import time
from typing import Any

import httpx

from perf import servers
from perf.prefix_cache import handbook, idle, reused, stream

TIMEOUT = 1800.0
RESULTS = os.path.join(servers.PERF, "results")
TOKENS_PER_SECTION = 31  # of handbook()'s rules, measured on the embedded model's tokenizer


def turn(system: str, question: str, reply: str | None = None, next_question: str | None = None) -> list[dict]:
    messages: list[dict[str, Any]] = [{"role": "system", "content": system}, {"role": "user", "content": question}]
    if reply is not None:
        messages += [{"role": "assistant", "content": reply}, {"role": "user", "content": next_question}]
    return messages


def health(client: httpx.Client) -> dict:
    return client.get("/health", params={"level": "full"}).json()["data"]


def one_round(settings: servers.Settings, cache_dir: str, seed: int, sections: int, max_tokens: int) -> dict:
    system = handbook(seed, sections)
    question = "Which rules apply to a customer who is a member and asks about shipping?"
    ask = "Billing: what is the fee for a late case of a member?"
    first_dir, second_dir = os.path.join(cache_dir, "a"), os.path.join(cache_dir, "b")
    row: dict = {}
    with (
        servers.start("cllm", settings, args=("--cache-dir", first_dir), label="restart-cache-1") as srv,
        httpx.Client(base_url=srv.url, timeout=TIMEOUT) as c,
    ):
        before = idle(c)
        first = stream(c, "/v1/chat/completions", {"messages": turn(system, question), "max_tokens": max_tokens})
        row["cold"] = {"ttft": first.ttft, "prompt_tokens": first.prompt_tokens, "cached": reused(c, before)}
        _written(c)
        shutil.copytree(first_dir, second_dir)
        messages = turn(system, question, first.text, ask)
        before = idle(c)
        r = stream(c, "/v1/chat/completions", {"messages": messages, "max_tokens": max_tokens})
        row["no restart"] = {"ttft": r.ttft, "prompt_tokens": r.prompt_tokens, "cached": reused(c, before)}
    files = [os.path.join(d, f) for d, _, names in os.walk(second_dir) for f in names if f.endswith(".kv")]
    row["files"], row["file_mib"] = len(files), sum(os.path.getsize(f) for f in files) / 2**20
    with (
        servers.start("cllm", settings, args=("--cache-dir", second_dir), label="restart-cache-2") as srv,
        httpx.Client(base_url=srv.url, timeout=TIMEOUT) as c,
    ):
        # A short request first, as a serving engine has had: its first llama_decode sets up what every later one
        # reuses. Its figures are in before the turn's are counted (idle: the engine stepped since).
        started = idle(c)
        stream(c, "/v1/completions", {"prompt": "Hello", "max_tokens": 2})
        before = idle(c, started)
        r = stream(c, "/v1/chat/completions", {"messages": messages, "max_tokens": max_tokens})
        after = idle(c, before)
        hits = after["prefix_cache"]["hit_tokens"] - before["prefix_cache"]["hit_tokens"]
        row["after restart"] = {"ttft": r.ttft, "prompt_tokens": r.prompt_tokens, "cached": hits}
        figures = after["prefix_cache"]
        row["disk_hits"], row["disk_load_seconds"] = figures["disk_hits"], figures["disk_load_seconds"]
    return row


def _written(client: httpx.Client) -> None:
    """Wait (bounded) until the idle engine has written its stream's entry to a file."""
    deadline = time.monotonic() + 120
    while health(client)["prefix_cache"]["disk_entries"] < 1:
        if time.monotonic() > deadline:
            raise RuntimeError("the first turn's cells were not written to the cache folder in 120 s")
        time.sleep(0.1)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    servers.add_arguments(ap, seq_ctx=8192)
    ap.set_defaults(parallel=2)
    ap.add_argument(
        "--history-tokens", type=int, default=4000, help="about how long the conversation's system prompt is"
    )
    ap.add_argument("--max-tokens", type=int, default=32, help="tokens of each reply")
    ap.add_argument("--rounds", type=int, default=1)
    args = ap.parse_args()
    settings = servers.settings_of(args)
    sections = max(1, args.history_tokens // TOKENS_PER_SECTION)
    rows = []
    for i in range(args.rounds):
        with tempfile.TemporaryDirectory(prefix="cllm-kv-") as cache_dir:
            rows.append(one_round(settings, cache_dir, 100 + i, sections, args.max_tokens))
        print(f"round {i + 1}: {rows[-1]}", flush=True)
    report = render(rows, args)
    print(report)
    os.makedirs(RESULTS, exist_ok=True)
    path = os.path.join(RESULTS, f"{datetime.date.today().isoformat()}-restart-cache.md")
    with open(path, "w") as f:
        f.write(report)
    print(f"written to {path}")


def render(rows: list[dict], args) -> str:
    med = lambda name: statistics.median(r[name]["ttft"] for r in rows)  # noqa: E731
    after, same, cold = med("after restart"), med("no restart"), med("cold")
    lines = [
        "# The next turn of a long conversation after a restart (--cache-dir)",
        "",
        f"`python -m perf.restart_cache --history-tokens {args.history_tokens} --rounds {args.rounds} "
        f"--parallel {args.parallel} --seq-ctx {args.seq_ctx} --threads {args.threads}` "
        f"({datetime.datetime.now(datetime.timezone.utc):%Y-%m-%d %H:%M} UTC, {os.cpu_count()} CPUs, "
        f"model {os.path.basename(servers.resolve_model(args.model))}).",
        "",
        "Server 1 (cache folder A) serves the first turn (cold: its whole prompt prefilled); once its idle engine has "
        "written the turn's cells, A is copied to B, and server 1 serves the next turn (no restart: the history's "
        "cells "
        "in a KV stream). Server 2, on B, serves a short request, then the same next turn (after restart: the "
        "history's "
        "cells from the file). TTFT of streamed /v1/chat/completions, greedy; median over rounds. Cached: prompt "
        "tokens "
        "the cache served.",
        "",
        "| round | files (MiB) | next turn: prompt tokens | after restart: TTFT s (cached) | no restart: TTFT s "
        "(cached) | cold: prompt tokens, TTFT s | disk hit s |",
        "|---|---|---|---|---|---|---|",
    ]
    for i, r in enumerate(rows, 1):
        cell = lambda name: f"{r[name]['ttft']:.3f} ({r[name]['cached']})"  # noqa: E731
        lines.append(
            f"| {i} | {r['files']} ({r['file_mib']:.1f}) | {r['after restart']['prompt_tokens']} | "
            f"{cell('after restart')} | {cell('no restart')} | {r['cold']['prompt_tokens']}, {r['cold']['ttft']:.3f} | "
            f"{r['disk_load_seconds']:.3f} |"
        )
    lines += [
        "",
        f"- after restart / no restart: **{after / same:.2f}x** (target <= 1.3x)",
        f"- cold / after restart: **{cold / after:.1f}x** (target >= 10x)",
        "",
    ]
    return "\n".join(lines)


if __name__ == "__main__":
    main()
