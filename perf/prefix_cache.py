"""The prefix cache's effect on time to first token: two cllm servers side by side, cache on and off.

(a) Shared prefix: a request with a ~1000-token document and a question,
    then one with the same document and another question. TTFT of both on
    each server, and whether the second's greedy answers are equal.
(b) Multi-turn chat: C conversations x T turns over /v1/chat/completions
    (streamed, the model's chat template), all sharing one system prompt.
    Each turn's C requests go together, first to the server without the
    cache, then to the one with it; the history sent is the first server's
    replies, so both get the same prompts.
The servers take turns, never run at once. Prints both tables in Markdown. Usage:
    .venv/bin/python -m perf.prefix_cache [--model PATH] [--conversations 8] [--turns 6] [--trials 3]
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any, NamedTuple

import httpx

from perf import servers

TIMEOUT = 600.0
TOPICS = (
    "billing",
    "shipping",
    "returns",
    "warranty",
    "accounts",
    "security",
    "repairs",
    "delivery",
    "stock",
    "payments",
)


def handbook(seed: int, sections: int) -> str:
    """A text of about 20 tokens a section, its own from its first words."""
    rng = random.Random(seed)
    lines = [f"Handbook {seed}: how the support desk of shop number {seed} works."]
    for i in range(sections):
        topic, days, fee = rng.choice(TOPICS), rng.randrange(2, 30), rng.randrange(1, 99)
        lines.append(
            f"Rule {i + 1}. For {topic} cases, answer within {days} days; the fee is {fee} euros unless the customer "
            "is a member."
        )
    return "\n".join(lines)


class Streamed(NamedTuple):
    ttft: float  # seconds to the first token
    seconds: float  # in all
    text: str
    prompt_tokens: int
    completion_tokens: int


def stream(client: httpx.Client, path: str, body: dict) -> Streamed:
    """One streamed OpenAI request, greedy."""
    body = {**body, "temperature": 0, "stream": True, "stream_options": {"include_usage": True}}
    t0 = time.perf_counter()
    ttft, pieces, usage = None, [], {"prompt_tokens": 0, "completion_tokens": 0}
    # A connection each: a server may close an idle kept-alive one while another server runs.
    with client.stream("POST", path, json=body, headers={"Connection": "close"}) as r:
        r.raise_for_status()
        for line in r.iter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            event = json.loads(line[6:])
            usage = event.get("usage") or usage
            for choice in event["choices"]:
                piece = choice["delta"].get("content") if "delta" in choice else choice.get("text")
                if ttft is None and (piece or choice.get("finish_reason")):
                    ttft = time.perf_counter() - t0
                pieces.append(piece or "")
    assert ttft is not None, "the stream ended without a token"
    return Streamed(ttft, time.perf_counter() - t0, "".join(pieces), usage["prompt_tokens"], usage["completion_tokens"])


def idle(client: httpx.Client, since: dict | None = None) -> dict:
    """/health's full data once the engine is idle and has stepped since ``since``: its figures
    are then final (it sends them on going idle, just after the last reply)."""
    deadline = time.monotonic() + 60
    while True:
        data = client.get("/health", params={"level": "full"}).json()["data"]
        settled = data["queue"] == {"in_flight": 0, "running": 0, "waiting": 0}
        if settled and (since is None or data["engine"]["steps"] > since["engine"]["steps"]):
            return data
        if time.monotonic() > deadline:
            raise RuntimeError(f"the server at {client.base_url} did not go idle")
        time.sleep(0.05)


def reused(client: httpx.Client, before: dict) -> int:
    """Prompt tokens the cache gave since ``before`` (an idle() answer)."""
    return idle(client, before)["prefix_cache"]["hit_tokens"] - before["prefix_cache"]["hit_tokens"]


def shared_prefix(off: httpx.Client, on: httpx.Client, trials: int, sections: int, max_tokens: int) -> list[dict]:
    rows = []
    for trial in range(trials):
        doc = handbook(1000 + trial, sections)
        first, second = (
            f"{doc}\n\nQuestion: {q}\nAnswer:"
            for q in ("What is the fee for returns?", "How fast are repairs answered?")
        )
        row: dict[str, Any] = {}
        for name, client in (("off", off), ("on", on)):
            row[f"cold_{name}"] = stream(client, "/v1/completions", {"prompt": first, "max_tokens": max_tokens}).ttft
            before = idle(client)
            warm = stream(client, "/v1/completions", {"prompt": second, "max_tokens": max_tokens})
            row[f"warm_{name}"], row[f"text_{name}"], row["prompt_tokens"] = warm.ttft, warm.text, warm.prompt_tokens
            row[f"reused_{name}"] = reused(client, before)
        rows.append(row)
    return rows


def chat(
    off: httpx.Client, on: httpx.Client, conversations: int, turns: int, sections: int, max_tokens: int
) -> list[dict]:
    system = {
        "role": "system",
        "content": "You are the support desk. Answer from this handbook.\n" + handbook(7, sections),
    }
    rng = random.Random(7)
    histories = [[system] for _ in range(conversations)]
    rows = []
    with ThreadPoolExecutor(conversations) as pool:
        for turn in range(1, turns + 1):
            for history in histories:
                history.append(
                    {
                        "role": "user",
                        "content": f"Customer {rng.randrange(1000)} asks about {rng.choice(TOPICS)}: what applies?",
                    }
                )
            row: dict[str, Any] = {"turn": turn}
            for name, client in (("off", off), ("on", on)):
                before = idle(client)

                def ask(history, client=client):
                    return stream(client, "/v1/chat/completions", {"messages": history, "max_tokens": max_tokens})

                results = [(r.ttft, r.text, r.prompt_tokens) for r in pool.map(ask, histories)]
                row[f"ttft_{name}"], row[f"texts_{name}"], row["prompt_tokens"] = (list(x) for x in zip(*results))
                row[f"reused_{name}"] = reused(client, before)
            for history, text in zip(histories, row["texts_off"]):
                history.append({"role": "assistant", "content": text})
            rows.append(row)
    return rows


def shared_prefix_table(rows: list[dict]) -> str:
    lines = [
        "| document | prompt tokens | reused (cache on) | TTFT, 1st request: off / on | TTFT, 2nd request: off / on | "
        "speed-up | same answer |",
        "|---|---|---|---|---|---|---|",
    ]
    for i, r in enumerate(rows, 1):
        lines.append(
            f"| {i} | {r['prompt_tokens']} | {r['reused_on']} | {r['cold_off']:.3f} s / {r['cold_on']:.3f} s "
            f"| {r['warm_off']:.3f} s / {r['warm_on']:.3f} s | {r['warm_off'] / r['warm_on']:.1f}x "
            f"| {'yes' if r['text_on'] == r['text_off'] else 'NO'} |"
        )
    return "\n".join(lines)


def chat_table(rows: list[dict]) -> str:
    lines = [
        "| turn | prompt tokens (mean) | reused by the cache (mean) | TTFT off: mean / max | TTFT on: mean / max | "
        "speed-up (mean) | same reply |",
        "|---|---|---|---|---|---|---|",
    ]
    n = len(rows[0]["ttft_on"])
    for r in rows:
        off, on = r["ttft_off"], r["ttft_on"]
        same = sum(a == b for a, b in zip(r["texts_on"], r["texts_off"]))
        lines.append(
            f"| {r['turn']} | {statistics.mean(r['prompt_tokens']):.0f} | {r['reused_on'] / n:.0f} "
            f"| {statistics.mean(off):.2f} s / {max(off):.2f} s | {statistics.mean(on):.2f} s / {max(on):.2f} s "
            f"| {statistics.mean(off) / statistics.mean(on):.1f}x | {same}/{n} |"
        )
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    servers.add_arguments(ap, seq_ctx=2048)
    ap.add_argument("--trials", type=int, default=3, help="documents in (a)")
    ap.add_argument("--sections", type=int, default=32, help="handbook rules in (a): 32 make ~1000 tokens")
    ap.add_argument("--conversations", type=int, default=8)
    ap.add_argument("--turns", type=int, default=6)
    ap.add_argument("--max-tokens", type=int, default=48, help="tokens in an answer")
    args = ap.parse_args()
    settings = servers.settings_of(args)
    with (
        servers.start("cllm", settings, label="cllm-no-prefix-cache", args=("--no-prefix-cache",)) as off_server,
        servers.start("cllm", settings) as on_server,
        httpx.Client(base_url=off_server.url, timeout=TIMEOUT) as off,
        httpx.Client(base_url=on_server.url, timeout=TIMEOUT) as on,
    ):
        for client in (off, on):  # the first decodes build llama.cpp's graphs
            stream(client, "/v1/completions", {"prompt": "Warm up.", "max_tokens": 4})
        prefix_rows = shared_prefix(off, on, args.trials, args.sections, args.max_tokens)
        chat_rows = chat(off, on, args.conversations, args.turns, args.sections // 3, args.max_tokens)
        on_figures = idle(on)["prefix_cache"]
    print(
        f"\n(a) A request sharing a ~{prefix_rows[0]['prompt_tokens']}-token prefix with an earlier one "
        f"(greedy, {args.max_tokens} tokens, streamed)\n"
    )
    print(shared_prefix_table(prefix_rows))
    print(
        f"\n(b) Multi-turn chat: {args.conversations} conversations x {args.turns} turns, one shared system prompt, "
        f"each turn's {args.conversations} requests together (greedy, up to {args.max_tokens} tokens)\n"
    )
    print(chat_table(chat_rows))
    print(
        f"\ncache-on server in all: {on_figures['hits']} hits, {on_figures['misses']} misses, "
        f"{on_figures['hit_tokens']} tokens reused; --parallel {args.parallel}, {args.seq_ctx} cells a sequence, "
        f"{args.threads} threads"
    )


if __name__ == "__main__":
    main()
