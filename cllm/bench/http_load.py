"""`cllm bench http`: closed-loop HTTP load on a server, in its own dialect.

C clients each send a request, wait for the whole answer, and send the next,
until N requests are done; every request asks for exactly G greedy tokens
(ignore_eos) after a fresh prompt of about P tokens. Three dialects give
peers identical work (cllm/bench/dialects.py; the chat routes' too):
  cllm          POST /generate        max_tokens, ignore_eos
  openai        POST /v1/completions  max_tokens, ignore_eos, and a -100 logit
                                      bias on --ban-tokens for servers that
                                      ignore ignore_eos (llama-cpp-python)
  llama-server  POST /completion      n_predict, ignore_eos, cache_prompt off
Reports output tokens/s, end-to-end latency and, streaming, the terms
benchmark harnesses use (llama-benchy, `vllm bench serve`, AIPerf): TTFT to
the first event with text, ITL as the gaps between events with text, TPOT as
a request's time after its first token over its tokens after the first, all
as p50/p90/p99 and max, and the tokens an event with text carries on average; errors,
with --pid the CPU seconds each process of the server's tree spent per
generated token; and where the server's /metrics has llama-server's
speculative decoding counters (cllm, llama-server --metrics), the drafted and
accepted tokens of the cell.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass, field

import msgspec
import numpy as np
import psutil

from cllm.bench.dialects import DIALECTS, Dialect, make_dialect
from cllm.bench.prompts import BASE_TOKENS, make_prompts, requests_for

WARMUP_TOKENS = 4
SPEC = "llamacpp:spec_decode_num_"  # llama-server's counters' prefix, on cllm's /metrics too
SPEC_SETTLE = 1.5  # seconds for cllm's engine to report its figures once idle (it sends them at most once a second)


# ---- the server's processes and their CPU time --------------------------------


def role(proc: psutil.Process) -> str:
    """What a process of a server is: engine, frontend, supervisor, or its name (a peer)."""
    try:
        cmd = " ".join(proc.cmdline())
    except psutil.Error:
        return "gone"
    for role in ("engine_proc", "frontend_proc"):
        if f"-m {role}" in cmd:
            return role.split("_")[0]
    if "cllm" in cmd and " serve" in cmd:
        return "supervisor"
    return proc.name()


def cpu_seconds(pids: list[int]) -> dict[str, float]:
    """user+system CPU seconds so far of every process in the trees rooted at pids, by role."""
    out: dict[str, float] = {}
    for pid in pids:
        try:
            root = psutil.Process(pid)
            procs = [root, *root.children(recursive=True)]
        except psutil.Error:
            continue
        for proc in procs:
            try:
                t = proc.cpu_times()
            except psutil.Error:
                continue
            name = role(proc)
            out[name] = out.get(name, 0.0) + t.user + t.system
    return out


# ---- the load ------------------------------------------------------------------


@dataclass
class Outcome:
    tokens: int = 0
    latency: float = 0.0
    ttft: float | None = None
    events: int = 0  # streamed events with text
    gaps: list[float] = field(default_factory=list)  # between those events
    error: str | None = None

    def tpot(self) -> float | None:
        """Time per output token after the first: what a stream's reader sees of the decode."""
        if self.ttft is None or self.tokens < 2:
            return None
        return (self.latency - self.ttft) / (self.tokens - 1)


async def _one(session, url: str, dialect: Dialect, prompt: str, gen_tokens: int, stream: bool) -> Outcome:
    decode = msgspec.json.decode
    out = Outcome()
    t0 = time.perf_counter()
    try:
        async with session.post(url, json=dialect.body(prompt, gen_tokens, stream)) as resp:
            if resp.status != 200:
                out.error = f"HTTP {resp.status}: {(await resp.text())[:200]}"
            elif not stream:
                out.tokens = dialect.tokens(decode(await resp.read()))
            else:
                counted = None
                last = 0.0
                async for line in resp.content:
                    payload = dialect.payload(line)
                    if payload is None:
                        continue
                    if payload == b"[DONE]":
                        break
                    text, n = dialect.event(decode(payload))
                    if text:
                        now = time.perf_counter()
                        out.events += 1
                        if out.ttft is None:
                            out.ttft = now - t0
                        else:
                            out.gaps.append(now - last)
                        last = now
                    if n is not None:
                        counted = n
                out.tokens = counted if counted is not None else out.events
    except Exception as e:  # noqa: BLE001 - any failure of a request is counted, the run goes on
        out.error = f"{type(e).__name__}: {e}"
    out.latency = time.perf_counter() - t0
    return out


async def _load(
    url: str,
    dialect: Dialect,
    prompts: list[str],
    concurrency: int,
    gen_tokens: int,
    stream: bool,
    timeout: float,
    progress=None,
) -> tuple[list[Outcome], float]:
    import aiohttp

    queue = list(reversed(prompts))
    outcomes: list[Outcome] = []
    target = url.rstrip("/") + dialect.path

    async def client(session) -> None:
        while queue:
            outcomes.append(await _one(session, target, dialect, queue.pop(), gen_tokens, stream))
            if progress is not None:
                progress.update(1)

    # llama-server drops the connection after a streamed answer although it
    # announces keep-alive: every streamed request opens its own connection,
    # whatever the server, so all get the same work.
    connector = aiohttp.TCPConnector(limit=concurrency, force_close=stream)
    async with aiohttp.ClientSession(connector=connector, timeout=aiohttp.ClientTimeout(total=timeout)) as session:
        t0 = time.perf_counter()
        await asyncio.gather(*(client(session) for _ in range(concurrency)))
        elapsed = time.perf_counter() - t0
    return outcomes, elapsed


def _percentiles(values: list[float]) -> dict[str, float | None]:
    if not values:
        return {"p50": None, "p90": None, "p99": None, "max": None}
    p50, p90, p99 = np.percentile(values, [50, 90, 99])
    return {"p50": float(p50), "p90": float(p90), "p99": float(p99), "max": float(max(values))}


def run_cell(
    url: str,
    dialect: Dialect,
    concurrency: int,
    requests: int,
    prompt_tokens: int,
    gen_tokens: int,
    stream: bool,
    pids: Sequence[int] = (),
    timeout: float = 600.0,
    progress: bool = True,
) -> dict:
    """One measured cell: `requests` fresh prompts at `concurrency`, with the server's CPU time around it."""
    from tqdm import tqdm

    prompts = make_prompts(requests, prompt_tokens)
    me = psutil.Process()
    spec0 = spec_counts(url)
    cpu0, client0 = cpu_seconds(list(pids)), me.cpu_times()
    with tqdm(total=requests, desc=f"c={concurrency}", unit="req", leave=False, disable=not progress or None) as bar:
        outcomes, elapsed = asyncio.run(_load(url, dialect, prompts, concurrency, gen_tokens, stream, timeout, bar))
    cpu1, client1 = cpu_seconds(list(pids)), me.cpu_times()
    spec = None
    if spec0 is not None:
        time.sleep(SPEC_SETTLE)
        spec1 = spec_counts(url) or {}
        spec = {k: spec1.get(k, 0.0) - spec0.get(k, 0.0) for k in ("draft_tokens", "accepted_tokens", "drafts")}

    ok = [o for o in outcomes if o.error is None]
    generated = sum(o.tokens for o in ok)
    cpu = {role: cpu1[role] - cpu0.get(role, 0.0) for role in cpu1}
    errors = [o.error for o in outcomes if o.error is not None]
    return {
        "concurrency": concurrency,
        "requests": requests,
        "prompt_tokens": prompt_tokens,
        "gen_tokens": gen_tokens,
        "stream": stream,
        "errors": len(errors),
        "first_error": errors[0] if errors else None,
        "short": sum(1 for o in ok if o.tokens != gen_tokens),  # answers without exactly gen_tokens tokens
        "generated_tokens": generated,
        "seconds": elapsed,
        "tokens_per_second": generated / elapsed if elapsed > 0 else 0.0,
        "latency": _percentiles([o.latency for o in ok]),
        "ttft": _percentiles([o.ttft for o in ok if o.ttft is not None]),
        "itl": _percentiles([g for o in ok for g in o.gaps]),
        "tpot": _percentiles([t for o in ok if (t := o.tpot()) is not None]),
        "tokens_per_event": generated / events if (events := sum(o.events for o in ok)) else None,
        "cpu_seconds": cpu,
        "cpu_ms_per_token": {role: 1000 * s / generated for role, s in cpu.items()} if generated else {},
        "client_cpu_seconds": (client1.user + client1.system) - (client0.user + client0.system),
        "speculative": spec,
    }


def spec_counts(url: str) -> dict[str, float] | None:
    """llama-server's speculative counters on the server's /metrics, summed over its labels (draft_tokens,
    accepted_tokens, drafts); None where it has none (no /metrics, or llama-server without --metrics)."""
    import urllib.request

    try:
        with urllib.request.urlopen(url.rstrip("/") + "/metrics", timeout=10) as r:
            text = r.read().decode()
    except OSError:
        return None
    counts: dict[str, float] = {}
    for line in text.splitlines():
        if line.startswith(SPEC):
            name = line[len(SPEC) :].split("{", 1)[0].split(" ", 1)[0].removesuffix("_total")
            counts[name] = counts.get(name, 0.0) + float(line.rsplit(" ", 1)[1])
    return counts or None


def warm_up(url: str, dialect: Dialect, concurrency: int, timeout: float = 600.0) -> None:
    """A round of short requests first: servers allocate their compute graphs on the first decodes."""
    outcomes, _ = asyncio.run(
        _load(url, dialect, make_prompts(concurrency), concurrency, WARMUP_TOKENS, False, timeout)
    )
    failed = [o.error for o in outcomes if o.error is not None]
    if failed:
        raise RuntimeError(f"warm-up requests to {url}{dialect.path} failed: {failed[0]}")


def summary(r: dict) -> str:
    ttft = r["ttft"]["p50"]
    cpu = ", ".join(f"{role} {ms:.2f}" for role, ms in sorted(r["cpu_ms_per_token"].items()))
    return (
        f"c={r['concurrency']:<3} {r['tokens_per_second']:7.1f} tok/s  "
        f"e2e p50/p99 {r['latency']['p50'] or 0:.2f}/{r['latency']['p99'] or 0:.2f} s  "
        + (f"TTFT p50/p99 {ttft:.3f}/{r['ttft']['p99']:.3f} s  " if ttft is not None else "")
        + (
            f"ITL p50/p90/p99 {1000 * itl['p50']:.1f}/{1000 * itl['p90']:.1f}/{1000 * itl['p99']:.1f} ms  "
            f"TPOT p50 {1000 * r['tpot']['p50']:.1f} ms  {r['tokens_per_event']:.2f} tokens/event  "
            if (itl := r["itl"])["p50"] is not None
            else ""
        )
        + f"{r['generated_tokens']} tokens, {r['errors']} errors, {r['short']} short"
        + (f"  CPU ms/token: {cpu}" if cpu else "")
        + (_spec_line(r["speculative"]) if r.get("speculative") else "")
    )


def _spec_line(spec: dict) -> str:
    drafted, accepted = spec["draft_tokens"], spec["accepted_tokens"]
    share = f" ({accepted / drafted:.2f})" if drafted else ""
    drafts = spec["drafts"]
    return f"\n      speculative: {accepted:.0f} of {drafted:.0f} drafted tokens accepted{share} in {drafts:.0f} drafts"


def main(argv: list[str] | None = None, prog: str | None = None) -> int:
    ap = argparse.ArgumentParser(prog=prog, description=__doc__.splitlines()[0].split(": ", 1)[1])
    ap.add_argument("--url", default="http://127.0.0.1:8080", help="the server's base URL (default %(default)s)")
    ap.add_argument("--dialect", choices=DIALECTS, default="cllm")
    ap.add_argument(
        "-c", "--concurrency", default="8", help="comma-separated list of client counts (default %(default)s)"
    )
    ap.add_argument("-n", "--requests", type=int, help="requests per concurrency (default: 5 x concurrency, 8 to 160)")
    ap.add_argument(
        "-p",
        "--prompt-tokens",
        type=int,
        default=BASE_TOKENS,
        help="about this many prompt tokens (default %(default)s)",
    )
    ap.add_argument("-g", "--gen-tokens", type=int, default=50)
    ap.add_argument("--stream", action="store_true", help="stream the answers (time to first token is measured then)")
    ap.add_argument(
        "--pid",
        type=int,
        action="append",
        default=[],
        help="a server process to measure the CPU of (with its children)",
    )
    ap.add_argument("--model-name", default="default", help="the openai and ollama dialects' 'model' field")
    ap.add_argument(
        "--ban-tokens", default="", help="openai dialect: comma-separated token ids to bias by -100 (the EOS tokens)"
    )
    ap.add_argument("--timeout", type=float, default=600.0, help="seconds one request may take")
    ap.add_argument("--no-warmup", action="store_true")
    ap.add_argument("--json", action="store_true", help="print the results as one JSON list")
    args = ap.parse_args(argv)
    try:
        concurrencies = [int(c) for c in args.concurrency.split(",")]
        ban = tuple(int(t) for t in args.ban_tokens.split(",") if t)
    except ValueError:
        ap.error("--concurrency and --ban-tokens take comma-separated integers")
    if min(concurrencies) < 1 or args.gen_tokens < 1 or (args.requests is not None and args.requests < 1):
        ap.error("concurrency, requests and gen-tokens must be at least 1")

    dialect = make_dialect(args.dialect, args.model_name, ban)
    if not args.no_warmup:
        warm_up(args.url, dialect, max(concurrencies), args.timeout)
    results = []
    for c in concurrencies:
        r = run_cell(
            args.url,
            dialect,
            c,
            args.requests or requests_for(c),
            args.prompt_tokens,
            args.gen_tokens,
            args.stream,
            args.pid,
            args.timeout,
        )
        results.append(r)
        if not args.json:
            print(summary(r), flush=True)
    if args.json:
        json.dump(results, sys.stdout)
        print()
    return 1 if any(r["errors"] for r in results) else 0


if __name__ == "__main__":
    sys.exit(main())
