"""What llama.cpp allocates for cllm's engine context and for llama-server's at the same settings, as llama.cpp's own
log says it: the model, KV, output and compute buffers per device, and the logits rows reserved (n_outputs_max).

On a GPU these are most of each process's VRAM; on a CPU the same allocator sizes them, so a difference between
the two servers shows here without a device. cllm's context is made in this process (engine_proc's ModelRunner);
llama-server is started with its log at debug level and stopped once its buffers are reported.

    .venv/bin/python -m perf.context_buffers [--model PATH] [--parallel 64] [--ctx-size 20096] [--spec-type ngram]
"""

from __future__ import annotations

import argparse
import contextlib
import re
import subprocess
import sys
import time

import llama_cpp as L

from cllm.core.config import ServeConfig
from cllm.core.model_file import resolve_model
from perf import servers

BUFFER = re.compile(r"(\w+)\s+(model|output|KV|compute) buffer size =\s*([\d.]+) MiB")
OUTPUTS = re.compile(r"n_outputs_max\s*=\s*(\d+)")
LOG_WAIT = 300.0  # seconds llama-server may take to load a model and reserve its graph on 2 cores

_said: list[str] = []


@L.llama_log_callback
def _keep(level, text, user_data):
    _said.append(text.decode(errors="replace"))


def figures(log: str) -> dict[str, float]:
    """Buffer -> MiB (summed over its devices' lines), and the reserved logits rows."""
    out: dict[str, float] = {}
    for device, kind, mib in BUFFER.findall(log):
        key = kind if device in ("CPU", "CPU_Mapped") or device.startswith(("CUDA", "Metal", "Vulkan")) else None
        if key is None:  # CPU_REPACK and the like: another layout of the model's weights
            key = f"{kind} ({device})"
        out[key] = out.get(key, 0.0) + float(mib)
    if m := OUTPUTS.search(log):
        out["n_outputs_max"] = float(m.group(1))
    return out


def cllm_context(model: str, args) -> dict[str, float]:
    import engine_proc.run.model_runner as mr

    config = ServeConfig(
        parallel=args.parallel, ctx_size=args.ctx_size, flash_attn="on", spec_type=args.spec_type, spec_memory=0
    )
    _said.clear()
    mr.silence_llama_logs = lambda: L.llama_log_set(_keep, None)  # the model's buffers, as it loads
    reported = mr.reported

    @contextlib.contextmanager
    def kept():  # the context's, which the runner reads itself
        with reported() as lines:
            yield lines
        _said.extend(lines)

    mr.reported = kept
    runner = mr.ModelRunner(model, config)
    runner.close()
    return figures("".join(_said))


def llama_server_context(model: str, args) -> dict[str, float]:
    cmd = [
        args.llama_server, "-lv", "4", "--model", model, "--port", str(servers.free_port()), "--threads", "2",
        "--parallel", str(args.parallel), "--ctx-size", str(args.ctx_size), "-fa", "on",
    ]  # fmt: skip
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, errors="replace")
    lines, deadline = [], time.monotonic() + LOG_WAIT
    try:
        assert proc.stdout is not None
        for line in proc.stdout:
            lines.append(line)
            if "compute buffer size" in line or time.monotonic() > deadline:
                break
    finally:
        proc.kill()
        proc.wait()
    return figures("".join(lines))


def main(argv: list[str]) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default=None, help="GGUF file (default: the embedded SmolLM2)")
    ap.add_argument("--parallel", type=int, default=64)
    ap.add_argument("--ctx-size", type=int, default=64 * 314, help="default: perf/gpu_run.py's at 64 sequences")
    ap.add_argument("--spec-type", default="none")
    ap.add_argument("--llama-server", default=servers.LLAMA_SERVER)
    args = ap.parse_args(argv)
    model = args.model or resolve_model(None)
    rows = {"llama-server": llama_server_context(model, args), "cllm": cllm_context(model, args)}
    keys = sorted({k for r in rows.values() for k in r}, key=lambda k: (k == "n_outputs_max", k))
    print(f"{model}: --parallel {args.parallel} --ctx-size {args.ctx_size}, flash attention on, spec {args.spec_type}")
    print("| buffer (MiB) | " + " | ".join(rows) + " | cllm - llama-server |")
    print("|---|" + "---|" * (len(rows) + 1))
    for k in keys:
        a, b = rows["llama-server"].get(k, 0.0), rows["cllm"].get(k, 0.0)
        print(f"| {k} | {a:,.2f} | {b:,.2f} | {b - a:+,.2f} |")


if __name__ == "__main__":
    main(sys.argv[1:])
