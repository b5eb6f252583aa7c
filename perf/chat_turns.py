"""Chat workloads, cllm against llama.cpp's llama-server side by side.

Both servers get the same GGUF file, threads, --parallel and KV cells per
sequence, and run one after the other, never at once, in alternating order
(A B, then B A, ...: a round at a time for chat, a request at a time for
repeat and stream). Everything goes through /v1/chat/completions or
/v1/completions, streamed, greedy.

  chat    C conversations at once, each T turns: a shared ~300-token system
          prompt, then user messages, every request carrying the whole
          history with the server's own replies (up to --max-tokens each).
          TTFT of turns 2+, mean and p90, over all conversations.
  repeat  One ~700-token prompt sent again and again at c=1, 256 tokens each
          (ignore_eos), the prompt cached by a request before: output tok/s end
          to end, and the median TTFT.
  stream  Fresh short prompts at c=1, 100 tokens each (ignore_eos): output
          tok/s of streams read token by token, and the median TTFT.

Prints a Markdown table per workload with the ratio cllm / llama-server. Usage:
    .venv/bin/python -m perf.chat_turns [--workloads chat,repeat,stream] [--conversations 1,8,16] [--rounds 2]
        [--also '--stream-interval-ms 20']   (another cllm server, its options added, in the same rounds)
        [--also GOMP_SPINCOUNT=300000]      (another cllm server, that variable in its environment)
        [--also=--rev=1ccb27f]              (another cllm server, run from that git revision's tree)
        [--peer-env GOMP_SPINCOUNT=1000]    (llama-server with that variable)
"""

from __future__ import annotations

import argparse
import os
import random
import statistics
from concurrent.futures import ThreadPoolExecutor
from contextlib import ExitStack
from typing import Any

import httpx

from cllm.bench.prompts import make_prompts
from perf import servers
from perf.prefix_cache import TOPICS, handbook, stream

TIMEOUT = 600.0
SYSTEMS = ("cllm", "llama-server")


def chat(client: httpx.Client, conversations: int, turns: int, max_tokens: int, seed: int) -> list[float]:
    """TTFT of every turn after the first, of every conversation."""
    system = {"role": "system", "content": "You are the support desk. Answer from this handbook.\n" + handbook(7, 14)}

    def converse(i: int) -> list[float]:
        rng = random.Random(seed * 1000 + i)
        history, ttfts = [system], []
        for turn in range(turns):
            history.append(
                {
                    "role": "user",
                    "content": f"Customer {rng.randrange(10**6)} asks about {rng.choice(TOPICS)}: what applies?",
                }
            )
            reply = stream(client, "/v1/chat/completions", {"messages": history, "max_tokens": max_tokens})
            history.append({"role": "assistant", "content": reply.text})
            if turn:
                ttfts.append(reply.ttft)
        return ttfts

    with ThreadPoolExecutor(conversations) as pool:
        return [t for ttfts in pool.map(converse, range(conversations)) for t in ttfts]


def tok_per_s(
    clients: dict[str, httpx.Client], order: tuple[str, ...], prompts: list[str], max_tokens: int
) -> tuple[dict[str, float], dict[str, float]]:
    """Each server's output tokens per second over the requests, at c=1, and its median TTFT.

    The servers take each prompt in turn, their order alternating request by
    request, so a drift of this machine's speed (it moves by several percent
    within minutes) falls on all of them alike.
    """
    tokens, seconds = dict.fromkeys(order, 0.0), dict.fromkeys(order, 0.0)
    ttfts: dict[str, list[float]] = {s: [] for s in order}
    for i, prompt in enumerate(prompts):
        for s in order if i % 2 == 0 else order[::-1]:
            r = stream(clients[s], "/v1/completions", {"prompt": prompt, "max_tokens": max_tokens, "ignore_eos": True})
            tokens[s] += r.completion_tokens
            seconds[s] += r.seconds
            ttfts[s].append(r.ttft)
    return {s: tokens[s] / seconds[s] for s in order}, {s: statistics.median(ttfts[s]) for s in order}


def p90(values: list[float]) -> float:
    return statistics.quantiles(values, n=10)[-1] if len(values) > 1 else values[0]


def alternate(rounds: int, systems: tuple[str, ...] = SYSTEMS) -> list[tuple[str, ...]]:
    return [systems if r % 2 == 0 else systems[::-1] for r in range(rounds)]


def run_chat(clients: dict, args) -> str:
    """A row per conversation count and cllm server: its TTFT of turns 2+ against llama-server's; then each round's
    means."""
    lines = [
        "| conversations | llama-server TTFT mean / p90 | cllm TTFT mean / p90 | cllm ÷ llama-server: mean / p90 |",
        "|---|---|---|---|",
    ]
    cllms = [s for s in clients if s != "llama-server"]
    rounds = []
    for c in args.conversations:
        got: dict[Any, list[Any]] = {s: [] for s in clients}
        for r, order in enumerate(alternate(args.rounds, tuple(clients))):
            means = {}
            for system in order:  # each round its own customers: turn 1 is new to every server
                ttfts = chat(clients[system], c, args.turns, args.max_tokens, seed=c * 100 + r)
                got[system] += ttfts
                means[system] = statistics.mean(ttfts)
            rounds.append(
                f"- {c} conversations, round {r + 1}, mean TTFT: "
                + ", ".join(f"{s} {means[s]:.3f} s" for s in clients)
                + "".join(f"; {s} ÷ cllm {means[s] / means['cllm']:.3f}" for s in cllms[1:])
            )
        l_mean, l_p90 = statistics.mean(got["llama-server"]), p90(got["llama-server"])
        for s in cllms:
            c_mean, c_p90 = statistics.mean(got[s]), p90(got[s])
            name = "" if len(cllms) == 1 else f"{s}: "
            lines.append(
                f"| {c} | {l_mean:.3f} / {l_p90:.3f} s | {name}{c_mean:.3f} / {c_p90:.3f} s | {c_mean / l_mean:.2f} / "
                f"{c_p90 / l_p90:.2f} |"
            )
    return "\n".join([*lines, "", *rounds])


def run_rate(clients: dict, args, prompts_of_round, max_tokens: int) -> str:
    """A row per round: each server's tok/s and median TTFT, and each cllm server's ratios to llama-server's; then
    the median ratios."""
    cllms = [s for s in clients if s != "llama-server"]
    lines = [
        "| round | llama-server tok/s, TTFT ms | "
        + " | ".join(f"{s} tok/s, TTFT ms | {s} ÷ llama-server: tok/s, TTFT" for s in cllms)
        + " |",
        "|---|---|" + "---|---|" * len(cllms),
    ]
    ratios: dict[Any, list[float]] = {s: [] for s in cllms}
    firsts: dict[Any, list[float]] = {s: [] for s in cllms}
    for r, order in enumerate(alternate(args.rounds, tuple(clients))):
        rate, ttft = tok_per_s(clients, order, prompts_of_round(r), max_tokens)
        for s in cllms:
            ratios[s].append(rate[s] / rate["llama-server"])
            firsts[s].append(ttft[s] / ttft["llama-server"])
        lines.append(
            f"| {r + 1} | {rate['llama-server']:.1f}, {1000 * ttft['llama-server']:.1f} | "
            + " | ".join(
                f"{rate[s]:.1f}, {1000 * ttft[s]:.1f} | {ratios[s][-1]:.3f}, {firsts[s][-1]:.2f}" for s in cllms
            )
            + " |"
        )
    lines.append(
        "| median | | "
        + " | ".join(f"| {statistics.median(ratios[s]):.3f}, {statistics.median(firsts[s]):.2f}" for s in cllms)
        + " |"
    )
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    servers.add_arguments(ap, seq_ctx=4096)
    ap.add_argument("--workloads", default="chat,repeat,stream")
    ap.add_argument("--conversations", default="1,8,16", type=lambda s: [int(x) for x in s.split(",")])
    ap.add_argument("--turns", type=int, default=6)
    ap.add_argument("--max-tokens", type=int, default=48, help="tokens in a chat reply")
    ap.add_argument("--rounds", type=int, default=2, help="rounds of each workload, the servers' order alternating")
    ap.add_argument("--requests", type=int, default=12, help="requests a round of repeat and stream")
    servers.add_variant_arguments(ap)
    args = ap.parse_args()
    runs = servers.variants(ap, args)
    settings = servers.settings_of(args)
    workloads = args.workloads.split(",")
    long_prompt = handbook(3, 32)[:3000]
    with ExitStack() as stack:
        clients = {}
        for i, (name, system, words) in enumerate(runs):
            env, extra = servers.env_and_args(words)
            tree, extra = servers.tree_and_args(extra)
            server = stack.enter_context(
                servers.start(
                    system, settings, env=env, args=extra, tree=tree, label=f"{system}-{i}" if args.also else None
                )
            )
            clients[name] = stack.enter_context(httpx.Client(base_url=server.url, timeout=TIMEOUT))
        for client in clients.values():  # the first decodes build llama.cpp's graphs; the long prompt is cached
            stream(client, "/v1/completions", {"prompt": long_prompt, "max_tokens": 4})
        print(
            f"# {os.path.basename(settings.model)}: --parallel {args.parallel}, {args.seq_ctx} cells a sequence, "
            f"{args.threads} threads, {args.rounds} rounds; llama-server's environment: "
            f"{' '.join(args.peer_env) or 'as is'}\n"
        )
        if "chat" in workloads:
            print(f"## chat: {args.turns} turns of up to {args.max_tokens} tokens, TTFT of turns 2+\n")
            print(run_chat(clients, args), "\n")
        if "repeat" in workloads:
            print("## repeat: a ~700-token prompt again and again, 256 tokens, c=1\n")
            print(run_rate(clients, args, lambda r: [long_prompt] * args.requests, 256), "\n")
        if "stream" in workloads:
            print("## stream: fresh short prompts, 100 tokens, c=1, streamed\n")
            print(run_rate(clients, args, lambda r: make_prompts(args.requests, 32, seed=r), 100), "\n")


if __name__ == "__main__":
    main()
