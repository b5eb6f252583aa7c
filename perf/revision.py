"""Plain throughput of this tree's cllm against another git revision's (or against itself with other options), fresh
servers taking turns.

Both are started alike (`cllm serve` on the same model, threads, parallel
sequences and KV cells), one at a time: a fresh server per run, in the order
A B B A A B (A: this tree), so a drift of the machine's speed weighs on both.
Each run warms up and then loads fresh prompts at every concurrency, as
`cllm bench http` does. The revision is unpacked with `git archive` into
perf/cache/rev-<commit>/ (kept for the next call) and run with this tree's
Python environment. On this 2-core machine one server's runs spread by up to
~10% at c=1, so the ratio of the means over several runs is what to read.

With --this-args, this tree's server gets more options than the other's
(with no --rev, the other is this tree too: an option's cost, side by side).

    .venv/bin/python -m perf.revision --rev 56bdaa5 [--runs 6] [--concurrency 1,8,32] [--gen-tokens 50] [--stream]
    .venv/bin/python -m perf.revision --this-args '--cache-dir /tmp/c' [--rev 56bdaa5]
"""

from __future__ import annotations

import argparse
import os
import statistics

from cllm.bench import dialects, http_load
from cllm.bench.prompts import BASE_TOKENS, requests_for
from perf import servers


def one_run(tree: str, settings: servers.Settings, label: str, args, extra: tuple[str, ...] = ()) -> dict[int, float]:
    """Start `cllm serve` from the tree (``extra``: more options), load it at each concurrency, stop it: tok/s by
    concurrency."""
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
                requests_for(c),
                args.prompt_tokens,
                args.gen_tokens,
                args.stream,
                progress=False,
            )
            if r["errors"]:
                raise RuntimeError(f"{label}: {r['errors']} errors at c={c}, the first: {r['first_error']}")
            out[c] = r["tokens_per_second"]
        return out


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
    args = ap.parse_args()
    if args.parallel < max(args.concurrency):
        args.parallel = max(args.concurrency)
    settings = servers.settings_of(args)
    commit, old_tree = servers.unpack(args.rev) if args.rev else ("this tree", servers.ROOT)
    this = tuple(args.this_args.split())
    order = ("AB", "BA") * (args.runs // 2)
    got: dict[str, list[dict[int, float]]] = {"A": [], "B": []}
    load0 = os.getloadavg()[0]
    for i, pair in enumerate(order):
        for who in pair:
            tree, label, extra = (servers.ROOT, "cllm-this", this) if who == "A" else (old_tree, "cllm-rev", ())
            got[who].append(one_run(tree, settings, label, args, extra))
            print(
                f"run {i + 1} {'this tree' if who == 'A' else commit[:12]}: "
                + ", ".join(f"c={c} {t:.1f}" for c, t in got[who][-1].items())
                + f" tok/s; load {os.getloadavg()[0]:.1f}",
                flush=True,
            )
    print(
        f"\n# this tree{(' with ' + args.this_args) if this else ''} against {commit[:12]}: {len(order)} runs each, "
        f"fresh prompts of ~{args.prompt_tokens} tokens, "
        f"{args.gen_tokens} tokens, {'streamed' if args.stream else 'not streamed'}, --parallel {settings.parallel}, "
        f"{settings.threads} threads; load {load0:.1f} at the start, {os.getloadavg()[0]:.1f} at the end\n"
    )
    print(
        f"| c | this tree{' ' + args.this_args if this else ''} tok/s (mean) | {commit[:12]} tok/s (mean) | ratio of "
        "the means | median of the pairs' ratios |"
    )
    print("|---|---|---|---|---|")
    for c in args.concurrency:
        a, b = [r[c] for r in got["A"]], [r[c] for r in got["B"]]
        print(
            f"| {c} | {statistics.mean(a):.1f} | {statistics.mean(b):.1f} | "
            f"{statistics.mean(a) / statistics.mean(b):.3f} "
            f"| {statistics.median(x / y for x, y in zip(a, b)):.3f} |"
        )


if __name__ == "__main__":
    main()
