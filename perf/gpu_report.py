"""The table (results.md) and the plot (plot.png, when matplotlib is there) of a perf/gpu_run.py run.

python -m perf.gpu_report OUTDIR    # again from OUTDIR/results.json, e.g. on a machine with matplotlib
"""

from __future__ import annotations

import json
import os
import sys

SERVERS = ("llama-server", "llama-server -bs", "cllm")
OTHER = "cllm device sampling"  # cllm --device-sampling on: a column of its own when measured


def _rate(rows: list[dict], system: str, c: int, sampled: bool) -> float | None:
    for r in rows:
        if (
            r.get("system") == system
            and r.get("concurrency") == c
            and r.get("sampled") == sampled
            and "tokens_per_second" in r
        ):
            return r["tokens_per_second"] if not r.get("errors") else None
    return None


def _ratio(a: float | None, b: float | None) -> str:
    return f"{a / b:.2f}" if a and b else "-"


def _num(x: float | None) -> str:
    return f"{x:,.0f}" if x else "-"


def _engine_table(engine: list[dict]) -> list[str]:
    """The rows of `cllm bench engine --sweep` on one model."""
    lines = [
        "",
        "`cllm bench engine --sweep` (in-process, no HTTP): host µs per step = the step's work outside "
        "llama_decode on its critical path, engine thread CPU [wall]; overlapped = host work done while a "
        "decode launched ahead ran (steady steps); decode = llama_decode's wall time per step (on a GPU it "
        "includes waiting for the device); reused = decode steps whose compute graph llama.cpp reused "
        "(staggered: arrivals spread, generation lengths uniform in [g/2, 3g/2]).",
        "",
        "| arrivals | steady | c | sampling | on | tok/s | ms/step | decode ms | reused | host µs | schedule | "
        "batch | sampling | retire | other | overlapped | host share |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in engine:
        cpu, wall = r["host_us_per_step"]["cpu"], r["host_us_per_step"]["wall"]
        parts = " | ".join(
            f"{cpu.get(k, 0):.0f} [{wall.get(k, 0):.0f}]"
            for k in ("host", "schedule", "batch", "sampling", "retire", "other", "overlapped")
        )
        reused = f"{r['reused_steps'] / r['decode_steps']:.0%}" if r.get("decode_steps") else "-"
        lines.append(
            f"| {r.get('arrivals', 'lockstep')} | {'on' if r.get('steady') else 'off'} | {r['concurrency']} | "
            f"{'0.7 / 0.9' if r['sampled'] else 'greedy'} | "
            f"{'device' if r['device_sampling'] else 'host'} | {r['tokens_per_second']:,.0f} | "
            f"{r['step_ms']:.2f} | "
            f"{r['decode_ms']:.2f} | {reused} | {parts} | {wall['host'] / (1000 * r['step_ms']):.0%} |"
        )
    return lines


def _restart_table(rounds: list[dict]) -> list[str]:
    """perf/restart_cache.py's rounds: TTFT of the same next turn after a restart and without one."""
    lines = [
        "",
        "The next turn of a long conversation (perf/restart_cache.py, streamed, TTFT s; cached: prompt tokens the "
        "cache served; target: after ÷ no restart <= 1.3):",
        "",
        "| run | --warmup | prompt tokens | after restart (cached) | no restart (cached) | after ÷ no restart | cold |",
        "|---|---|---|---|---|---|---|",
    ]
    for i, r in enumerate(rounds, 1):
        after, same = r["after restart"], r["no restart"]
        lines.append(
            f"| {i} | {r.get('warmup', '-')} | {after['prompt_tokens']} | {after['ttft']:.3f} ({after['cached']}) | "
            f"{same['ttft']:.3f} "
            f"({same['cached']}) | {_ratio(after['ttft'], same['ttft'])} | {r['cold']['ttft']:.3f} |"
        )
    return lines


def table(doc: dict) -> str:
    lines = [
        f"# cllm on {doc['device']}",
        "",
        f"{doc['date']}; `{doc['command']}`{' (DRY RUN: tiny shapes, short counts)' if doc['dry'] else ''}.",
        "",
        "Synthetic models (perf/synth_model.py: random weights, the embedded model's tokenizer): these figures are "
        "for SPEED only. Every request: a fresh prompt of about "
        f"{doc['prompt_tokens']} tokens, exactly {doc['gen_tokens']} generated tokens (ignore_eos), non-streamed; "
        "greedy, or sampled at temperature 0.7 and top-p 0.9. tok/s = generated tokens / wall time of the cell. "
        f"Servers: --parallel {doc['parallel']}, {doc['seq_ctx']} KV cells a sequence, {doc['threads']} threads, "
        "every layer on the GPU, flash attention on. raw = llama-batched-bench with the same prompt length and "
        "generated tokens (all prompts prefilled in one batch, then decoded together; tok/s over both; it samples "
        "nothing, so its figure is the ceiling of the sampled rows too).",
        "",
    ]
    for preset, m in doc["models"].items():
        rows = m.get("results", [])
        lines += [f"## {preset}" + (f" (synthesized in {m['synth_seconds']} s)" if "synth_seconds" in m else ""), ""]
        if rows:
            lines += [
                "| c | sampling | raw | llama-server | llama-server -bs | cllm | cllm ÷ raw | cllm ÷ best llama-server "
                "| cllm ÷ llama-server |",
                "|---|---|---|---|---|---|---|---|---|",
            ]
        other = any(r.get("system") == OTHER for r in rows)
        if other:
            lines[-2:] = [
                lines[-2] + " cllm device sampling | its ÷ raw | its ÷ best llama-server |",
                lines[-1] + "---|---|---|",
            ]
        cells = sorted(
            {(r["concurrency"], r["sampled"]) for r in rows if "concurrency" in r}, key=lambda x: (x[1], x[0])
        )
        for c, sampled in cells:
            rawv = _rate(rows, "raw", c, False)
            ls, bs, cl = (_rate(rows, s, c, sampled) for s in SERVERS)
            best = max([x for x in (ls, bs) if x] or [0]) or None
            line = (
                f"| {c} | {'0.7 / 0.9' if sampled else 'greedy'} | {_num(rawv)} | {_num(ls)} | {_num(bs)} | "
                f"{_num(cl)} | {_ratio(cl, rawv)} | {_ratio(cl, best)} | {_ratio(cl, ls)} |"
            )
            if other:
                dv = _rate(rows, OTHER, c, sampled)
                line += f" {_num(dv)} | {_ratio(dv, rawv)} | {_ratio(dv, best)} |"
            lines.append(line)
        mem = [r for r in rows if "memory" in r]
        if mem:
            lines += [
                "",
                "| server | RSS MiB (process tree) | VRAM MiB | the engine's model / KV / compute MiB (/model/info) |",
                "|---|---|---|---|",
            ]
            lines += [
                f"| {r['system']} | {r['memory']['rss_mib']} | "
                f"{r['memory']['vram_mib'] if r['memory']['vram_mib'] is not None else '-'} | "
                + (
                    " / ".join(str(v) for v in r["memory"]["reported_mib"].values())
                    if "reported_mib" in r["memory"]
                    else "-"
                )
                + " |"
                for r in mem
            ]
        if m.get("engine"):
            lines += _engine_table(m["engine"])
        if m.get("restart"):
            lines += _restart_table(m["restart"])
        errs = [r for r in rows if r.get("errors")]
        for r in errs:
            lines.append(f"\n{r['system']} c={r['concurrency']}: {r['errors']} errors, the first: {r['first_error']}")
        if m.get("part_seconds"):
            lines += ["", "Seconds per part: " + ", ".join(f"{k} {v}" for k, v in m["part_seconds"].items())]
        lines.append("")
    spec = doc.get("speculation")
    if spec:
        lines += [
            f"## Speculation on copy tasks ({spec['model']}, real weights; perf/speculative.py's copy workload, tok/s)",
            "",
        ]
        lines += [r["table"] for r in spec["results"] if "table" in r] or ["(no result)"]
        lines.append("")
    for title, items in (("Left out", doc.get("skipped")), ("Failures", doc.get("notes"))):
        if items:
            lines += [f"## {title}", "", *(f"- {x}" for x in items), ""]
    if "seconds_left" in doc:
        lines.append(f"Run budget: {doc['seconds_left']} s left at the end.")
    return "\n".join(lines) + "\n"


def plot(doc: dict, path: str) -> bool:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return False
    models = [(p, m) for p, m in doc["models"].items() if m.get("results")]
    if not models:
        return False
    fig, axes = plt.subplots(1, len(models), figsize=(5 * len(models), 4), squeeze=False)
    for ax, (preset, m) in zip(axes[0], models):
        rows = m["results"]
        for system in ("raw", *SERVERS):
            pts = sorted(
                (r["concurrency"], r["tokens_per_second"])
                for r in rows
                if r.get("system") == system and not r.get("sampled") and "tokens_per_second" in r
            )
            if pts:
                ax.plot(*zip(*pts), marker="o", label=system)
        ax.set_title(f"{preset} (synthetic), greedy")
        ax.set_xlabel("concurrent requests")
        ax.set_ylabel("generated tok/s")
        ax.set_xscale("log", base=2)
        ax.legend()
    fig.suptitle(doc["device"], fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return True


def render(outdir: str) -> None:
    with open(os.path.join(outdir, "results.json")) as f:
        doc = json.load(f)
    with open(os.path.join(outdir, "results.md"), "w") as f:
        f.write(table(doc))
    plot(doc, os.path.join(outdir, "plot.png"))


if __name__ == "__main__":
    render(sys.argv[1])
