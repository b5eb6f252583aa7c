"""llama-benchy, a benchmark harness from PyPI, on cllm and llama-server side by side.

Why llama-benchy: it is one asyncio process with a handful of dependencies
(GuideLLM needs torch; AIPerf runs a dozen processes and pulls ~50
packages, whose CPU the two servers it measures would lose on a small
machine); it reads a tokenizer.json file (`--tokenizer`) and its text from
any URL, so it runs offline: the tokenizer here is the served GGUF's own
vocabulary and merges (written by ``write_tokenizer``), the text this
repository's docs, served from this machine. It streams
/v1/chat/completions as a user's client would, and times what harnesses
time: TTFT to the first chunk with content, decode from there on.

Each cell (prompt size, depth, concurrency) runs llama-benchy once against
each server, the order alternating cell by cell. Depth 0 is a fresh prompt
alone; a depth D puts a D-token context before it, loaded first
(`--enable-prefix-caching`: the context is sent, then context and prompt),
so the prompt is read after a cached context. Figures, per server and cell:
TTFT (llama-benchy's e2e_ttft), ITL (the gaps between content chunks),
TPOT (a request's first to last content chunk over its tokens after the
first), end-to-end latency, all p50/p90/p99 over the cell's requests, from
llama-benchy's own progress events; the tokens a content chunk carries; and
llama-benchy's decode throughput (its t/s: the cell's tokens after each
request's first over the window from the first request's first token to the
last's last). At c = 1 and depth 0 requests of the same size are also timed
directly, read whole, in rounds alternating with llama-benchy runs of one
request on the same server (`checked_cell`), to check the harness's figures:
TTFT as a 1-token answer to a fresh prompt of pp tokens cut as llama-benchy
cuts them; decode as the difference of a tg-token and a 1-token answer to
that prompt again, both served from the prefix cache, so that the prompt's
reading cancels out (a CPU reads tens of tokens in as long as it decodes a
few). Usage:

    .venv/bin/python -m perf.benchy [--pp 512 2048] [--depth 0 2048] [--concurrency 1 4 16] [--tg 64] [--runs 2]
        [--out perf/results/DATE-benchy-....md] [--harness 'uvx llama-benchy==0.4.0'] [--direct-only]
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import http.server
import json
import os
import subprocess
import sys
import tempfile
import threading
import time
from typing import cast

import httpx
import numpy as np

from cllm.core.gguf_meta import read_metadata
from perf import servers
from perf.chat_turns import alternate

DOCS = os.path.join(servers.ROOT, "docs")
CONTROL = 3  # a GGUF token type: special tokens, never split


def write_tokenizer(model: str, path: str) -> None:
    """The GGUF's BPE vocabulary and merges as a tokenizers-library tokenizer.json (a GPT-2 byte-level BPE)."""
    meta = read_metadata(model)

    def array(key: str) -> list:
        return cast(tuple, meta[key][1])[1] if key in meta else []  # (element type, items)

    tokens, merges, types = (
        array("tokenizer.ggml.tokens"),
        array("tokenizer.ggml.merges"),
        array("tokenizer.ggml.token_type"),
    )
    byte_level = {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": True}
    doc = {
        "version": "1.0",
        "truncation": None,
        "padding": None,
        "added_tokens": [
            {
                "id": i,
                "content": t,
                "single_word": False,
                "lstrip": False,
                "rstrip": False,
                "normalized": False,
                "special": True,
            }
            for i, (t, kind) in enumerate(zip(tokens, types))
            if kind == CONTROL
        ],
        "normalizer": None,
        "pre_tokenizer": byte_level,
        "post_processor": None,
        "decoder": byte_level,
        "model": {
            "type": "BPE",
            "dropout": None,
            "unk_token": None,
            "continuing_subword_prefix": None,
            "end_of_word_suffix": None,
            "fuse_unk": False,
            "byte_fallback": False,
            "vocab": {t: i for i, t in enumerate(tokens)},
            "merges": list(merges),
        },
    }
    with open(path, "w", encoding="utf-8") as f:
        json.dump(doc, f, ensure_ascii=False)


def serve_text(folder: str) -> tuple[http.server.ThreadingHTTPServer, str]:
    """This repository's docs as one text file, served on the loopback address: llama-benchy's book."""
    with open(os.path.join(folder, "book.txt"), "w", encoding="utf-8") as out:
        for name in sorted(os.listdir(DOCS)):
            if name.endswith(".md"):
                with open(os.path.join(DOCS, name), encoding="utf-8") as f:
                    out.write(f.read() + "\n\n")
    quiet = type("Quiet", (http.server.SimpleHTTPRequestHandler,), {"log_message": lambda *a: None})
    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), functools.partial(quiet, directory=folder))
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    return httpd, f"http://127.0.0.1:{httpd.server_address[1]}/book.txt"


def corpus(tokenizer_json: str, book_path: str) -> tuple:
    """The tokenizer llama-benchy cuts its prompts with, and the book's tokens: the direct check cuts its own alike."""
    from tokenizers import Tokenizer  # llama-benchy's own dependency, in the perf extra

    tokenizer = Tokenizer.from_file(tokenizer_json)
    with open(book_path, encoding="utf-8") as f:
        return tokenizer, tokenizer.encode(f.read(), add_special_tokens=False).ids


def model_id(url: str) -> str:
    return httpx.get(url + "/v1/models", timeout=30).json()["data"][0]["id"]


def run_benchy(url: str, model: str, cell: tuple[int, int, int], args, inputs: dict, folder: str, runs: int) -> dict:
    """One llama-benchy run of ``runs`` batches on one cell: its JSON report and its progress events, by kind."""
    pp, depth, c = cell
    report, events = os.path.join(folder, "report.json"), os.path.join(folder, "events.jsonl")
    # exactly tg tokens a request (ignore_eos); no warm-up batch (the servers are warm), no coherence question
    # (a 135M model may fail it) and no latency probe (its TTFT is the end-to-end one, e2e_ttft)
    fixed = "--exact-tg --no-warmup --skip-coherence --latency-mode none --format json"
    cmd = [*args.harness.split(), *fixed.split(), "--base-url", url + "/v1", "--model", model]
    cmd += ["--tokenizer", inputs["tokenizer"], "--book-url", inputs["book"], "--save-result", report]
    cmd += ["--pp", str(pp), "--tg", str(args.tg), "--depth", str(depth), "--concurrency", str(c)]
    cmd += ["--runs", str(runs), "--emit-progress", events]
    if depth:
        cmd.append("--enable-prefix-caching")
    # HOME: llama-benchy keeps the downloaded book in ~/.cache; here it stays in this run's folder
    env = {**os.environ, "HOME": folder, "HF_HUB_OFFLINE": "1"}
    done = subprocess.run(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=3600)
    if done.returncode != 0:
        raise RuntimeError(f"llama-benchy failed on {url} {cell}:\n{done.stdout[-3000:]}")
    with open(report) as f:
        reports = [r for r in json.load(f)["benchmarks"] if not r["is_context_prefill_phase"]]
    with open(events) as f:
        lines = [json.loads(line) for line in f]
    return {"runs": reports, "events": lines}


def figures(got: dict, pp: int, depth: int) -> dict:
    """The cell's percentiles from llama-benchy's progress events (its requests that read the prompt, not the
    loads of a context), and its own throughput."""
    by_id: dict[int, dict] = {}
    for e in got["events"]:
        if "request_id" in e:
            r = by_id.setdefault(e["request_id"], {"chunks": []})
            if e["type"] == "tokens":
                r["chunks"].append(e["ts"])
            elif e["type"] == "request_first_token":
                r["ttft"] = e["ttft_s"]
            elif e["type"] == "request_end":
                r.update(
                    tokens=e["total_tokens"], prompt=e["prompt_tokens"], decode=e["decode_seconds"], error=e["error"]
                )
    reqs = [r for r in by_id.values() if "ttft" in r and not r.get("error") and r["prompt"] > depth + pp // 2]
    gaps = [b - a for r in reqs for a, b in zip(r["chunks"], r["chunks"][1:])]
    tpot = [(r["chunks"][-1] - r["chunks"][0]) / (r["tokens"] - 1) for r in reqs if r["tokens"] > 1]
    runs = got["runs"]
    return {
        "requests": len(reqs),
        "ttft": pct([r["ttft"] for r in reqs]),
        "itl": pct(gaps),
        "tpot": pct(tpot),
        "e2e": pct([r["ttft"] + r["decode"] for r in reqs]),
        "tokens_per_chunk": sum(r["tokens"] for r in reqs) / max(1, sum(len(r["chunks"]) for r in reqs)),
        # llama-benchy's own figure, the median over its processes where a cell took several (checked_cell)
        "decode_tps": median([r["tg_throughput"]["mean"] for r in runs if r["tg_throughput"]]),
        "harness_ttft_ms": median([r["e2e_ttft"]["mean"] for r in runs if r["e2e_ttft"]]),
    }


def median(values: list[float]) -> float | None:
    return float(np.median(values)) if values else None


def pct(values: list[float]) -> list[float] | None:
    return [float(v) for v in np.percentile(values, [50, 90, 99])] if values else None


def direct(url: str, model: str, pp: int, tg: int, inputs: dict, first: int, warm: bool) -> dict:
    """c = 1, read whole, one fresh prompt of pp tokens (the ``first``-th slice): TTFT as a 1-token answer's time;
    decode as (tg - 1) over the difference of a tg-token and a 1-token answer's times to the same prompt again, whose
    reading the prefix cache (llama-server's and cllm's) spares both alike. The prompts are cut as llama-benchy cuts
    its own (pp tokens, chat template included, of the book by the same tokenizer.json, decoded), so both read
    prompts of the same length; ``warm``: one untimed prompt first, so that neither pays for touching its KV cache's
    memory the first time."""
    tokenizer, tokens = inputs["corpus"]
    with httpx.Client(base_url=url, timeout=600) as client:

        def answer(text: str, n: int) -> tuple[float, dict]:
            body = {
                "model": model,
                "messages": [{"role": "user", "content": text}],
                "max_tokens": n,
                "min_tokens": n,
                "ignore_eos": True,
            }
            t0 = time.perf_counter()
            r = client.post("/v1/chat/completions", json=body)
            r.raise_for_status()
            return time.perf_counter() - t0, r.json()["usage"]

        def text(i: int, size: int) -> str:
            # each prompt a slice of its own, from a third into the book: nothing cached serves it
            start = len(tokens) // 3 + i * pp
            return tokenizer.decode(tokens[start : start + size], skip_special_tokens=False)

        # llama-benchy's pp counts the chat template's tokens too (it measures them first): so do these prompts
        dot = tokenizer.encode(".", add_special_tokens=False).ids
        size = pp - (answer(".", 1)[1]["prompt_tokens"] - len(dot))
        if warm:
            answer(text(0, size), 1)
        prompt = text(first + 1, size)
        ttft, usage = answer(prompt, 1)
        t1, tn = answer(prompt, 1)[0], answer(prompt, tg)[0]
    return {"ttft": ttft, "decode_tps": (tg - 1) / (tn - t1), "prompt": usage["prompt_tokens"]}


def checked_cell(url: str, model: str, pp: int, args, inputs: dict, folder: str) -> tuple[dict, dict]:
    """The c = 1, depth 0 cell, in ``args.runs`` rounds of a direct request and a llama-benchy run of one request,
    side by side: this machine's speed drifts by more than 10% within minutes, so the check and what it checks
    alternate. The harness's figures from all its rounds, the direct ones as medians."""
    checks, runs, events = [], [], []
    for i in range(args.runs):
        checks.append(direct(url, model, pp, args.tg, inputs, first=i, warm=i == 0))
        got = run_benchy(url, model, (pp, 0, 1), args, inputs, folder, runs=1)
        runs += got["runs"]
        # each llama-benchy process numbers its requests from 0
        events += [{**e, "request_id": (i, e["request_id"])} if "request_id" in e else e for e in got["events"]]
    return medians(checks), {"runs": runs, "events": events}


def direct_only(url: str, model: str, pp: int, args, inputs: dict) -> dict:
    """``args.runs`` direct rounds on their own (--direct-only), as medians."""
    return medians([direct(url, model, pp, args.tg, inputs, i, i == 0) for i in range(args.runs)])


def medians(checks: list[dict]) -> dict:
    """Direct rounds as one check: the medians of their figures, and each round's prompt tokens."""
    check: dict = {k: float(np.median([c[k] for c in checks])) for k in ("ttft", "decode_tps")}
    check["prompt"] = [c["prompt"] for c in checks]
    return check


def ms(p: list[float] | None) -> str:
    return " / ".join(f"{1000 * v:.1f}" for v in p) if p else "-"


def table(results: dict, cells: list, systems: tuple[str, ...]) -> list[str]:
    lines = [
        "| pp | depth | c | server | reqs | TTFT p50/p90/p99 ms | ITL p50/p90/p99 ms | TPOT p50/p90/p99 ms "
        "| e2e p50/p90/p99 ms | tokens/chunk | decode t/s |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for cell in cells:
        for system in systems:
            f = results[cell][system]
            lines.append(
                f"| {cell[0]} | {cell[1]} | {cell[2]} | {system} | {f['requests']} | {ms(f['ttft'])} | {ms(f['itl'])} "
                f"| {ms(f['tpot'])} | {ms(f['e2e'])} | {f['tokens_per_chunk']:.2f} | {f['decode_tps'] or 0:.1f} |"
            )
    if len(systems) < 2:
        return lines
    lines += [
        "",
        "| pp | depth | c | TTFT p50: llama-server ÷ cllm | decode t/s: cllm ÷ llama-server |",
        "|---|---|---|---|---|",
    ]
    for cell in cells:
        a, b = results[cell]["cllm"], results[cell]["llama-server"]
        speed = a["decode_tps"] / b["decode_tps"] if a["decode_tps"] and b["decode_tps"] else float("nan")
        lines.append(f"| {cell[0]} | {cell[1]} | {cell[2]} | {b['ttft'][0] / a['ttft'][0]:.2f} | {speed:.2f} |")
    return lines


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    servers.add_arguments(ap, seq_ctx=0)
    ap.add_argument("--pp", type=int, nargs="+", default=[512, 2048], help="prompt tokens")
    ap.add_argument("--depth", type=int, nargs="+", default=[0, 2048], help="tokens of cached context before it")
    ap.add_argument("--concurrency", type=int, nargs="+", default=[1, 4, 16])
    ap.add_argument("--tg", type=int, default=64, help="tokens generated by each request")
    ap.add_argument("--runs", type=int, default=2, help="llama-benchy's batches of c requests in each cell")
    ap.add_argument("--systems", default="cllm,llama-server", help="the servers, in the first cell's order")
    ap.add_argument("--out", help="also write the Markdown report here")
    ap.add_argument("--direct-only", action="store_true", help="only the direct check, without llama-benchy")
    ap.add_argument(
        "--harness",
        default=f"{sys.executable} -m llama_benchy",
        help="the command that runs llama-benchy (default: this Python's, from the perf extra; e.g. 'uvx "
        "llama-benchy==0.4.0')",
    )
    args = ap.parse_args()
    args.parallel = max(args.parallel, *args.concurrency)
    # every request's context, prompt, answer and chat template (a few tokens) in its own KV cells
    args.seq_ctx = args.seq_ctx or max(args.depth) + max(args.pp) + args.tg + 128
    settings = servers.settings_of(args)
    systems = tuple(args.systems.split(","))
    cells = [] if args.direct_only else [(pp, d, c) for d in args.depth for pp in args.pp for c in args.concurrency]
    results: dict = {cell: {} for cell in cells}
    load = [os.getloadavg()[0]]
    with tempfile.TemporaryDirectory() as folder:
        inputs: dict = {
            "tokenizer": os.path.join(folder, "tokenizer.json"),
            "book_path": os.path.join(folder, "book.txt"),
        }
        write_tokenizer(settings.model, inputs["tokenizer"])
        httpd, inputs["book"] = serve_text(folder)
        inputs["corpus"] = corpus(inputs["tokenizer"], inputs["book_path"])
        try:
            with contextlib.ExitStack() as stack:
                urls = {s: stack.enter_context(servers.start(s, settings)).url for s in systems}
                models = {s: model_id(u) for s, u in urls.items()}
                checks: dict = {s: {} for s in systems}
                if args.direct_only:
                    checks = {
                        s: {pp: direct_only(urls[s], models[s], pp, args, inputs) for pp in args.pp} for s in systems
                    }
                for cell, order in zip(cells, alternate(len(cells), systems)):
                    for system in order:
                        if cell[1:] == (0, 1):
                            checks[system][cell[0]], got = checked_cell(
                                urls[system], models[system], cell[0], args, inputs, folder
                            )
                        else:
                            got = run_benchy(urls[system], models[system], cell, args, inputs, folder, args.runs)
                        results[cell][system] = figures(got, cell[0], cell[1])
                        load.append(os.getloadavg()[0])
                        print(cell, system, json.dumps(results[cell][system]), flush=True)
        finally:
            httpd.shutdown()
    lines = [
        f"llama-benchy side by side: {os.path.basename(settings.model)}, {settings.threads} threads, "
        f"--parallel {settings.parallel}, {settings.seq_ctx} KV cells a sequence, tg {args.tg}, "
        f"{args.runs} batches of c requests a cell; load average (1 min) {min(load):.1f}-{max(load):.1f}",
        "",
        *table(results, cells, systems),
    ]
    if any(checks.values()):
        lines += [
            "",
            f"Direct, c = 1, read whole (medians of {args.runs}), alternating with the harness's runs of the c = 1, "
            "depth 0 cell on the same server:",
            "",
            "| pp | server | direct prompts (tokens) | TTFT direct / harness p50 ms | decode t/s direct / harness |",
            "|---|---|---|---|---|",
        ]
    for pp in args.pp:
        for system in systems:
            if pp not in checks[system]:
                continue
            d, h = checks[system][pp], results[(pp, 0, 1)][system] if (pp, 0, 1) in results else None
            lines.append(
                f"| {pp} | {system} | {', '.join(map(str, d['prompt']))} "
                f"| {1000 * d['ttft']:.1f} / {1000 * h['ttft'][0] if h else float('nan'):.1f} "
                f"| {d['decode_tps']:.1f} / {h['decode_tps'] if h else float('nan'):.1f} |"
            )
    report = "\n".join(lines) + "\n"
    print(report)
    if args.out:
        with open(args.out, "w") as f:
            f.write(report)


if __name__ == "__main__":
    main()
