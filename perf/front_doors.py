"""What the chat front doors cost: the same greedy request through /v1/chat/completions, /v1/messages, /v1/responses and
/api/chat.

(a) One cllm server; streamed requests (fresh prompts, exactly G tokens each,
    ignore_eos; Ollama's /api/chat streams JSON lines where the others send
    server-sent events) at each concurrency, the routes taking turns round by
    round so that the machine's drift falls on all of them alike. Prints tok/s
    and TTFT p50 per route, the frontend's CPU time per generated token (the
    routes' own cost, which the machine's load moves far less), and their
    ratios to chat completions: per round, then the median over rounds.
(b) previous_response_id against resending: two conversations of T turns on
    /v1/responses, streamed, greedy, distinct from their first token (so they
    share no cache). One continues each turn from its stored previous
    response, the other sends its whole history as input items. Prints the
    TTFT of each turn for both, and the prompt tokens the prefix cache served.
Usage:
    .venv/bin/python -m perf.front_doors [--model PATH] [--concurrency 1,8] [--rounds 3] [--min-requests 24]
    [--gen-tokens 64]
        [--turns 6] [--max-others 0.5] [--tries 3] [--patience 60]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time

import httpx
import psutil

from cllm.bench import dialects, http_load
from cllm.core.model_file import resolve_model
from perf import servers

ROUTES = ("chat", "messages", "responses", "ollama")


def _busy_seconds() -> float:
    """CPU seconds every core of the machine has spent busy, whoever ran."""
    t = psutil.cpu_times()
    return sum(t) - t.idle - getattr(t, "iowait", 0.0)


def wait_quiet(max_others: float, patience: float) -> None:
    """Wait (at most `patience` seconds) until the machine is busy on fewer than `max_others` cores (this bench is idle
    then)."""
    deadline = time.monotonic() + patience
    while psutil.cpu_percent(interval=3) / 100 * (psutil.cpu_count() or 1) > max_others and time.monotonic() < deadline:
        pass


def measured_cell(
    url: str,
    pid: int,
    route: str,
    dialect: dialects.Dialect,
    c: int,
    requests: int,
    prompt_tokens: int,
    gen_tokens: int,
    max_others: float,
    tries: int,
    patience: float,
) -> dict:
    """One cell, repeated (up to `tries` times) while other work used more than `max_others` cores during it.

    Records with it the 1-minute load average at its end (what `uptime` shows:
    this bench's own server and client included) and the cores other
    processes kept busy meanwhile (the machine's busy time less this bench's).
    """
    for attempt in range(tries):
        wait_quiet(max_others, patience)
        busy0 = _busy_seconds()
        cell = http_load.run_cell(
            url, dialect, c, requests, prompt_tokens, gen_tokens, True, pids=[pid], progress=False
        )
        ours = sum(cell["cpu_seconds"].values()) + cell["client_cpu_seconds"]
        cell["others_cores"] = max(0.0, (_busy_seconds() - busy0 - ours) / cell["seconds"])
        cell["load1"] = os.getloadavg()[0]
        cell["attempts"] = attempt + 1
        if cell["errors"] or cell["short"]:
            raise RuntimeError(
                f"{route} c={c}: {cell['errors']} errors, {cell['short']} short answers ({cell['first_error']})"
            )
        if cell["others_cores"] <= max_others:
            break
    return cell


def ollama_name(url: str) -> str:
    """The served model's name on Ollama's routes (the chat routes take any name when one model is served)."""
    return httpx.get(f"{url}/api/tags", timeout=60).json()["models"][0]["model"]


def compare_routes(
    url: str,
    pid: int,
    concurrencies: list[int],
    rounds: int,
    gen_tokens: int,
    prompt_tokens: int,
    max_others: float,
    tries: int,
    patience: float,
    min_requests: int,
) -> dict:
    results: dict = {}
    for c in concurrencies:
        requests = max(4 * c, min_requests)
        cells: dict[str, list[dict]] = {route: [] for route in ROUTES}
        by_route = {route: dialects.make_dialect(route, ollama_name(url)) for route in ROUTES}
        for r in range(rounds):
            order = ROUTES[r % len(ROUTES) :] + ROUTES[: r % len(ROUTES)]  # each route goes first in turn
            for route in order:
                cells[route].append(
                    measured_cell(
                        url,
                        pid,
                        route,
                        by_route[route],
                        c,
                        requests,
                        prompt_tokens,
                        gen_tokens,
                        max_others,
                        tries,
                        patience,
                    )
                )
        results[c] = {
            route: {
                # Each round's ratio to chat completions, then their median: the machine's drift between rounds cancels.
                "tps_ratio": statistics.median(
                    x["tokens_per_second"] / b["tokens_per_second"] for x, b in zip(cs, cells["chat"])
                ),
                "ttft_ratio": statistics.median(x["ttft"]["p50"] / b["ttft"]["p50"] for x, b in zip(cs, cells["chat"])),
                "tokens_per_second": statistics.mean(x["tokens_per_second"] for x in cs),
                "ttft_p50": statistics.mean(x["ttft"]["p50"] for x in cs),
                # The route's own cost: the frontend's CPU per generated token (the machine's load moves it far less).
                "frontend_ms": statistics.mean(x["cpu_ms_per_token"]["frontend"] for x in cs),
                "load1": [round(x["load1"], 2) for x in cs],
                "others_cores": [round(x["others_cores"], 2) for x in cs],
                "attempts": sum(x["attempts"] for x in cs),
            }
            for route, cs in cells.items()
        }
    return results


def _ttft(client: httpx.Client, body: dict) -> tuple[float, str, str | None, tuple[int, int]]:
    """(TTFT, the reply's text, the response id, (cached, input) tokens) of one streamed /v1/responses request."""
    t0 = time.perf_counter()
    ttft: float | None = None
    text: list[str] = []
    rid, tokens = None, (0, 0)
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
                rid, usage = event["response"]["id"], event["response"]["usage"]
                tokens = (usage["input_tokens_details"]["cached_tokens"], usage["input_tokens"])
    assert ttft is not None, "the stream ended without a token"
    return ttft, "".join(text), rid, tokens


def compare_continuation(url: str, turns: int, gen_tokens: int) -> list[dict]:
    questions = [
        f"Question {i + 1}: tell me one more fact about rivers, in a calm and precise voice." for i in range(turns)
    ]
    rows = []
    with httpx.Client(base_url=url, timeout=600) as client:
        previous, history = None, []
        for i, question in enumerate(questions):
            common = {"model": "default", "temperature": 0, "ignore_eos": True, "max_output_tokens": gen_tokens}
            # Distinct instructions from the first token: the two conversations share no cached prefix.
            chained = {**common, "instructions": "[A] You are a helpful assistant.", "input": question}
            if previous is not None:
                chained["previous_response_id"] = previous
            t_chain, _, previous, chain_tokens = _ttft(client, chained)
            history.append({"role": "user", "content": question})
            resent = {**common, "instructions": "[B] You are a helpful assistant.", "input": history, "store": False}
            t_resend, reply, _, resent_tokens = _ttft(client, resent)
            history.append({"role": "assistant", "content": reply})
            rows.append(
                {
                    "turn": i + 1,
                    "previous_response_id": t_chain,
                    "resent": t_resend,
                    "chain_tokens": chain_tokens,
                    "resent_tokens": resent_tokens,
                    "load1": os.getloadavg()[0],
                }
            )
    return rows


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m perf.front_doors", description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default=None, help="GGUF file (default: the embedded SmolLM2)")
    ap.add_argument("--threads", type=int, default=os.cpu_count())
    ap.add_argument("--concurrency", default="1,8")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--min-requests", type=int, default=24, help="requests a cell at least (else 4 per stream)")
    ap.add_argument("--gen-tokens", type=int, default=64)
    ap.add_argument("--prompt-tokens", type=int, default=26)
    ap.add_argument("--turns", type=int, default=6)
    ap.add_argument(
        "--max-others", type=float, default=0.5, help="a cell during which other work kept more cores busy is run again"
    )
    ap.add_argument("--tries", type=int, default=3, help="most runs of one cell")
    ap.add_argument(
        "--patience", type=float, default=60.0, help="seconds to wait for a quiet machine before each run of a cell"
    )
    args = ap.parse_args(argv)
    settings = servers.Settings(resolve_model(args.model), args.threads, 8, 2048)
    with servers.start("cllm", settings, label="cllm-front-doors") as server:
        http_load.warm_up(server.url, dialects.make_dialect("chat"), 8)
        routes = compare_routes(
            server.url,
            server.proc.pid,
            [int(c) for c in args.concurrency.split(",")],
            args.rounds,
            args.gen_tokens,
            args.prompt_tokens,
            args.max_others,
            args.tries,
            args.patience,
            args.min_requests,
        )
        turns = compare_continuation(server.url, args.turns, args.gen_tokens)
    print(
        f"\n{args.rounds} rounds, {args.gen_tokens} tokens, streamed, {args.threads} threads; load average "
        f"{os.getloadavg()[0]:.1f}\n"
    )
    print("x chat: the median over rounds of the route's figure ÷ chat completions' in the same round.\n")
    print(
        "| c | route | tok/s | x chat | TTFT p50 (s) | x chat | frontend CPU ms/token | x chat | load (1 min) | "
        "others' cores | runs |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    for c, by_route in routes.items():
        base = by_route["chat"]
        for route, r in by_route.items():
            print(
                f"| {c} | {dialects.CHAT_PATHS[route]} | {r['tokens_per_second']:.1f} | {r['tps_ratio']:.3f}"
                f" | {r['ttft_p50']:.3f} | {r['ttft_ratio']:.3f}"
                f" | {r['frontend_ms']:.3f} | {r['frontend_ms'] / base['frontend_ms']:.3f}"
                f" | {', '.join(map(str, r['load1']))} | {', '.join(map(str, r['others_cores']))} | {r['attempts']} |"
            )
    print(
        "\n| turn | TTFT previous_response_id (s) | cached/input tokens | TTFT resent (s) | cached/input tokens | "
        "ratio | load (1 min) |"
    )
    print("|---|---|---|---|---|---|---|")
    for row in turns:
        print(
            f"| {row['turn']} | {row['previous_response_id']:.3f} | {'/'.join(map(str, row['chain_tokens']))} | "
            f"{row['resent']:.3f}"
            f" | {'/'.join(map(str, row['resent_tokens']))} | {row['previous_response_id'] / row['resent']:.3f} | "
            f"{row['load1']:.2f} |"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
