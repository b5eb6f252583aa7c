"""Plain throughput of this tree's cllm against another git revision's (or against itself with other options), fresh
servers taking turns.

Both are started alike (`cllm serve` on the same model, threads, parallel
sequences and KV cells), one at a time: a fresh server per run, in the order
A B B A A B (A: this tree), so a drift of the machine's speed weighs on both.
Each run warms up and then loads fresh prompts at every concurrency, as
`cllm bench http` does. The revision is unpacked with `git archive` into
perf/cache/rev-<commit>/ (kept for the next call) and run with this tree's
Python environment. One server's runs spread from run to run (most at c=1),
so the ratio of the means over several runs is what to read.

With --this-args, this tree's server gets more options than the other's
(with no --rev, the other is this tree too: an option's cost, side by side).

    .venv/bin/python -m perf.revision --rev 56bdaa5 [--runs 6] [--concurrency 1,8,32] [--gen-tokens 50] [--stream]
        [-n REQUESTS]   (streamed, it also shows tokens an event, ITL p50 and the frontend's CPU a token)
    .venv/bin/python -m perf.revision --this-args '--cache-dir /tmp/c' [--rev 56bdaa5]
"""

from __future__ import annotations

import argparse
import os
import statistics

from cllm.bench import dialects, http_load
from cllm.bench.prompts import BASE_TOKENS, requests_for
from perf import servers


def one_run(tree: str, settings: servers.Settings, label: str, args, extra: tuple[str, ...] = ()) -> dict[int, dict]:
    """Start `cllm serve` from the tree (``extra``: more options), load it at each concurrency, stop it: the cells
    (cllm.bench.http_load.run_cell) by concurrency."""
    cmd, ready = servers.command("cllm", settings, port := servers.free_port())
    with servers.launch("cllm", [*cmd, *extra], port, ready, label=label, cwd=tree) as server:
        dialect = dialects.make_dialect("cllm")
        http_load.warm_up(server.url, dialect, max(args.concurrency))
        out = {}
        for c in args.concurrency:
            r = http_load.run_cell(
                server.url,
                dialect,
                c,
                args.requests or requests_for(c),
                args.prompt_tokens,
                args.gen_tokens,
                args.stream,
                [server.proc.pid],
                progress=False,
            )
            if r["errors"]:
                raise RuntimeError(f"{label}: {r['errors']} errors at c={c}, the first: {r['first_error']}")
            out[c] = r
        return out


def streamed(cells: list[dict]) -> str:
    """A streamed cell's figures over runs (means): tokens an event, ITL p50, the frontend's CPU ms a token."""
    per_event = statistics.mean(r["tokens_per_event"] for r in cells)
    itl = statistics.mean(r["itl"]["p50"] for r in cells)
    frontend = statistics.mean(r["cpu_ms_per_token"].get("frontend", 0.0) for r in cells)
    return f"{per_event:.2f} / {1000 * itl:.1f} / {frontend:.3f}"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    servers.add_arguments(ap, seq_ctx=512)
    ap.add_argument("--rev", help="the git revision to compare against (e.g. a commit of main; default: this tree)")
    ap.add_argument("--this-args", default="", help="more `cllm serve` options for this tree's server only")
    ap.add_argument("--runs", type=int, default=6, help="runs of each, in the order A B B A A B (a multiple of 2)")
    ap.add_argument("--concurrency", type=lambda s: [int(c) for c in s.split(",")], default=[1, 8, 32])
    ap.add_argument("-p", "--prompt-tokens", type=int, default=BASE_TOKENS)
    ap.add_argument("-g", "--gen-tokens", type=int, default=50)
    ap.add_argument("--stream", action="store_true")
    ap.add_argument("-n", "--requests", type=int, help="requests a cell (default: 5 x concurrency, 8 to 160)")
    args = ap.parse_args()
    if args.parallel < max(args.concurrency):
        args.parallel = max(args.concurrency)
    settings = servers.settings_of(args)
    commit, old_tree = servers.unpack(args.rev) if args.rev else ("this tree", servers.ROOT)
    this = tuple(args.this_args.split())
    order = ("AB", "BA") * (args.runs // 2)
    got: dict[str, list[dict[int, dict]]] = {"A": [], "B": []}
    load0 = os.getloadavg()[0]
    for i, pair in enumerate(order):
        for who in pair:
            tree, label, extra = (servers.ROOT, "cllm-this", this) if who == "A" else (old_tree, "cllm-rev", ())
            got[who].append(one_run(tree, settings, label, args, extra))
            print(
                f"run {i + 1} {'this tree' if who == 'A' else commit[:12]}: "
                + ", ".join(f"c={c} {r['tokens_per_second']:.1f}" for c, r in got[who][-1].items())
                + f" tok/s; load {os.getloadavg()[0]:.1f}",
                flush=True,
            )
    print(
        f"\n# this tree{(' with ' + args.this_args) if this else ''} against {commit[:12]}: {len(order)} runs each, "
        f"fresh prompts of ~{args.prompt_tokens} tokens, "
        f"{args.gen_tokens} tokens, {'streamed' if args.stream else 'not streamed'}, --parallel {settings.parallel}, "
        f"{settings.threads} threads; load {load0:.1f} at the start, {os.getloadavg()[0]:.1f} at the end\n"
    )
    also = " | tokens an event / ITL p50 ms / frontend CPU ms a token: this tree | the other" if args.stream else ""
    print(
        f"| c | this tree{' ' + args.this_args if this else ''} tok/s (mean) | {commit[:12]} tok/s (mean) | ratio of "
        f"the means | median of the pairs' ratios (spread){also} |"
    )
    print("|---|---|---|---|---|" + ("---|---|" if args.stream else ""))
    for c in args.concurrency:
        a, b = [r[c]["tokens_per_second"] for r in got["A"]], [r[c]["tokens_per_second"] for r in got["B"]]
        pairs = [x / y for x, y in zip(a, b)]
        print(
            f"| {c} | {statistics.mean(a):.1f} | {statistics.mean(b):.1f} | "
            f"{statistics.mean(a) / statistics.mean(b):.3f} "
            f"| {statistics.median(pairs):.3f} ({min(pairs):.3f}-{max(pairs):.3f}) |"
            + (f" {streamed([r[c] for r in got['A']])} | {streamed([r[c] for r in got['B']])} |" if args.stream else "")
        )


if __name__ == "__main__":
    main()
