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
speculation (perf/speculative.py): cllm with and without n-gram drafting, llama-server's n-gram drafters.

Every part has a time budget, parts that no longer fit the whole run's are skipped (and said so), every
wait is bounded and every server is stopped. Writes OUTDIR/results.json, results.md and plot.png (with
matplotlib). GPU_RUN_DRY=1 shrinks shapes, counts and budgets for a dry run on a CPU build.
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

import psutil

from cllm.bench import dialects, http_load
from perf import servers, synth_model
from perf.gpu_report import render

DRY = os.environ.get("GPU_RUN_DRY") == "1"
# (models, greedy c, sampled c, generated tokens, prompt tokens, seconds for the whole run)
PLAN: dict[str, Any] = (
    dict(models=["tiny"], greedy=[1, 4], sampled=[4], gen=8, budget=240)
    if DRY
    else dict(models=["smollm2", "8b", "1b"], greedy=[1, 32, 64, 8], sampled=[32, 64], gen=256, budget=480)
)
PROMPT = 26
REQUEST_TIMEOUT = 120.0


class Budget:
    def __init__(self, seconds: float):
        self.end = time.monotonic() + seconds

    def left(self) -> float:
        return self.end - time.monotonic()


# ---- the contestants -------------------------------------------------------------------------------


def launch(label: str, cmd: list[str], port: int, logs: str) -> servers.Server:
    """Start a server in a session of its own and wait, bounded, until /health answers 200."""
    system = "cllm" if label.startswith("cllm") else "llama-server"
    return servers.launch(system, cmd, port, "/health", label=label, logs=logs, new_session=True)


def server_cmd(
    label: str, args, model: str, parallel: int, ctx: int, port: int, extra: tuple[str, ...] = ()
) -> list[str]:
    common = [
        "--model",
        model,
        "--port",
        str(port),
        "--threads",
        str(args.threads),
        "--parallel",
        str(parallel),
        "--ctx-size",
        str(ctx),
    ]
    if label.startswith("cllm"):
        return [
            sys.executable,
            "-m",
            "cllm.cli",
            "serve",
            *common,
            "--n-gpu-layers",
            "999",
            "--flash-attn",
            "on",
            *extra,
        ]
    return [
        os.path.join(args.bin, "llama-server"),
        *common,
        "--host",
        "127.0.0.1",
        "--threads-batch",
        str(args.threads),
        "--n-gpu-layers",
        "999",
        "--flash-attn",
        "on",
        "--no-webui",
        *extra,
    ]


def tree_pids(pid: int) -> list[int]:
    try:
        root = psutil.Process(pid)
        return [root.pid, *(p.pid for p in root.children(recursive=True))]
    except psutil.Error:
        return []


def memory(pid: int, baseline: int) -> dict:
    """RSS of a server's process tree and its VRAM (nvidia-smi's per-process figure, else the device's use
    less ``baseline``), in MiB."""
    pids = tree_pids(pid)
    rss = 0
    for p in pids:
        try:
            rss += psutil.Process(p).memory_info().rss
        except psutil.Error:
            pass
    vram = None
    if shutil.which("nvidia-smi"):
        try:
            out = subprocess.run(
                ["nvidia-smi", "--query-compute-apps=pid,used_memory", "--format=csv,noheader,nounits"],
                capture_output=True,
                text=True,
                timeout=20,
            ).stdout
            used = {int(a): int(b) for a, b in (line.split(",") for line in out.strip().splitlines() if "," in line)}
            # A VM or container may list no processes: then the device's use less what it used before any server.
            vram = sum(used.get(p, 0) for p in pids) if any(p in used for p in pids) else gpu_used() - baseline
        except (subprocess.SubprocessError, ValueError):
            pass
    return {"rss_mib": round(rss / 2**20), "vram_mib": vram}


def gpu_used() -> int:
    """MiB in use on the GPU, all processes together."""
    out = subprocess.run(
        ["nvidia-smi", "--query-gpu=memory.used", "--format=csv,noheader,nounits"],
        capture_output=True,
        text=True,
        timeout=20,
    ).stdout
    return int(out.strip().splitlines()[0])


class Sampled(dialects.Dialect):
    """A dialect's request with temperature 0.7 and top-p 0.9 instead of greedy."""

    def __init__(self, inner: dialects.Dialect):
        super().__init__(inner.path)
        self.inner = inner

    def body(self, prompt, gen_tokens, stream):
        return {**self.inner.body(prompt, gen_tokens, stream), "temperature": 0.7, "top_p": 0.9}

    def tokens(self, answer):
        return self.inner.tokens(answer)

    def event(self, event):
        return self.inner.event(event)


# ---- the parts ---------------------------------------------------------------------------------------


def raw(args, model: str, conc: list[int], record) -> None:
    """llama-batched-bench at every concurrency in one process."""
    ctx = max(conc) * (PROMPT + args.gen + 8)
    cmd = [
        os.path.join(args.bin, "llama-batched-bench"),
        "-m",
        model,
        "-c",
        str(ctx),
        "-b",
        "2048",
        "-ub",
        "512",
        "-npp",
        str(PROMPT),
        "-ntg",
        str(args.gen),
        "-npl",
        ",".join(map(str, conc)),
        "-ngl",
        "999",
        "-fa",
        "on",
        "-t",
        str(args.threads),
        "--output-format",
        "jsonl",
    ]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=args.part_timeout)
    if out.returncode:
        raise RuntimeError(f"llama-batched-bench failed: {out.stderr[-1500:]}")
    for line in out.stdout.splitlines():
        if line.startswith("{"):
            r = json.loads(line)
            record(
                {
                    "system": "raw",
                    "concurrency": r["pl"],
                    "sampled": False,
                    "tokens_per_second": r["pl"] * r["tg"] / r["t"],
                    "decode_tokens_per_second": r["speed_tg"],
                    "generated_tokens": r["pl"] * r["tg"],
                    "seconds": r["t"],
                    "errors": 0,
                }
            )


def http(args, label: str, model: str, record, budget: Budget, extra: tuple[str, ...] = ()) -> None:
    """One server: started, warmed up, loaded at every cell (greedy, then sampled), measured, stopped."""
    parallel = max(args.greedy + args.sampled)
    port = servers.free_port()
    server = launch(
        label, server_cmd(label, args, model, parallel, parallel * args.seq_ctx, port, extra), port, args.logs
    )
    try:
        base = dialects.make_dialect("cllm" if label.startswith("cllm") else "llama-server")
        http_load.warm_up(server.url, base, parallel, REQUEST_TIMEOUT)
        cells = [(c, False) for c in args.greedy] + [(c, True) for c in args.sampled]
        for c, sampled in cells:
            if budget.left() < 5:
                print(f"  {label}: out of time, cells left out", flush=True)
                break
            r = http_load.run_cell(
                server.url,
                Sampled(base) if sampled else base,
                c,
                args.requests(c),
                PROMPT,
                args.gen,
                False,
                [server.proc.pid],
                REQUEST_TIMEOUT,
                progress=False,
            )
            record({**r, "system": label, "sampled": sampled})
        record({"system": label, "memory": memory(server.proc.pid, args.gpu_baseline)})
    finally:
        stop(server)


def stop(server: servers.Server) -> None:
    try:
        os.killpg(server.proc.pid, signal.SIGTERM)
        server.proc.wait(20)
    except (ProcessLookupError, subprocess.TimeoutExpired):
        try:
            os.killpg(server.proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        server.proc.wait()


def speculation(args, model: str, record) -> None:
    """Copy tasks at c = 1 and 8 (perf/speculative.py's), on a real model: synthetic weights copy nothing."""
    import httpx

    from perf import speculative

    labels = list(speculative.SYSTEMS)
    started = []
    try:
        for label in labels:
            system, extra = speculative.SYSTEMS[label]
            port = servers.free_port()
            parallel, seq = (2, 2048) if DRY else (8, 4096)
            started.append(
                launch(label, server_cmd(system, args, model, parallel, parallel * seq, port, extra), port, args.logs)
            )
        clients = {label: httpx.Client(base_url=s.url, timeout=REQUEST_TIMEOUT) for label, s in zip(labels, started)}
        opts = argparse.Namespace(
            concurrency=[1, 8] if not DRY else [1], rounds=1 if DRY else 2, max_tokens=16 if DRY else 256
        )
        record({"system": "speculation", "table": speculative.run_copy(clients, labels, opts)})
    finally:
        for s in started:
            stop(s)


def engine_sweep(args, model: str, record, seconds: float) -> None:
    """`cllm bench engine --sweep` in a process of its own, with lockstep then staggered arrivals: the step's
    host work per step beside llama_decode's, and the share of decode steps that reused their compute graph,
    at c = 1, 8, 32, 64, greedy and sampled."""
    end = time.monotonic() + seconds
    for arrivals, steady in (("lockstep", "auto"), ("staggered", "on"), ("staggered", "off")):
        cmd = [
            sys.executable,
            "-m",
            "cllm.cli",
            "bench",
            "engine",
            "--sweep",
            "--json",
            "--model",
            model,
            "--threads",
            str(args.threads),
            "-g",
            str(args.gen),
            "--arrivals",
            arrivals,
            "--steady",
            steady,
        ]
        out = subprocess.run(cmd, capture_output=True, text=True, timeout=max(10.0, end - time.monotonic()))
        if out.returncode:
            raise RuntimeError(
                f"cllm bench engine --arrivals {arrivals} --steady {steady} failed: {out.stderr[-1500:]}"
            )
        for r in json.loads(out.stdout.strip().splitlines()[-1]):
            keep = (
                "concurrency",
                "sampled",
                "device_sampling",
                "steps",
                "tokens_per_second",
                "step_ms",
                "host_us_per_step",
                "decode_steps",
                "reused_steps",
                "steady",
            )
            record(
                {k: r[k] for k in keep}
                | {"arrivals": arrivals, "decode_ms": 1000 * r["parts_seconds"]["llama_decode"] / r["steps"]}
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
# Seconds a server's part needs on the H100, about, at 256 generated tokens a request (64 took 35 / 40 / 50).
ESTIMATE = {"tiny": 10, "smollm2": 80, "1b": 90, "8b": 120}


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


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("outdir")
    ap.add_argument(
        "--bin", default=os.environ.get("GPU_BIN", ".gpu/work/build/bin"), help="llama.cpp's built binaries"
    )
    ap.add_argument("--models-dir", default=os.environ.get("GPU_MODELS", ".gpu/work/models"))
    ap.add_argument("--models", default=",".join(PLAN["models"]), help="synth_model presets, in order of importance")
    ap.add_argument(
        "--parts",
        default="servers,speculation,engine",
        help="of: servers (every contestant on every model), speculation (a real model's copy tasks), "
        "engine (cllm bench engine --sweep on each model)",
    )
    ap.add_argument(
        "--contestants",
        default="raw,llama-server,llama-server -bs,cllm",
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
    args = ap.parse_args(argv)
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

    doc = {
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

    def save() -> None:
        with open(os.path.join(args.outdir, "results.json"), "w") as f:
            json.dump(doc, f, indent=1)
        render(args.outdir)

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
    parts += [(p, c) for p in presets if p == "1b" for c in contestants] if "servers" in chosen else []
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
                need = ESTIMATE.get(preset, 40)
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
