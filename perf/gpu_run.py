"""One measuring run on a GPU (perf/gpu_run.sh): raw llama.cpp, llama-server and cllm side by side.

All three run the libraries and binaries perf/gpu_build.sh built from the one llama.cpp source that
llama-cpp-python vendors. For each synthesized model (perf/synth_model.py: random weights, so every figure
is SPEED only, greedy or sampled with ignore_eos):
  raw           llama-batched-bench: the same prompts' length and generated tokens, all sequences prefilled
                in one batch then decoded together; tok/s = generated tokens / (prefill + decode time)
  llama-server  default, and with backend sampling (-bs)
  cllm          `cllm serve` over HTTP
The servers get the same file, --parallel, KV cells, threads, every layer offloaded and flash attention;
cllm's load generator (cllm/bench/http_load.py) sends fresh prompts at each concurrency, greedy, then sampled
(temperature 0.7, top-p 0.9). Memory (RSS of the process tree, VRAM by nvidia-smi) is read after a server's
cells. With a real model file (--real-model, or the embedded one when installed) copy tasks also measure
speculation (perf/speculative.py): cllm with and without n-gram drafting, llama-server's n-gram drafters. On the
first model, the next turn of a long conversation after a restart on --cache-dir (perf/restart_cache.py).

The parts themselves are perf/gpu_parts.py's; this file plans them. Every part has a time budget, parts that
no longer fit the whole run's are skipped (and said so), every wait is bounded and every server is stopped.
Writes OUTDIR/results.json, results.md and plot.png (with matplotlib). GPU_RUN_DRY=1 shrinks shapes, counts
and budgets for a dry run on a CPU build.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import signal
import subprocess
import sys
import time
from typing import Any

from perf import synth_model
from perf.gpu_parts import DRY, PROMPT, Budget, engine_sweep, gpu_used, http, raw, restart, speculation
from perf.gpu_report import render

# (models, greedy c, sampled c, generated tokens, prompt tokens, seconds for the whole run)
PLAN: dict[str, Any] = (
    dict(models=["tiny"], greedy=[1, 4], sampled=[4], gen=8, budget=240)
    if DRY
    else dict(models=["smollm2", "8b", "1b"], greedy=[1, 32, 64, 8], sampled=[32, 64], gen=256, budget=480)
)


# ---- the run ------------------------------------------------------------------------------------------


def device() -> str:
    if shutil.which("nvidia-smi"):
        try:
            return subprocess.run(
                ["nvidia-smi", "--query-gpu=name,memory.total,driver_version", "--format=csv,noheader"],
                capture_output=True,
                text=True,
                timeout=20,
            ).stdout.strip()
        except subprocess.SubprocessError:
            pass
    return f"CPU only: {os.cpu_count()} CPUs, {platform.processor() or platform.machine()}"


CONTESTANTS = [
    ("raw", ()),
    ("llama-server", ()),
    ("llama-server -bs", ("-bs",)),
    ("cllm", ()),
    ("cllm device sampling", ("--device-sampling", "on")),
]
# Seconds a server's part and the engine's sweeps need on a GPU, about, at 256 generated tokens a request, as measured
# in perf/results/2026-12-04-gpu-h200*.md (1b between the two): what the run's budget plans with. 8b: its three
# engine sweeps took ~250 s on the H200 (in the second run the third ran out of a 190-s budget).
ESTIMATE = {"tiny": 10, "smollm2": 45, "1b": 60, "8b": 75}
ENGINE_ESTIMATE = {"tiny": 10, "smollm2": 95, "1b": 160, "8b": 250}


def guarded(doc: dict, what: str, part) -> None:
    """Run a part; its failure is noted and leaves the others to run."""
    try:
        part()
    except Exception as e:  # noqa: BLE001
        doc["notes"].append(f"{what} failed: {type(e).__name__}: {str(e)[-600:]}")
        print(doc["notes"][-1], flush=True)


def real_model(args) -> tuple[str | None, str | None]:
    """A real GGUF for the speculation part, or why there is none."""
    path = args.real_model
    if path is None:
        try:
            from cllm.core.model_file import embedded_model_path

            path = embedded_model_path()
        except Exception:  # noqa: BLE001 - not installed: the usual case on the device
            return None, "no real model file (the embedded model is not installed here and none was carried)"
    if not os.path.exists(path):
        return None, f"{path} is missing"
    if args.real_model_sha256:
        import hashlib

        digest = hashlib.sha256()
        with open(path, "rb") as f:
            for block in iter(lambda: f.read(1 << 20), b""):
                digest.update(block)
        if digest.hexdigest() != args.real_model_sha256:
            return None, f"{path} is not whole (its sha256 differs from the bundle's)"
    return path, None


def _parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("outdir")
    ap.add_argument(
        "--bin", default=os.environ.get("GPU_BIN", ".gpu/work/build/bin"), help="llama.cpp's built binaries"
    )
    ap.add_argument("--models-dir", default=os.environ.get("GPU_MODELS", ".gpu/work/models"))
    ap.add_argument("--models", default=",".join(PLAN["models"]), help="synth_model presets, in order of importance")
    ap.add_argument(
        "--parts",
        default="servers,speculation,engine,restart",
        help="of: servers (every contestant on every model), speculation (a real model's copy tasks), "
        "engine (cllm bench engine --sweep on each model), restart (the next turn after a restart, first model)",
    )
    ap.add_argument(
        "--contestants",
        # -bs left out by default: slower than llama-server's default in most cells (2026-11-26-gpu-h100.md)
        default="raw,llama-server,cllm,cllm device sampling",
        help="of: " + ", ".join(label for label, _ in CONTESTANTS),
    )
    ap.add_argument("--budget", type=float, default=PLAN["budget"], help="seconds for the whole run")
    ap.add_argument("--gen", type=int, default=PLAN["gen"], help="tokens each request generates")
    ap.add_argument("--threads", type=int, default=max(1, min(8, (os.cpu_count() or 2) // 2)))
    ap.add_argument(
        "--real-model",
        default=os.environ.get("GPU_REAL_MODEL"),
        help="a real GGUF for the speculation part (default: the embedded model when installed)",
    )
    ap.add_argument(
        "--real-model-sha256",
        default=os.environ.get("GPU_REAL_MODEL_SHA256"),
        help="its checksum: a model carried in parts is used only when whole",
    )
    return ap


def _document(args: argparse.Namespace, argv: list[str] | None) -> dict:
    """The results' head: what ran, where and how; the parts fill in the rest."""
    return {
        "device": device(),
        "dry": DRY,
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "command": " ".join([os.path.basename(sys.argv[0]), *(argv or sys.argv[1:])]),
        "threads": args.threads,
        "prompt_tokens": PROMPT,
        "gen_tokens": args.gen,
        "parallel": max(args.greedy + args.sampled),
        "seq_ctx": args.seq_ctx,
        "models": {},
        "skipped": [],
        "notes": [],
    }


def _parts(args: argparse.Namespace) -> list[tuple[str, Any]]:
    # The parts in order of importance (the 1b shape last: "where time allows"); each is left out when
    # what it needs no longer fits what is left of the budget.
    presets = [p for p in args.models.split(",") if p]
    chosen = set(args.parts.split(","))
    contestants = [c for c in CONTESTANTS if c[0] in args.contestants.split(",")]
    parts: list[tuple[str, Any]] = (
        [(p, c) for p in presets if p != "1b" for c in contestants] if "servers" in chosen else []
    )
    parts += [("speculation", None)] if "speculation" in chosen else []
    parts += [(p, ("engine", ())) for p in presets if p != "1b"] if "engine" in chosen else []
    parts += [(presets[0], ("restart", ()))] if "restart" in chosen and presets else []
    parts += [(p, c) for p in presets if p == "1b" for c in contestants] if "servers" in chosen else []
    return parts


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    budget = Budget(args.budget)
    args.gpu_baseline = gpu_used() if shutil.which("nvidia-smi") else 0  # MiB in use before any server
    args.greedy, args.sampled = PLAN["greedy"], PLAN["sampled"]
    args.seq_ctx = PROMPT + args.gen + 32
    args.requests = lambda c: 2 if DRY else (4 if c == 1 else 2 * c)
    args.part_timeout = 120
    args.logs = os.path.join(args.outdir, "logs")
    os.makedirs(args.logs, exist_ok=True)
    os.makedirs(args.models_dir, exist_ok=True)
    # SIGTERM (a timeout around the run) ends it like an error: the finally blocks stop every server.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))

    doc = _document(args, argv)

    def save() -> None:
        with open(os.path.join(args.outdir, "results.json"), "w") as f:
            json.dump(doc, f, indent=1)
        render(args.outdir)

    parts = _parts(args)
    real, why_not = real_model(args)
    try:
        for preset, contestant in parts:
            if preset == "speculation":
                need = 60 if DRY else 90
                if not real or budget.left() < need:
                    doc["skipped"].append(
                        f"speculation: {why_not or f'{budget.left():.0f} s left, about {need} s needed'}"
                    )
                    continue
                spec: list[dict] = []
                doc["speculation"] = {"model": os.path.basename(real), "results": spec}
                guarded(doc, "speculation", lambda: speculation(args, real, spec.append))
                save()
                continue
            label, extra = contestant
            path = os.path.join(args.models_dir, f"{preset}.gguf")
            need = ESTIMATE.get(preset, 40) // (2 if label == "raw" else 1) + (0 if os.path.exists(path) else 15)
            if label == "engine":
                need = ENGINE_ESTIMATE.get(preset, 90)
            elif label == "restart":
                need = 30 if DRY else 60
            if budget.left() < need:
                doc["skipped"].append(f"{preset} {label}: {budget.left():.0f} s left, about {need} s needed")
                continue
            model = doc["models"].setdefault(preset, {"results": [], "part_seconds": {}})
            t0 = time.monotonic()
            if not os.path.exists(path):
                print(f"{preset}: synthesizing", flush=True)
                synth_model.synthesize(preset, path)
                model["synth_seconds"] = round(time.monotonic() - t0, 1)
            print(f"{preset}: {label}", flush=True)
            if label == "raw":
                guarded(
                    doc, f"{preset} raw", lambda: raw(args, path, sorted(set(args.greedy)), model["results"].append)
                )
            elif label == "engine":
                sweep = model.setdefault("engine", [])
                guarded(
                    doc, f"{preset} engine", lambda: engine_sweep(args, path, sweep.append, max(30.0, budget.left()))
                )
            elif label == "restart":
                rounds = model.setdefault("restart", [])
                guarded(doc, f"{preset} restart", lambda: restart(args, path, rounds.append))
            else:
                guarded(
                    doc, f"{preset} {label}", lambda: http(args, label, path, model["results"].append, budget, extra)
                )
            model["part_seconds"][label] = round(time.monotonic() - t0, 1)
            save()
    finally:
        doc["seconds_left"] = round(budget.left())
        save()
    with open(os.path.join(args.outdir, "results.md")) as f:
        print(f.read())
    return 0


if __name__ == "__main__":
    sys.exit(main())
