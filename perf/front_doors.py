"""What the chat front doors cost: the same greedy request through /v1/chat/completions, /v1/messages and /v1/responses.

(a) One cllm server; streamed requests (fresh prompts, exactly G tokens each,
    ignore_eos) at each concurrency, the three routes taking turns round by
    round so that the machine's drift falls on all of them alike. Prints tok/s
    and TTFT p50 per route, the frontend's CPU time per generated token (the
    routes' own cost, which the machine's load moves far less), and their
    ratios to chat completions.
(b) previous_response_id against resending: two conversations of T turns on
    /v1/responses, streamed, greedy, distinct from their first token (so they
    share no cache). One continues each turn from its stored previous
    response, the other sends its whole history as input items. Prints the
    TTFT of each turn for both.
Usage:
    .venv/bin/python -m perf.front_doors [--model PATH] [--concurrency 1,8] [--rounds 3] [--gen-tokens 64] [--turns 6]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time

import httpx

from cllm.model_file import resolve_model
from cllm.bench import http_load
from perf import servers

ROUTES = ("chat", "messages", "responses")


def compare_routes(url: str, pid: int, concurrencies: list[int], rounds: int, gen_tokens: int, prompt_tokens: int) -> dict:
    results: dict = {}
    for c in concurrencies:
        requests = 4 * c if c > 1 else 6
        cells: dict[str, list[dict]] = {route: [] for route in ROUTES}
        for r in range(rounds):
            order = ROUTES[r % 3 :] + ROUTES[: r % 3]  # each route goes first in turn
            for route in order:
                cell = http_load.run_cell(
                    url, http_load.make_dialect(route), c, requests, prompt_tokens, gen_tokens, True, pids=[pid], progress=False
                )
                if cell["errors"] or cell["short"]:
                    raise RuntimeError(f"{route} c={c}: {cell['errors']} errors, {cell['short']} short answers ({cell['first_error']})")
                cells[route].append(cell)
        results[c] = {
            route: {
                "tokens_per_second": statistics.mean(x["tokens_per_second"] for x in cs),
                "ttft_p50": statistics.mean(x["ttft"]["p50"] for x in cs),
                # The route's own cost: the frontend's CPU per generated token (the machine's load moves it far less).
                "frontend_ms": statistics.mean(x["cpu_ms_per_token"]["frontend"] for x in cs),
            }
            for route, cs in cells.items()
        }
    return results


def _ttft(client: httpx.Client, body: dict) -> tuple[float, str, str | None]:
    """(TTFT, the reply's text, the response id) of one streamed /v1/responses request."""
    t0 = time.perf_counter()
    ttft, text, rid = None, [], None
    with client.stream("POST", "/v1/responses", json={**body, "stream": True}) as r:
        r.raise_for_status()
        for line in r.iter_lines():
            if not line.startswith("data: "):
                continue
            event = json.loads(line[6:])
            if event["type"] == "response.output_text.delta":
                ttft = ttft if ttft is not None else time.perf_counter() - t0
                text.append(event["delta"])
            elif event["type"] in ("response.completed", "response.incomplete"):
                rid = event["response"]["id"]
    return ttft, "".join(text), rid


def compare_continuation(url: str, turns: int, gen_tokens: int) -> list[dict]:
    questions = [f"Question {i + 1}: tell me one more fact about rivers, in a calm and precise voice." for i in range(turns)]
    rows = []
    with httpx.Client(base_url=url, timeout=600) as client:
        previous, history = None, []
        for i, question in enumerate(questions):
            common = {"model": "default", "temperature": 0, "ignore_eos": True, "max_output_tokens": gen_tokens}
            # Distinct instructions from the first token: the two conversations share no cached prefix.
            chained = {**common, "instructions": "[A] You are a helpful assistant.", "input": question}
            if previous is not None:
                chained["previous_response_id"] = previous
            t_chain, _, previous = _ttft(client, chained)
            history.append({"role": "user", "content": question})
            resent = {**common, "instructions": "[B] You are a helpful assistant.", "input": history, "store": False}
            t_resend, reply, _ = _ttft(client, resent)
            history.append({"role": "assistant", "content": reply})
            rows.append({"turn": i + 1, "previous_response_id": t_chain, "resent": t_resend})
    return rows


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m perf.front_doors", description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default=None, help="GGUF file (default: the embedded SmolLM2)")
    ap.add_argument("--threads", type=int, default=os.cpu_count())
    ap.add_argument("--concurrency", default="1,8")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--gen-tokens", type=int, default=64)
    ap.add_argument("--prompt-tokens", type=int, default=26)
    ap.add_argument("--turns", type=int, default=6)
    args = ap.parse_args(argv)
    settings = servers.Settings(resolve_model(args.model), args.threads, 8, 2048)
    with servers.start("cllm", settings, label="cllm-front-doors") as server:
        http_load.warm_up(server.url, http_load.make_dialect("chat"), 8)
        routes = compare_routes(server.url, server.proc.pid, [int(c) for c in args.concurrency.split(",")], args.rounds, args.gen_tokens, args.prompt_tokens)
        turns = compare_continuation(server.url, args.turns, args.gen_tokens)
    print(f"\n{args.rounds} rounds, {args.gen_tokens} tokens, streamed, {args.threads} threads; load average {os.getloadavg()[0]:.1f}\n")
    print("| c | route | tok/s | x chat | TTFT p50 (s) | x chat | frontend CPU ms/token | x chat |\n|---|---|---|---|---|---|---|---|")
    for c, by_route in routes.items():
        base = by_route["chat"]
        for route, r in by_route.items():
            print(f"| {c} | {http_load.CHAT_PATHS[route]} | {r['tokens_per_second']:.1f} | {r['tokens_per_second'] / base['tokens_per_second']:.3f}"
                  f" | {r['ttft_p50']:.3f} | {r['ttft_p50'] / base['ttft_p50']:.3f}"
                  f" | {r['frontend_ms']:.3f} | {r['frontend_ms'] / base['frontend_ms']:.3f} |")
    print("\n| turn | TTFT previous_response_id (s) | TTFT resent (s) | ratio |\n|---|---|---|---|")
    for row in turns:
        print(f"| {row['turn']} | {row['previous_response_id']:.3f} | {row['resent']:.3f} | {row['previous_response_id'] / row['resent']:.3f} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
