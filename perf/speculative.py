"""Speculative decoding, side by side: cllm with and without it, llama-server with its n-gram drafters.

Every server gets the same GGUF file, threads, --parallel and KV cells per
sequence, and they run one after the other, never at once, the order turning
each round. Requests are chat completions, greedy, non-streamed; tok/s is
completion tokens over wall time, end to end over HTTP.

  copy     input-grounded prompts (copy a text, copy a code file, edit one,
           fix a text's typos: cllm/bench/prompts.py), each sent once to cache its prompt, then measured:
           at c=1 one after the other, at c=8 all at once (each prompt
           several times, with a distinct first line so each conversation has its own prompt).
  fresh    prompts that copy nothing (cllm/bench/prompts.py), c = 1, 8, 32, against
           cllm without speculation only.

Drafted and accepted tokens: cllm's /metrics; llama-server's `timings`.
Usage:
    .venv/bin/python -m perf.speculative [--model PATH] [--rounds 2] [--workloads copy,fresh]
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import httpx

from cllm.bench.prompts import copy_prompts, make_prompts
from perf import servers

TIMEOUT = 900.0
SYSTEMS = {  # label: (system, extra command-line arguments)
    "cllm": ("cllm", ("--spec-type", "ngram")),
    "cllm-nospec": ("cllm", ("--spec-type", "none")),
    "llama-server-ngram-mod": ("llama-server", ("--spec-type", "ngram-mod")),
    "llama-server-ngram-simple": ("llama-server", ("--spec-type", "ngram-simple")),
}


def chat(client: httpx.Client, prompt: str, max_tokens: int) -> dict:
    r = client.post(
        "/v1/chat/completions",
        headers={"Connection": "close"},
        json={"messages": [{"role": "user", "content": prompt}], "max_tokens": max_tokens, "temperature": 0},
    )
    r.raise_for_status()
    return r.json()


def rate(client: httpx.Client, prompts: list[str], concurrency: int, max_tokens: int) -> tuple[float, dict]:
    """Completion tok/s of the prompts at the concurrency, and llama-server's draft counts when it gives them."""
    t0 = time.perf_counter()
    with ThreadPoolExecutor(concurrency) as pool:
        answers = list(pool.map(lambda p: chat(client, p, max_tokens), prompts))
    seconds = time.perf_counter() - t0
    tokens = sum(a["usage"]["completion_tokens"] for a in answers)
    drafts = {"drafted": 0, "accepted": 0}
    for a in answers:
        timings = a.get("timings") or {}
        drafts["drafted"] += timings.get("draft_n", 0)
        drafts["accepted"] += timings.get("draft_n_accepted", 0)
    return tokens / seconds, drafts


def cllm_drafts(client: httpx.Client) -> dict:
    text = client.get("/metrics").text
    counts = {"drafted": 0.0, "accepted": 0.0}
    for line in text.splitlines():
        for key in counts:
            if line.startswith(f"cllm_spec_{key}_tokens_total"):
                counts[key] += float(line.rsplit(" ", 1)[1])
    return counts


def measure(clients: dict, label: str, prompts: list[str], concurrency: int, max_tokens: int) -> tuple[float, dict]:
    client = clients[label]
    if SYSTEMS[label][0] != "cllm":
        return rate(client, prompts, concurrency, max_tokens)
    before = cllm_drafts(client)
    tok_s, _ = rate(client, prompts, concurrency, max_tokens)
    time.sleep(1.2)  # the engine's figures arrive at most once a second, and when it goes idle
    after = cllm_drafts(client)
    return tok_s, {k: after[k] - before[k] for k in after}


def variants(prompts: list[str], n: int, tag: str) -> list[str]:
    """n prompts cycling through ``prompts``, each with a first line of its own."""
    return [f"[{tag} {i}]\n{prompts[i % len(prompts)]}" for i in range(n)]


def run_copy(clients: dict, labels: list[str], args) -> str:
    base = list(copy_prompts().values())
    lines = [
        f"| c | {' | '.join(labels)} | cllm ÷ cllm-nospec | cllm ÷ best llama-server |",
        "|---" * (len(labels) + 3) + "|",
    ]
    accept = {label: {"drafted": 0, "accepted": 0} for label in labels}
    for c in args.concurrency:
        got: dict[str, list[Any]] = {label: [] for label in labels}
        for r in range(args.rounds):
            prompts = variants(base, max(c, len(base)), f"round {r} c {c}")
            order = labels[r % len(labels) :] + labels[: r % len(labels)]
            for label in order:
                rate(clients[label], prompts, c, 4)  # caches every prompt: the measured requests reuse it
                tok_s, drafts = measure(clients, label, prompts, c, args.max_tokens)
                got[label].append(tok_s)
                for k in drafts:
                    accept[label][k] += drafts[k]
        med = {label: statistics.median(v) for label, v in got.items()}
        peers = [med[label] for label in labels if label.startswith("llama-server")]
        row = " | ".join(f"{med[label]:.1f}" for label in labels)
        vs_peer = f"{med['cllm'] / max(peers):.2f}" if peers else "-"
        lines.append(f"| {c} | {row} | {med['cllm'] / med['cllm-nospec']:.2f} | {vs_peer} |")
    lines.append("")
    lines.append("| server | drafted | accepted | acceptance |")
    lines.append("|---|---|---|---|")
    for label, d in accept.items():
        if d["drafted"]:
            lines.append(f"| {label} | {d['drafted']:.0f} | {d['accepted']:.0f} | {d['accepted'] / d['drafted']:.2f} |")
    return "\n".join(lines)


def run_fresh(clients: dict, args) -> str:
    lines = ["| c | cllm tok/s | cllm-nospec tok/s | cllm ÷ cllm-nospec |", "|---|---|---|---|"]
    for c in args.fresh_concurrency:
        got: dict[str, list[Any]] = {"cllm": [], "cllm-nospec": []}
        for r in range(args.rounds):
            prompts = make_prompts(max(2 * c, 4), 32, seed=1000 * c + r)
            for label in ("cllm", "cllm-nospec") if r % 2 == 0 else ("cllm-nospec", "cllm"):
                got[label].append(rate(clients[label], [f"({label}) {p}" for p in prompts], c, args.fresh_tokens)[0])
        a, b = statistics.median(got["cllm"]), statistics.median(got["cllm-nospec"])
        lines.append(f"| {c} | {a:.1f} | {b:.1f} | {a / b:.3f} |")
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    servers.add_arguments(ap, seq_ctx=4096)
    ap.add_argument("--workloads", default="copy,fresh")
    ap.add_argument("--systems", default=",".join(SYSTEMS), help="of: " + ", ".join(SYSTEMS))
    ap.add_argument("--concurrency", default="1,8", type=lambda s: [int(x) for x in s.split(",")])
    ap.add_argument("--fresh-concurrency", default="1,8,32", type=lambda s: [int(x) for x in s.split(",")])
    ap.add_argument("--max-tokens", type=int, default=256)
    ap.add_argument("--fresh-tokens", type=int, default=128)
    ap.add_argument("--rounds", type=int, default=2, help="rounds of each cell, the servers' order turning")
    args = ap.parse_args()
    settings = servers.settings_of(args)
    labels = args.systems.split(",")
    if "fresh" in args.workloads:
        labels += [label for label in ("cllm", "cllm-nospec") if label not in labels]
    started = []
    try:
        for label in labels:
            system, extra = SYSTEMS[label]
            started.append(servers.start(system, settings, args=extra, label=label))
        clients = {label: httpx.Client(base_url=s.url, timeout=TIMEOUT) for label, s in zip(labels, started)}
        print(
            f"# {os.path.basename(settings.model)}: --parallel {args.parallel}, {args.seq_ctx} cells a sequence, "
            f"{args.threads} threads, {args.rounds} rounds, load average {os.getloadavg()[0]:.1f} at the start\n"
        )
        if "copy" in args.workloads:
            print(f"## copy-type prompts: {args.max_tokens} greedy tokens, tok/s (median of rounds)\n")
            print(run_copy(clients, [label for label in labels if label in args.systems.split(",")], args), "\n")
        if "fresh" in args.workloads:
            print(f"## prompts that copy nothing: {args.fresh_tokens} greedy tokens, tok/s (median of rounds)\n")
            print(run_fresh(clients, args), "\n")
        print(f"load average {os.getloadavg()[0]:.1f} at the end")
    finally:
        for s in started:
            s.stop()


if __name__ == "__main__":
    main()
