"""What `cllm bench engine` prints: a run's figures (engine_bench.bench's dict) as text, and a sweep's table."""

from __future__ import annotations

PARTS = [
    ("admit", "decode Submit records, build sampler chains"),
    ("step", "engine.step(), not split (profiling)"),
    ("schedule", "pick this step's chunks, copy and trim KV streams; the drafts (a draft model's decodes too)"),
    ("batch", "fill the llama_batch"),
    ("llama_decode", "the forward pass"),
    ("sampling", "pick each sequence's token (one argmax over greedy rows, llama.cpp chains)"),
    ("retire", "finish checks, SeqOutputs, free finished sequences"),
    ("other", "the rest of the step (drafting's books, embeddings, step figures)"),
    ("overlapped", "recording the tokens of a decode run ahead while the next one runs (steady steps)"),
    ("publish", "encode StepOutputs, write the ring"),
    ("loop", "the rest of the loop (bench bookkeeping, the reader's drain)"),
]
HOST_PARTS = ("schedule", "batch", "sampling", "retire", "other")  # the step's host work outside llama_decode


def report(r: dict) -> str:
    prompts = "copy tasks" if r["copy"] else f"prompts of {r['prompt_tokens']}"
    staggered = " (mean; staggered arrivals)" if r["staggered"] else ""
    lines = [
        f"engine: {r['requests']} requests x {r['gen_tokens']} tokens{staggered} ({prompts}), "
        f"concurrency {r['concurrency']}, {r['threads']} threads",
        f"  {r['tokens_per_second']:.1f} tok/s: {r['generated_tokens']} tokens in {r['seconds']:.2f} s, "
        f"{r['steps']} steps of {r['step_ms']:.2f} ms",
        f"  {'sampled (temperature 0.7, top-p 0.9, seeded)' if r['sampled'] else 'greedy'}"
        f" on the {'device' if r['device_sampling'] else 'host'};"
        f" speculative: {r['spec_type']}, {r['accepted_tokens']} of {r['drafted_tokens']} drafted tokens accepted",
        f"  graph reused: {r['reused_steps']} of {r['decode_steps']} decode steps ({share(r)});"
        f" steady batches {'on' if r['steady'] else 'off'}",
        f"  {'part':<13}{'ms/step':>9}{'share':>8}",
    ]
    for name, what in PARTS:
        s = r["parts_seconds"].get(name)
        if s is None:
            continue
        lines.append(f"  {name:<13}{1000 * s / r['steps']:9.3f}{100 * s / r['seconds']:7.1f}%  {what}")
    host = r["host_us_per_step"]
    if host:
        lines.append("  host us/step on the critical path (outside llama_decode), wall / engine thread CPU:")
        lines.append(
            "    " + "  ".join(f"{k} {host['wall'][k]:.0f}/{host['cpu'][k]:.0f}" for k in ("host", *HOST_PARTS))
        )
        lines.append(
            f"  overlapped host us/step (while a decode ran): {host['wall']['overlapped']:.0f}"
            f"/{host['cpu']['overlapped']:.0f}"
        )
    return "\n".join(lines)


def share(r: dict) -> str:
    return f"{100 * r['reused_steps'] / r['decode_steps']:.0f}%" if r["decode_steps"] else "-"


def sweep_table(results: list[dict]) -> str:
    """Host us per step, engine thread CPU (wall in brackets), by concurrency, greedy and sampled."""
    head = (
        f"{'c':>3} {'mode':<8}{'host':>13}"
        + "".join(f"{k:>13}" for k in (*HOST_PARTS, "overlapped"))
        + f"{'decode ms':>11}{'reused':>8}"
    )
    lines = ["host us/step: engine thread CPU [wall]", head]
    for r in results:
        h = r["host_us_per_step"]
        cells = "".join(f"{h['cpu'][k]:>6.0f} [{h['wall'][k]:>4.0f}]" for k in ("host", *HOST_PARTS, "overlapped"))
        decode_ms = 1000 * r["parts_seconds"]["llama_decode"] / r["steps"]
        lines.append(
            f"{r['concurrency']:>3} {'sampled' if r['sampled'] else 'greedy':<8}{cells}{decode_ms:>11.1f}{share(r):>8}"
        )
    return "\n".join(lines)
