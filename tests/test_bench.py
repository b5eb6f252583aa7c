"""Smoke tests of `cllm bench`: both benchmarks run end to end on tiny settings."""

from __future__ import annotations

import contextlib
import json
import subprocess
import sys
import time

import psutil
import pytest

from tests.conftest import ROOT

# A bench that hangs is stopped by what it does, not by the clock: beside busy programs (a load of ten times the
# CPUs) a bench that takes ~15 CPU seconds ran past a 120 s wall-clock limit. One that spins uses its CPU
# budget, several times what any bench here takes; one that waits (a deadlock, a server that never answers)
# gets no CPU for STALL seconds.
CPU_BUDGET = 120.0
STALL = 60.0


def run(cmd: list[str]) -> subprocess.CompletedProcess:
    """``cmd`` run to its end, or killed (and the test failed) once it spent CPU_BUDGET or stalled."""
    proc = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    ps, cpu, progressed = psutil.Process(proc.pid), 0.0, time.monotonic()
    while True:
        try:
            out, err = proc.communicate(timeout=1)  # retried after a timeout without losing output
            return subprocess.CompletedProcess(cmd, proc.returncode, out, err)
        except subprocess.TimeoutExpired:
            pass
        now = time.monotonic()
        with contextlib.suppress(psutil.NoSuchProcess):  # it ended: communicate() returns next
            t = ps.cpu_times()
            if (spent := t.user + t.system + t.children_user + t.children_system) > cpu:
                cpu, progressed = spent, now
        if cpu > CPU_BUDGET or now - progressed > STALL:
            proc.kill()
            out, err = proc.communicate()
            raise AssertionError(f"{cmd[3:]}: {cpu:.0f} CPU s, none for {now - progressed:.0f} s; killed\n{err}")


def bench(*args: str) -> list | dict:
    out = run([sys.executable, "-m", "cllm.cli", "bench", *args, "--json"])
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout)


def test_bench_engine_counts_every_token_and_splits_the_step():
    r = bench("engine", "-n", "3", "-c", "2", "-p", "12", "-g", "4")
    assert r["generated_tokens"] == 12 and not r["sampled"]
    assert r["steps"] >= 4 + 1  # two waves: 3 requests at most 2 at a time
    parts = r["parts_seconds"]
    assert {
        "admit",
        "schedule",
        "batch",
        "llama_decode",
        "sampling",
        "retire",
        "other",
        "publish",
        "loop",
    } <= parts.keys()
    assert parts["llama_decode"] > 0
    assert all(s >= 0 for s in parts.values())


def test_bench_engine_reports_the_hosts_time_per_step_sampled():
    r = bench("engine", "-n", "2", "-c", "2", "-p", "12", "-g", "3", "--sampled")
    assert r["generated_tokens"] == 6 and r["sampled"]
    host = r["host_us_per_step"]
    for kind in ("wall", "cpu"):
        parts = host[kind]
        assert {"schedule", "batch", "sampling", "retire", "other"} < parts.keys()
        assert all(v >= 0 for v in parts.values()) and parts["sampling"] > 0
        on_path = sum(v for k, v in parts.items() if k not in ("host", "overlapped"))
        assert abs(parts["host"] - on_path) < 1e-6 * parts["host"] + 1e-9
        assert parts["overlapped"] == 0  # no steady steps: nothing runs ahead
    # The wall clock's host part is the step's time but llama_decode: below the step's whole time.
    assert host["wall"]["host"] < 1000 * r["step_ms"]


def test_bench_engine_staggers_arrivals_and_counts_reused_graphs():
    from cllm.bench.engine_bench import gen_lengths

    lengths = gen_lengths(6, 8, True)
    assert len(set(lengths)) > 1 and all(4 <= n <= 12 for n in lengths)
    r = bench("engine", "-n", "6", "-c", "3", "-p", "12", "-g", "8", "--arrivals", "staggered")
    assert r["staggered"] and r["generated_tokens"] == sum(lengths)
    assert 0 < r["reused_steps"] <= r["decode_steps"] <= r["steps"]
    lockstep = bench("engine", "-n", "2", "-c", "2", "-p", "12", "-g", "6")
    # Two sequences join together, decode 5 steps of one shape, leave together: every decode step but the first reuses.
    assert (lockstep["decode_steps"], lockstep["reused_steps"]) == (5, 4)


def test_steady_batches_keep_the_graph_and_every_token():
    from cllm.bench.engine_bench import gen_lengths

    args = ("engine", "-n", "12", "-c", "6", "-p", "12", "-g", "16", "--arrivals", "staggered")
    steady, plain = bench(*args, "--steady", "on"), bench(*args, "--steady", "off")
    assert steady["steady"] and not plain["steady"]
    # Parked sequences give no token: every request its own length, no more.
    assert steady["generated_tokens"] == plain["generated_tokens"] == sum(gen_lengths(12, 16, True))
    share = lambda r: r["reused_steps"] / r["decode_steps"]  # noqa: E731
    assert share(steady) > share(plain) + 0.15, (share(steady), share(plain))
    # Steady decodes run a step ahead: recording the tokens before (retire) is done while the next one runs.
    ahead, sync = steady["host_us_per_step"]["cpu"], plain["host_us_per_step"]["cpu"]
    assert ahead["overlapped"] > ahead["retire"] and sync["overlapped"] == 0 < sync["retire"], (ahead, sync)


def test_bench_engine_speculates_on_copy_tasks():
    r = bench("engine", "-n", "1", "-c", "1", "-g", "48", "--prompts", "copy", "--spec-type", "ngram")
    assert r["generated_tokens"] == 48 and r["copy"]
    assert 0 < r["accepted_tokens"] <= r["drafted_tokens"]
    assert r["steps"] < 48  # drafts kept: fewer steps than tokens


def test_bench_http_measures_the_server_and_its_processes(server):
    [r] = bench("http", "--url", server.url, "-c", "2", "-n", "3", "-g", "5", "--stream", "--pid", str(server.proc.pid))
    assert (r["errors"], r["short"], r["generated_tokens"]) == (0, 0, 15)
    assert r["ttft"]["p50"] is not None and r["ttft"]["p50"] <= r["latency"]["p50"]
    # what harnesses report of a stream: the gaps between its events with text, the time per token after the
    # first, and how many tokens an event carries (one each: two streams are never held back in the engine).
    # A gap lies inside one request, so none outlasts the longest request; a busy machine can stretch one gap
    # past the median request, so only the median gap is held to the median request.
    itl = r["itl"]
    assert 0 < itl["p50"] < r["latency"]["p50"] and itl["p50"] <= itl["p99"] <= itl["max"] <= r["latency"]["max"]
    assert r["tpot"]["p50"] > 0
    assert 1 <= r["tokens_per_event"] <= 1.25
    assert {"engine", "frontend"} <= r["cpu_seconds"].keys()


@pytest.mark.parametrize("stream", [["--stream"], []])
def test_bench_http_speaks_ollamas_chat_with_exact_counts(server, stream):
    name = "SmolLM2-135M-Instruct.Q4_1:latest"  # as /api/tags lists it
    [r] = bench(
        "http",
        "--url",
        server.url,
        "--dialect",
        "ollama",
        "--model-name",
        name,
        "-c",
        "2",
        "-n",
        "3",
        "-g",
        "5",
        *stream,
    )
    assert (r["errors"], r["short"], r["generated_tokens"]) == (0, 0, 15), r["first_error"]
    assert (r["ttft"]["p50"] is not None) == bool(stream)


def test_bench_http_reports_a_refused_url():
    out = run(
        [
            sys.executable,
            "-m",
            "cllm.cli",
            "bench",
            "http",
            "--url",
            "http://127.0.0.1:9",
            "-n",
            "1",
            "-c",
            "1",
            "--no-warmup",
        ]
    )
    assert out.returncode == 1
    assert "1 errors" in out.stdout
