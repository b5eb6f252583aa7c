"""Render a suite's results: a Markdown table and a PNG plot per model.

python -m perf.report perf/results/2026-11-21-smollm2.json   # re-render one
"""

from __future__ import annotations

import json
import os
import sys

CEILING = "raw llama.cpp"
PEER = "llama-server"
ORDER = ["raw llama.cpp", "raw llama.cpp, unified KV", "cllm engine", "cllm", "llama-server", "llama-cpp-python"]
STYLE = {  # the same look for a system in every panel; the ceiling in black
    "raw llama.cpp": {"color": "black", "linestyle": "--"},
    "raw llama.cpp, unified KV": {"color": "gray", "linestyle": ":"},
    "cllm engine": {"color": "tab:cyan", "marker": ".", "linestyle": "-."},
    "cllm": {"color": "tab:blue", "marker": "o"},
    "llama-server": {"color": "tab:orange", "marker": "s"},
    "llama-cpp-python": {"color": "tab:green", "marker": "^"},
}


def _label(r: dict) -> str:
    if r["system"] == "raw":
        return CEILING if r["kv"] == "per-seq" else "raw llama.cpp, unified KV"
    if r["system"] == "engine":
        return "cllm engine"
    return r["system"]


def _shapes(results: list[dict]) -> list[tuple[int, int, bool]]:
    """(prompt tokens, generated tokens, streaming) of every server cell, in run order."""
    seen = []
    for r in results:
        key = (r["prompt_tokens"], r["gen_tokens"], r.get("stream", False))
        if r["system"] not in ("raw", "engine") and key not in seen:
            seen.append(key)
    return seen or [(results[0]["prompt_tokens"], results[0]["gen_tokens"], False)]


def _cells(results: list[dict], prompt: int, gen: int, stream: bool) -> list[dict]:
    """The cells of one shape; raw and engine figures (never streamed) go with every shape."""
    return [
        r
        for r in results
        if r["prompt_tokens"] == prompt
        and r["gen_tokens"] == gen
        and (r["system"] in ("raw", "engine") or r.get("stream", False) == stream)
    ]


def _fmt(x: float | None, spec: str = ".2f") -> str:
    return "–" if x is None else format(x, spec)


def _cpu(r: dict) -> str:
    cpu = r.get("cpu_ms_per_token") or {}
    if not cpu:
        return "–"
    if "engine" in cpu:
        fe = cpu.get("frontend", 0.0)
        return f"{sum(cpu.values()):.1f} (frontend {100 * fe / cpu['engine']:.1f}% of engine)" if cpu["engine"] else "–"
    return f"{sum(cpu.values()):.1f}"


def markdown(doc: dict) -> str:
    results = doc["results"]
    s = doc["settings"]
    peer_env = " ".join(f"{k}={v}" for k, v in (s.get("peer_env") or {}).items())
    lines = [
        f"### {doc['model']} ({os.path.basename(doc['model_path'])}), {doc['date']}",
        "",
        f"{s['threads']} threads, {s['parallel']} parallel sequences of {s['seq_ctx']} KV cells, "
        f"{doc['machine']['cpus']} CPUs; load average {doc['machine']['load_before']:.1f} before, "
        f"{doc['machine']['load_after']:.1f} after; peers run with {peer_env or 'their default environment'}. "
        f"Ratios are to the raw llama.cpp ceiling (prefill then decode, per-sequence KV, same concurrency) "
        f"and to llama-server in the same run.",
    ]
    for prompt, gen, stream in _shapes(results):
        cells = _cells(results, prompt, gen, stream)
        by = {(_label(r), r["concurrency"]): r for r in cells}
        # streamed, what harnesses report of a stream too (cllm/bench/http_load.py): ITL, TPOT, tokens an event
        streamed = " ITL p50 / p99 (ms) | TPOT p50 (ms) | tokens/event |" if stream else ""
        lines += [
            "",
            f"**~{prompt}-token prompts, {gen} tokens, {'streaming' if stream else 'non-streaming'}**",
            "",
            "| c | system | tok/s | × ceiling | × llama-server | TTFT p50 / p99 (s) | latency p50 / p99 (s) |"
            + streamed
            + " server CPU ms/token | errors |",
            "|---|---|---|---|---|---|---|---|---|" + ("---|---|---|" if stream else ""),
        ]
        for c in sorted({r["concurrency"] for r in cells}):
            ceiling, peer = by.get((CEILING, c)), by.get((PEER, c))
            for label in ORDER:
                r = by.get((label, c))
                if r is None:
                    continue
                tps = r["tokens_per_second"]
                note = (
                    f" (decode only {r['decode_tokens_per_second']:.1f})" if r.get("decode_tokens_per_second") else ""
                )
                lat, ttft = r.get("latency") or {}, r.get("ttft") or {}
                lines.append(
                    f"| {c} | {label} | {tps:.1f}{note} | "
                    f"{_fmt(tps / ceiling['tokens_per_second'] if ceiling else None)} "
                    f"| {_fmt(tps / peer['tokens_per_second'] if peer and label != PEER else None)} "
                    f"| {_fmt(ttft.get('p50'), '.3f')} / {_fmt(ttft.get('p99'), '.3f')} "
                    f"| {_fmt(lat.get('p50'))} / {_fmt(lat.get('p99'))} |"
                    + (_stream_terms(r) if stream else "")
                    + f" {_cpu(r)} | {r.get('errors', 0)} |"
                )
    return "\n".join(lines) + "\n"


def _stream_terms(r: dict) -> str:
    """ITL p50 / p99 and TPOT p50 in ms, and tokens an event, of a streamed cell (absent from older results)."""
    itl, tpot = r.get("itl") or {}, r.get("tpot") or {}
    ms = [None if v is None else 1000 * v for v in (itl.get("p50"), itl.get("p99"), tpot.get("p50"))]
    return f" {_fmt(ms[0])} / {_fmt(ms[1])} | {_fmt(ms[2])} | {_fmt(r.get('tokens_per_event'))} |"


def plot(doc: dict, path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import NullLocator

    shapes = _shapes(doc["results"])
    fig, axes = plt.subplots(len(shapes), 2, figsize=(11, 4 * len(shapes)), squeeze=False)
    for row, (prompt, gen, stream) in zip(axes, shapes):
        cells = _cells(doc["results"], prompt, gen, stream)
        title = f"{doc['model']}: ~{prompt}-token prompts, {gen} tokens, {'streaming' if stream else 'non-streaming'}"
        for label in ORDER:
            pts = sorted((r["concurrency"], r) for r in cells if _label(r) == label)
            if not pts:
                continue
            cs = [c for c, _ in pts]
            style = STYLE[label]
            row[0].plot(cs, [r["tokens_per_second"] for _, r in pts], label=label, **style)
            key = "ttft" if stream else "latency"
            ys = [(c, (r.get(key) or {}).get("p50")) for c, r in pts]
            ys = [(c, y) for c, y in ys if y is not None]
            if ys:
                row[1].plot(*zip(*ys), label=label, **style)
        row[0].set(title=title, xlabel="concurrency", ylabel="output tokens/s", xscale="log", ylim=(0, None))
        row[1].set(
            title="time to first token, p50" if stream else "end-to-end latency p50 (TTFT needs streaming)",
            xlabel="concurrency",
            ylabel="seconds",
            xscale="log",
            yscale="log",
        )
        for ax in row:
            cs = sorted({r["concurrency"] for r in cells})
            ax.set_xticks(cs, [str(c) for c in cs])
            ax.xaxis.set_minor_locator(NullLocator())
            ax.grid(alpha=0.3)
        row[0].legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)


def render(json_path: str) -> tuple[str, str]:
    """Write <name>.md and <name>.png next to the JSON; returns their paths."""
    with open(json_path) as f:
        doc = json.load(f)
    base = json_path.removesuffix(".json")
    with open(base + ".md", "w") as f:
        f.write(markdown(doc))
    plot(doc, base + ".png")
    return base + ".md", base + ".png"


if __name__ == "__main__":
    for p in sys.argv[1:]:
        print(*render(p))
