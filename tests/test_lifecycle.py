"""`cllm serve` as a process: start-up errors, its children, idle CPU, shutdown."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time

import httpx
import psutil
import pytest

from tests.conftest import ROOT, start_server


def serve_fails(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "cllm.cli", "serve", *args], cwd=ROOT, capture_output=True, text=True, timeout=60
    )


def shm_entries() -> set[str]:
    return set(os.listdir("/dev/shm")) if os.path.isdir("/dev/shm") else set()


@pytest.mark.parametrize(
    "make_path,message",
    [
        (lambda d: str(d / "missing.gguf"), "model file not found"),
        (lambda d: str(d), "model path is a directory"),
        (lambda d: (d / "notes.txt").write_text("hello") and str(d / "notes.txt"), "not a GGUF model file"),
    ],
)
def test_bad_model_path_is_one_clear_line(tmp_path, make_path, message):
    before = shm_entries()
    r = serve_fails("--model", make_path(tmp_path), "--port", "0")
    assert r.returncode == 2
    assert r.stderr.count("\n") == 1 and r.stderr.startswith("cllm: ") and message in r.stderr
    assert "Traceback" not in r.stderr
    assert shm_entries() == before


def test_bad_settings_are_one_clear_line(tmp_path):
    r = serve_fails("--parallel", "0")
    assert r.returncode == 2 and r.stderr == "cllm: invalid setting: Expected `int` >= 1 - at `$.parallel`\n"
    cfg = tmp_path / "c.yaml"
    cfg.write_text("paralel: 4\n")
    r = serve_fails("--config", str(cfg))
    assert r.returncode == 2 and "unknown field `paralel`" in r.stderr


def test_help_explains_every_option():
    out = subprocess.run([sys.executable, "-m", "cllm.cli", "serve", "--help"], cwd=ROOT, capture_output=True, text=True).stdout
    for opt in ("--host", "--port", "--model", "--ctx-size", "--parallel", "--threads", "--batch-size", "--config"):
        assert opt in out


def _family(proc: subprocess.Popen) -> list[psutil.Process]:
    root = psutil.Process(proc.pid)
    return [root, *root.children(recursive=True)]


@pytest.fixture
def small_server(tmp_path):
    """A server configured from YAML (the command line overriding one key), small contexts."""
    cfg = tmp_path / "cllm.yaml"
    cfg.write_text("parallel: 2\nctx-size: 512\nbatch-size: 64\nport: 1\n")
    before = shm_entries()
    srv = start_server("--config", str(cfg))  # start_server passes --port, which wins over the file
    yield srv, before
    srv.stop(signal.SIGKILL)


def test_config_file_context_full_and_clean_sigterm(small_server):
    srv, shm_before = small_server
    family = _family(srv.proc)
    assert len(family) == 3  # supervisor, engine, frontend
    cmdlines = " ".join(" ".join(p.cmdline()) for p in family)
    assert "engine_proc" in cmdlines and "frontend_proc" in cmdlines

    with srv.client() as http:
        info = http.get("/model/info").json()["data"]
        assert info["parallel"] == 2 and info["ctx_size"] == 512 and info["max_sequence_length"] == 256
        prompt_tokens = http.post("/encode", json={"text": "Count: one two three"}).json()["data"]["length"]
        data = http.post("/generate", json={"prompt": "Count: one two three", "max_tokens": 256, "ignore_eos": True, "temperature": 0}).json()["data"]
        assert data["finish_reason"] == "length"
        # every KV cell is used; the last token sampled needs none
        assert data["generated_tokens"] == 256 - prompt_tokens + 1

    assert srv.stop(signal.SIGTERM) == 0
    assert not any(p.is_running() and p.status() != psutil.STATUS_ZOMBIE for p in family)
    assert shm_entries() == shm_before


def test_sigint_finishes_in_flight_request_then_exits_clean(small_server):
    srv, shm_before = small_server
    family = _family(srv.proc)
    result = {}

    def long_request():
        with srv.client() as http:
            r = http.post("/generate", json={"prompt": "Hi", "max_tokens": 100, "ignore_eos": True, "temperature": 0})
            result["status"], result["data"] = r.status_code, r.json()["data"]

    t = threading.Thread(target=long_request)
    t.start()
    time.sleep(0.5)  # let it start decoding
    srv.proc.send_signal(signal.SIGINT)
    t.join(60)
    assert result["status"] == 200 and result["data"]["generated_tokens"] == 100
    assert srv.proc.wait(30) == 0
    assert not any(p.is_running() and p.status() != psutil.STATUS_ZOMBIE for p in family)
    assert shm_entries() == shm_before
    with pytest.raises(httpx.ConnectError):
        httpx.get(srv.url + "/health", timeout=2)


def test_idle_server_uses_no_cpu(server):
    family = _family(server.proc)
    assert len(family) == 3
    with server.client() as http:  # leave it idle after some work
        http.post("/generate", json={"prompt": "Hello", "max_tokens": 5})
    time.sleep(1.0)
    cpu = lambda: sum(sum(p.cpu_times()[:2]) for p in family)  # noqa: E731
    start, t0 = cpu(), time.monotonic()
    time.sleep(10)
    used = (cpu() - start) / (time.monotonic() - t0)
    assert used < 0.01, f"{used:.2%} of a core while idle"
