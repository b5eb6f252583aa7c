"""Speculative decoding, side by side: cllm with and without it, llama-server with its n-gram drafters and without.

Every server gets the same GGUF file, threads, --parallel and KV cells per
sequence, and they run one after the other, never at once, the order turning
each round. Requests are chat completions, greedy, non-streamed, end to end
(a first run prefills its prompt); tok/s is completion tokens over wall time.

  copy      copy a code file, edit one (rename a name everywhere), quote a
            passage of a text, copy a text: a new file and text each round
            (Python's standard library), so a round's first run is a first
  ordinary  prompts that copy nothing (cllm/bench/prompts.py), a new set each round

Each round and concurrency (c prompts at once; at c = 1 the 4 one after
another) asks every prompt of the set, the **first** run, then the same
requests again, the **repeated** run, whose answers the server produced
once. cllm is asked with an API key (it is started with two); its third run,
**other key**, is the repeated run with the other key, which its memory of
earlier answers must not help (llama-server's table has no keys: its
repeated run is what another client would get there too).

Drafted and accepted tokens: llama-server's counters on cllm's /metrics;
llama-server's `timings`. Prints cllm ÷ llama-server's best configuration
per cell, and each cell's spread (lowest-highest of its rounds).
Usage:
    .venv/bin/python -m perf.speculative [--model PATH|smollm2-f16] [--rounds 2] [--workloads copy,ordinary]
        [--systems cllm-draft,cllm-nospec,llama-server-draft,llama-server-none] [--draft FILE]
"""

from __future__ import annotations

import argparse
import importlib
import inspect
import os
import statistics
import time
from concurrent.futures import ThreadPoolExecutor

import httpx

from cllm.bench.prompts import make_prompts
from cllm.core.model_file import resolve_model
from perf import servers
from perf.models import MODELS, model_path

TIMEOUT = 900.0
SYSTEMS = {  # label: (system, extra command-line arguments)
    "cllm": ("cllm", ("--spec-type", "ngram")),
    "cllm-nospec": ("cllm", ("--spec-type", "none")),
    "llama-server-ngram-mod": ("llama-server", ("--spec-type", "ngram-mod")),
    "llama-server-ngram-simple": ("llama-server", ("--spec-type", "ngram-simple")),
    "llama-server-ngram-map-k": ("llama-server", ("--spec-type", "ngram-map-k")),
    "llama-server-ngram-map-k4v": ("llama-server", ("--spec-type", "ngram-map-k4v")),
    "llama-server-ngram-cache": ("llama-server", ("--spec-type", "ngram-cache")),
    # Combined, a slot's draft comes from the first type that has one, in llama.cpp's order (simple, map-k, map-k4v,
    # mod, cache): per-slot lookups first, then the shared table.
    "llama-server-ngram-map-k4v+mod": ("llama-server", ("--spec-type", "ngram-map-k4v,ngram-mod")),
    "llama-server-ngram-all": (
        "llama-server",
        ("--spec-type", "ngram-simple,ngram-map-k,ngram-map-k4v,ngram-mod,ngram-cache"),
    ),
    "llama-server-none": ("llama-server", ()),
    # A draft model ({draft}: --draft, the embedded Q4_1 by default) for the target, as llama-server's -md takes it.
    "cllm-draft": ("cllm", ("--spec-type", "draft-simple", "-md", "{draft}")),
    "llama-server-draft": ("llama-server", ("--spec-type", "draft-simple", "-md", "{draft}")),
}
KEYS = ("bench-key-a", "bench-key-b")  # cllm's two clients
# Each round's texts: a module's code and a module's docstring, never one of an earlier round.
CODE = ("textwrap", "string", "shlex", "pprint", "calendar", "gettext", "queue", "fnmatch", "sched", "glob")
DOCS = ("json", "csv", "argparse", "statistics", "uuid", "heapq", "re", "unittest", "doctest", "sched")
CODE_CHARS, DOC_CHARS = 2400, 1500
SPEC = "llamacpp:spec_decode_num_"


def copy_tasks(i: int) -> list[str]:
    """The four copy tasks of text set ``i``."""
    code = inspect.getsource(importlib.import_module(CODE[i % len(CODE)]))[:CODE_CHARS]
    doc = (importlib.import_module(DOCS[i % len(DOCS)]).__doc__ or "")[:DOC_CHARS]
    name = max(set(code.replace("(", " ").replace(".", " ").split()), key=lambda w: (w.isidentifier(), len(w)))
    return [
        f"{code}\n\nRepeat the code above exactly, character for character, in a ```python block.",
        f"Rewrite this Python file with every `{name}` renamed to `{name}_v2`; change nothing else:\n\n"
        f"```python\n{code}\n```",
        f"{doc}\n\nQuote the first two paragraphs of the text above word for word.",
        f"Repeat the following text exactly:\n\n{doc}",
    ]


def chat(client: httpx.Client, prompt: str, max_tokens: int, key: str | None) -> dict:
    headers = {"Connection": "close", **({"Authorization": f"Bearer {key}"} if key else {})}
    r = client.post(
        "/v1/chat/completions",
        headers=headers,
        json={"messages": [{"role": "user", "content": prompt}], "max_tokens": max_tokens, "temperature": 0},
    )
    r.raise_for_status()
    return r.json()


def spec_counts(client: httpx.Client) -> dict[str, float]:
    text = client.get("/metrics", headers={"Authorization": f"Bearer {KEYS[0]}"}).text
    counts = {"draft_tokens": 0.0, "accepted_tokens": 0.0}
    for line in text.splitlines():
        for key in counts:
            if line.startswith(f"{SPEC}{key}_total"):
                counts[key] += float(line.rsplit(" ", 1)[1])
    return counts


def run(client: httpx.Client, cllm: bool, prompts: list[str], c: int, max_tokens: int, key: str | None):
    """Completion tok/s of the prompts at concurrency c, and the drafted and accepted tokens."""
    before = spec_counts(client) if cllm else None
    t0 = time.perf_counter()
    with ThreadPoolExecutor(c) as pool:
        answers = list(pool.map(lambda p: chat(client, p, max_tokens, key), prompts))
    seconds = time.perf_counter() - t0
    tokens = sum(a["usage"]["completion_tokens"] for a in answers)
    if before is not None:
        time.sleep(1.2)  # the engine's figures arrive at most once a second, and when it goes idle
        after = spec_counts(client)
        return tokens / seconds, tuple(after[k] - before[k] for k in ("draft_tokens", "accepted_tokens"))
    timings = [a.get("timings") or {} for a in answers]
    return tokens / seconds, tuple(sum(t.get(k, 0) for t in timings) for k in ("draft_n", "draft_n_accepted"))


def prompts_of(workload: str, c: int, r: int) -> list[str]:
    """Round r's prompts at concurrency c: at c = 1 the four tasks of a set, at c = 8 two sets' (every set new:
    round r's are 3r to 3r + 2)."""
    if workload == "ordinary":
        return make_prompts(max(c, 4), 32, seed=1000 * c + r)
    sets = max(1, c // 4)
    base = 3 * r + (c > 1)
    return [p for s in range(sets) for p in copy_tasks(base + s)][: max(c, 4)]


def measure(clients: dict, labels: list[str], args) -> tuple[dict, dict]:
    """{(workload, c, run): {label: [tok/s a round]}} and {label: [drafted, accepted]}."""
    got: dict = {}
    accept = {label: [0.0, 0.0] for label in labels}
    for r in range(args.rounds):
        print(f"round {r}: load average {os.getloadavg()[0]:.1f}", flush=True)
        for workload in args.workloads:
            tokens = args.max_tokens if workload == "copy" else args.ordinary_tokens
            for c in args.concurrency:
                prompts = prompts_of(workload, c, r)
                order = labels[r % len(labels) :] + labels[: r % len(labels)]
                for label in order:
                    cllm = SYSTEMS[label][0] == "cllm"
                    runs = [("first", KEYS[0]), ("repeated", KEYS[0])] + ([("other key", KEYS[1])] * (label == "cllm"))
                    for name, key in runs:
                        tok_s, (drafted, kept) = run(clients[label], cllm, prompts, c, tokens, key if cllm else None)
                        got.setdefault((workload, c, name), {}).setdefault(label, []).append(tok_s)
                        done = f"{tok_s:.1f} tok/s, {kept:.0f} of {drafted:.0f} drafted kept"
                        print(f"  {workload} c={c} {name} {label}: {done}", flush=True)
                        accept[label][0] += drafted
                        accept[label][1] += kept
    return got, accept


def table(got: dict, labels: list[str]) -> str:
    peers = [label for label in labels if label.startswith("llama-server")]
    head = ["workload", "c", "run", *labels]
    if peers and "cllm" in labels:
        head.append("cllm ÷ best llama-server")
    if "cllm-nospec" in labels and "cllm" in labels:
        head.append("cllm ÷ cllm-nospec")
    if "cllm-nospec" in labels and "cllm-draft" in labels:
        head.append("cllm-draft ÷ cllm-nospec")
    lines = ["| " + " | ".join(head) + " |", "|---" * len(head) + "|"]
    for (workload, c, name), by_label in got.items():
        med = {label: statistics.median(v) for label, v in by_label.items()}
        cells = []
        for label in labels:
            v = by_label.get(label)
            cells.append(f"{med[label]:.1f} ({min(v):.0f}-{max(v):.0f})" if v else "–")
        row = [workload, str(c), name, *cells]
        if "cllm ÷ best llama-server" in head:
            best = max((med[p] for p in peers if p in med), default=None)
            if name == "other key":  # what another client gets: llama-server's repeated run
                best = max((statistics.median(got[(workload, c, "repeated")][p]) for p in peers), default=None)
            row.append(f"{med['cllm'] / best:.2f}" if best else "–")
        if "cllm ÷ cllm-nospec" in head:
            # the other key's run finds its prompts cached, as a repeated run does
            nospec = med.get("cllm-nospec") or statistics.median(got[(workload, c, "repeated")]["cllm-nospec"])
            row.append(f"{med['cllm'] / nospec:.2f}")
        if "cllm-draft ÷ cllm-nospec" in head:
            both = "cllm-draft" in med and "cllm-nospec" in med  # not so in the other key's run
            row.append(f"{med['cllm-draft'] / med['cllm-nospec']:.2f}" if both else "–")
        lines.append("| " + " | ".join(row) + " |")
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    servers.add_arguments(ap, seq_ctx=4096)
    ap.add_argument("--workloads", default="copy,ordinary", type=lambda s: s.split(","))
    ap.add_argument("--systems", default=",".join(SYSTEMS), help="of: " + ", ".join(SYSTEMS))
    ap.add_argument("--concurrency", default="1,8", type=lambda s: [int(x) for x in s.split(",")])
    ap.add_argument("--max-tokens", type=int, default=256)
    ap.add_argument("--ordinary-tokens", type=int, default=128)
    ap.add_argument("--rounds", type=int, default=2, help="rounds of each cell, the servers' order turning (at most 3)")
    ap.add_argument(
        "--draft",
        default=None,
        help="the draft model of cllm-draft and llama-server-draft (default: the embedded Q4_1)",
    )
    args = ap.parse_args()
    if args.model in MODELS:  # a name of perf/models.py: smollm2-f16 is made on first use
        args.model = model_path(args.model)
    settings = servers.settings_of(args)
    draft = resolve_model(args.draft)
    labels = args.systems.split(",")
    started = []
    try:
        for label in labels:
            system, extra = SYSTEMS[label]
            extra = tuple(a.replace("{draft}", draft) for a in extra)
            env = {"CLLM_API_KEY": ",".join(KEYS)} if system == "cllm" else None
            started.append(servers.start(system, settings, env=env, args=extra, label=label))
        clients = {label: httpx.Client(base_url=s.url, timeout=TIMEOUT) for label, s in zip(labels, started)}
        print(
            f"# {os.path.basename(settings.model)}: --parallel {args.parallel}, {args.seq_ctx} cells a sequence, "
            f"{args.threads} threads, {args.rounds} rounds; copy: {args.max_tokens} greedy tokens, ordinary: "
            f"{args.ordinary_tokens}; load average {os.getloadavg()[0]:.1f} at the start\n",
            flush=True,
        )
        got, accept = measure(clients, labels, args)
        print("\ntok/s, median of rounds (lowest-highest)\n")
        print(table(got, labels), "\n")
        print("| server | drafted | accepted | acceptance |\n|---|---|---|---|")
        for label, (drafted, kept) in accept.items():
            if drafted:
                print(f"| {label} | {drafted:.0f} | {kept:.0f} | {kept / drafted:.2f} |")
        print(f"\nload average {os.getloadavg()[0]:.1f} at the end")
    finally:
        for s in started:
            s.stop()


if __name__ == "__main__":
    main()
