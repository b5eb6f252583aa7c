"""`cllm serve` as a process: start-up errors, its children, idle CPU, shutdown."""

from __future__ import annotations

import signal
import socket
import subprocess
import sys
import threading
import time

import httpx
import pytest

from tests.conftest import ROOT, alive, child, family, health, shm_entries, start_server, wait_until


def serve_fails(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "cllm.cli", "serve", *args], cwd=ROOT, capture_output=True, text=True, timeout=60
    )


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
    out = subprocess.run(
        [sys.executable, "-m", "cllm.cli", "serve", "--help"], cwd=ROOT, capture_output=True, text=True
    ).stdout
    for opt in (
        "--host",
        "--port",
        "--model",
        "--ctx-size",
        "--parallel",
        "--threads",
        "--batch-size",
        "--config",
        "--shutdown-timeout",
        "--max-prompt-tokens",
        "--max-tokens",
        "--max-body-bytes",
        "--max-waiting",
        "--request-timeout",
        "--api-key",
        "--no-prefix-cache",
        "--flash-attn",
        "--log-level",
        "--log-format",
    ):
        assert opt in out


def test_port_in_use_is_one_clear_line():
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        r = serve_fails("--port", str(taken.getsockname()[1]))
    assert r.returncode == 2
    assert r.stderr.startswith("cllm: cannot listen on 127.0.0.1:") and r.stderr.count("\n") == 1


@pytest.fixture
def small_server(tmp_path):
    """A server configured from YAML (the command line overriding one key), small contexts."""
    cfg = tmp_path / "cllm.yaml"
    cfg.write_text("parallel: 2\nctx-size: 512\nbatch-size: 64\nport: 1\nshutdown-timeout: 150\n")
    before = shm_entries()
    srv = start_server("--config", str(cfg))  # start_server passes --port, which wins over the file
    yield srv, before
    srv.stop(signal.SIGKILL)


def test_config_file_context_full_and_clean_sigterm(small_server):
    srv, shm_before = small_server
    procs = family(srv.proc)
    assert len(procs) == 3  # supervisor, engine, frontend
    cmdlines = " ".join(" ".join(p.cmdline()) for p in procs)
    assert "engine_proc" in cmdlines and "frontend_proc" in cmdlines

    with srv.client(timeout=180) as http:  # 256 tokens, on a machine that may be busy
        info = http.get("/model/info").json()["data"]
        assert info["parallel"] == 2 and info["ctx_size"] == 512 and info["max_sequence_length"] == 256
        prompt_tokens = http.post("/encode", json={"text": "Count: one two three"}).json()["data"]["length"]
        data = http.post(
            "/generate",
            json={"prompt": "Count: one two three", "max_tokens": 256, "ignore_eos": True, "temperature": 0},
        ).json()["data"]
        assert data["finish_reason"] == "length"
        # every KV cell is used; the last token sampled needs none
        assert data["generated_tokens"] == 256 - prompt_tokens + 1

    assert srv.stop(signal.SIGTERM) == 0
    assert not alive(procs)
    assert shm_entries() == shm_before


# A process's compiled modules are in its memory map once imported: (process, libraries it must not have loaded)
HEAVY = {"frontend_proc": ("/numpy/", "/psutil/"), "engine_proc": ("/markupsafe/",)}  # markupsafe: jinja2's


def test_the_processes_start_without_the_heavy_modules(small_server):
    """What start-up runs, not only what the modules import at the top (tests/unit/test_startup_imports.py): a
    server that serves has loaded none of them."""
    srv, _ = small_server
    for module, heavy in HEAVY.items():
        with open(f"/proc/{child(srv, module).pid}/maps") as f:
            loaded = {line.split()[-1] for line in f if "/" in line}
        assert [m for m in loaded if "/llama_cpp/" in m], loaded  # the check sees the libraries both load
        assert not [m for m in loaded if any(h in m for h in heavy)], (module, sorted(loaded))


def test_sigint_finishes_in_flight_request_then_exits_clean(small_server):
    srv, shm_before = small_server
    procs = family(srv.proc)
    result = {}

    def long_request():
        with srv.client(timeout=150) as http:  # 100 tokens, on a machine that may be busy
            r = http.post("/generate", json={"prompt": "Hi", "max_tokens": 100, "ignore_eos": True, "temperature": 0})
            result["status"], result["data"] = r.status_code, r.json()["data"]

    t = threading.Thread(target=long_request)
    t.start()
    with srv.client() as http:
        wait_until(lambda: health(http, "detailed")["queue"]["in_flight"] == 1, 30)
    srv.proc.send_signal(signal.SIGINT)
    t.join(150)
    assert result["status"] == 200 and result["data"]["generated_tokens"] == 100
    assert srv.proc.wait(30) == 0
    assert not alive(procs)
    assert shm_entries() == shm_before
    with pytest.raises(httpx.ConnectError):
        httpx.get(srv.url + "/health", timeout=2)


def test_killed_supervisor_takes_its_children_along():
    # Its lifelines close: the frontend drains and exits, the engine stops mid-work.
    shm_before = shm_entries()
    srv = start_server("--parallel", "2", "--ctx-size", "512", "--shutdown-timeout", "2")
    procs = family(srv.proc)
    ended = threading.Event()

    def long_request():
        try:
            with srv.client() as http:
                http.post("/generate", json={"prompt": "Hi", "max_tokens": 250, "ignore_eos": True})
        except httpx.HTTPError:
            pass
        ended.set()

    threading.Thread(target=long_request, daemon=True).start()
    with srv.client() as http:
        wait_until(lambda: health(http, "detailed")["queue"]["running"] == 1, 30)
    srv.proc.send_signal(signal.SIGKILL)
    srv.proc.wait(10)
    wait_until(lambda: not alive(procs), 30)  # --shutdown-timeout 2, then the engine's next lifeline check
    assert ended.wait(10)
    assert shm_entries() == shm_before


def test_idle_server_uses_no_cpu(server):
    procs = family(server.proc)
    assert len(procs) == 3
    with server.client() as http:  # leave it idle after some work
        http.post("/generate", json={"prompt": "Hello", "max_tokens": 5})
    time.sleep(1.0)
    cpu = lambda: sum(sum(p.cpu_times()[:2]) for p in procs)  # noqa: E731
    start, t0 = cpu(), time.monotonic()
    time.sleep(10)
    used = (cpu() - start) / (time.monotonic() - t0)
    assert used < 0.01, f"{used:.2%} of a core while idle"
