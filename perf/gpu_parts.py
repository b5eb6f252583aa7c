"""The parts of a GPU run (perf/gpu_run.py), each measuring on one model file: raw llama.cpp
(llama-batched-bench), a server over HTTP (llama-server or cllm, greedy then sampled, then its memory), the
speculation copy tasks, `cllm bench engine --sweep`, and the next turn after a restart; with the servers' start and
bounded stop. GPU_RUN_DRY=1 shrinks the speculation and restart parts' shapes for a dry run on a CPU build.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time

import httpx
import psutil

from cllm.bench import dialects, http_load
from perf import servers
from perf.memory import MIB, gpu_bytes, nvidia_smi

DRY = os.environ.get("GPU_RUN_DRY") == "1"
PROMPT = 26
REQUEST_TIMEOUT = 120.0


class Budget:
    """The seconds left of the whole run."""

    def __init__(self, seconds: float):
        self.end = time.monotonic() + seconds

    def left(self) -> float:
        return self.end - time.monotonic()


# ---- the contestants -------------------------------------------------------------------------------


def launch(label: str, cmd: list[str], port: int, logs: str, env: dict[str, str] | None = None) -> servers.Server:
    """Start a server (``env`` added to its environment) in a session of its own and wait, bounded, until /health
    answers 200."""
    system = "cllm" if label.startswith("cllm") else "llama-server"
    return servers.launch(system, cmd, port, "/health", env=env, label=label, logs=logs, new_session=True)


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
        used = gpu_bytes()
        try:
            # A VM or container may list no processes: then the device's use less what it used before any server.
            vram = sum(used.get(p, 0) for p in pids) // MIB if any(p in used for p in pids) else gpu_used() - baseline
        except (subprocess.SubprocessError, ValueError):
            pass
    return {"rss_mib": round(rss / 2**20), "vram_mib": vram}


def gpu_used() -> int:
    """MiB in use on the GPU, all processes together."""
    return int(nvidia_smi("--query-gpu=memory.used", timeout=20).strip().splitlines()[0])


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
        mem = memory(server.proc.pid, args.gpu_baseline)
        if label.startswith("cllm"):  # what the engine's llama.cpp says it holds, for where the VRAM goes
            info = httpx.get(server.url + "/model/info", timeout=REQUEST_TIMEOUT).json()["data"]
            mem["reported_mib"] = {k: round(info.get(f"{k}_bytes", 0) / MIB) for k in ("model", "kv", "compute")}
        record({"system": label, "memory": mem})
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

    # No draft-model systems (the one model carried is the embedded one, which would draft for itself), and of
    # llama-server's n-gram types the two the device call's budget fits: ngram-mod, its best on this CPU
    # (perf/results/2026-12-05-speculation-llama-server-ngram-types.md), and ngram-simple.
    labels = ["cllm", "cllm-nospec", "llama-server-ngram-mod", "llama-server-ngram-simple", "llama-server-none"]
    started = []
    try:
        for label in labels:
            system, extra = speculative.SYSTEMS[label]
            port = servers.free_port()
            parallel, seq = (2, 2048) if DRY else (8, 4096)
            cmd = server_cmd(system, args, model, parallel, parallel * seq, port, extra)
            # cllm's two clients, as perf/speculative.py starts it: the other key's run gets no help from the memory
            env = {"CLLM_API_KEY": ",".join(speculative.KEYS)} if system == "cllm" else None
            started.append(launch(label, cmd, port, args.logs, env))
        clients = {label: httpx.Client(base_url=s.url, timeout=REQUEST_TIMEOUT) for label, s in zip(labels, started)}
        opts = argparse.Namespace(
            concurrency=[1, 8] if not DRY else [1],
            rounds=1 if DRY else 2,
            max_tokens=16 if DRY else 256,
            ordinary_tokens=16 if DRY else 128,
            workloads=["copy", "ordinary"],
        )
        got, _ = speculative.measure(clients, labels, opts)
        record({"system": "speculation", "table": speculative.table(got, labels)})
    finally:
        for s in started:
            stop(s)


def restart(args, model: str, record) -> None:
    """The next turn of a ~4,000-token conversation after a restart on --cache-dir, against the same turn on the
    server that wrote the files (perf/restart_cache.py's round: issue 61 asks for <= 1.3x), two rounds, each with the
    start's warm-up (--warmup auto: on with GPU layers) and without it. A dry run has one round, warmed up."""
    from perf import restart_cache

    gpu = ("--n-gpu-layers", "999", "--flash-attn", "on")
    history = 300 if DRY else 4000
    for i in range(1 if DRY else 2):
        for warmup in ("on",) if DRY else ("auto", "off"):
            settings = servers.Settings(model, args.threads, 2, 2048 if DRY else 8192, (*gpu, "--warmup", warmup))
            with tempfile.TemporaryDirectory(prefix="cllm-kv-") as cache_dir:
                sections = max(1, history // restart_cache.TOKENS_PER_SECTION)
                row = restart_cache.one_round(settings, cache_dir, 100 + i, sections, 4 if DRY else 32)
                record({**row, "warmup": warmup})


def engine_sweep(args, model: str, record, seconds: float) -> None:
    """`cllm bench engine --sweep` in a process of its own, in lockstep with sampling on the host then on the
    device, then with staggered arrivals: the step's host work per step beside llama_decode's, and the share of
    decode steps that reused their compute graph, at c = 1, 8, 32, 64, greedy and sampled."""
    end = time.monotonic() + seconds
    sweeps = (("lockstep", "auto", "off"), ("lockstep", "auto", "on"), ("staggered", "on", "off"))
    for arrivals, steady, device in sweeps:
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
            "--device-sampling",
            device,
        ]
        out = subprocess.run(cmd, capture_output=True, text=True, timeout=max(10.0, end - time.monotonic()))
        if out.returncode:
            raise RuntimeError(
                f"cllm bench engine --arrivals {arrivals} --steady {steady} --device-sampling {device} failed: "
                f"{out.stderr[-1500:]}"
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
