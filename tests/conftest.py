"""Fixtures that run `cllm serve` for real, on free ports, and always clean up.

Tests come in two layers: tests/unit/ needs neither the model nor a server and runs alone in
seconds (`make test-unit`, or `-m unit`); everything else in tests/ runs llama.cpp on the embedded model.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import httpx
import psutil
import pytest

from cllm.core.protocol import ModelInfo

if TYPE_CHECKING:
    import openai

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
START_TIMEOUT = 90.0
STOP_TIMEOUT = 30.0

# A chat-formatted prompt after which SmolLM2-Instruct answers briefly and ends with <|im_end|>: tests/near_tie's
# CAPITAL, its reply "Paris." and the end each clear of a tie (the question alone starts on one and runs on).
CHAT_PROMPT = (
    "<|im_start|>user\nWhat is the capital of Germany?<|im_end|>\n<|im_start|>assistant\nBerlin.<|im_end|>\n"
    "<|im_start|>user\nWhat is the capital of France?<|im_end|>\n<|im_start|>assistant\n"
)


UNIT = os.path.join(ROOT, "tests", "unit")
# The fixtures that load the model or start a server: a test under tests/unit/ may not ask for them.
MODEL_FIXTURES = {"engine", "tok", "server", "http", "oai", "keyed"}


# The model layer's longest files, longest first (a fresh clone's `--durations` under load). With
# `--dist loadfile --no-loadscope-reorder` xdist hands files out in collection order; its default order (most tests
# first) left these few-test, long files to the end, one worker running them while the other sat idle.
LONGEST_FIRST = (
    "test_steady_steps.py",
    "test_speculative.py",
    "test_threads.py",
    "test_prefix_cache_exact.py",
    "test_prefix_cache.py",
    "test_damaged_cache_files.py",
    "test_disk_cache.py",
    "test_bench.py",
    "test_cache_warming.py",
    "test_hub_serve.py",
    "test_pool.py",
    "test_embeddings.py",
)


def _file_rank(items) -> dict[str, tuple[int, int]]:
    """The longest files first, then the rest by their number of tests, most first (xdist's own default)."""
    counts: dict[str, int] = {}
    for item in items:
        counts[item.path.name] = counts.get(item.path.name, 0) + 1
    return {
        name: (LONGEST_FIRST.index(name), 0) if name in LONGEST_FIRST else (len(LONGEST_FIRST), -n)
        for name, n in counts.items()
    }


def pytest_collection_modifyitems(config, items):
    rank = _file_rank(items)
    items.sort(key=lambda item: rank[item.path.name])  # stable: a file's own tests keep their order
    for item in items:
        if not str(item.path).startswith(UNIT + os.sep):
            continue
        item.add_marker(pytest.mark.unit)
        if MODEL_FIXTURES & set(item.fixturenames):
            raise pytest.UsageError(
                f"{item.nodeid} is in tests/unit/ but asks for the model or a server: move it up to tests/"
            )


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item, call):
    """A failed test on a server shows that server's last log lines: its requests, how they ended, what it warned."""
    report = yield
    srv = item.funcargs.get("server") if hasattr(item, "funcargs") else None
    if report.failed and isinstance(srv, Server):
        report.sections.append(("server log (last 40 lines)", "".join(srv.stderr_lines[-40:])))
    return report


def model_info(**changes) -> ModelInfo:
    """The ModelInfo an engine of a small llama-family model would send, with ``changes``: for the frontend's own
    tests, with no engine behind them."""
    fields: dict[str, Any] = {
        "model_path": "m.gguf",
        "model_name": "m",
        "model_family": "llama",
        "quantization": "Q4_1",
        "vocab_size": 100,
        "num_layers": 2,
        "n_params": 135_000_000,
        "model_bytes": 90 << 20,
        "n_ctx_train": 2048,
        "ctx_size": 8192,
        "kv_bytes": 1 << 20,
        "seq_ctx": 1024,
        "parallel": 8,
        "batch_size": 512,
        "threads": 2,
        "gpu_layers": 0,
        "use_mmap": True,
    }
    return ModelInfo(**(fields | changes))


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@dataclass
class Server:
    proc: subprocess.Popen
    url: str
    stdout_lines: list[str]
    stderr_lines: list[str]  # the logs, read as they come so a full pipe never blocks the server

    def client(self, timeout: float = 300.0) -> httpx.Client:
        return httpx.Client(base_url=self.url, timeout=timeout)

    def stop(self, sig: int = signal.SIGTERM) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
            try:
                self.proc.wait(STOP_TIMEOUT)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        return self.proc.returncode

    def __enter__(self) -> Server:
        return self

    def __exit__(self, *exc) -> None:
        self.stop()


def start_server(*args: str, env: dict[str, str] | None = None) -> Server:
    """Start `cllm serve` (``env``: extra environment) and wait (bounded) for the line that says it serves."""
    cmd = [sys.executable, "-m", "cllm.cli", "serve", "--port", str(free_port()), *args]
    base = {k: v for k, v in os.environ.items() if k != "CLLM_API_KEY"}  # no key unless a test gives one
    proc = subprocess.Popen(
        cmd, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env={**base, **(env or {})}
    )
    lines: list[str] = []
    ready = threading.Event()
    url = []

    def read_stdout():
        for line in proc.stdout:
            lines.append(line)
            if " at http://" in line and not ready.is_set():
                url.append(line.rsplit(" at ", 1)[1].strip())
                ready.set()
        ready.set()

    errors: list[str] = []

    def read_stderr():
        for line in proc.stderr:
            errors.append(line)

    threading.Thread(target=read_stdout, daemon=True).start()
    stderr_reader = threading.Thread(target=read_stderr, daemon=True)
    stderr_reader.start()
    if not ready.wait(START_TIMEOUT) or not url:
        proc.kill()
        proc.wait()
        stderr_reader.join(5)
        raise RuntimeError(f"cllm serve did not start: {''.join(errors)}")
    return Server(proc, url[0], lines, errors)


def family(proc: subprocess.Popen) -> list[psutil.Process]:
    """The supervisor and its children (engine, frontend)."""
    root = psutil.Process(proc.pid)
    return [root, *root.children(recursive=True)]


def child(srv: Server, module: str) -> psutil.Process:
    (found,) = [p for p in family(srv.proc)[1:] if module in " ".join(p.cmdline())]
    return found


def alive(procs: list[psutil.Process]) -> list[psutil.Process]:
    return [p for p in procs if p.is_running() and p.status() != psutil.STATUS_ZOMBIE]


def shm_entries() -> set[str]:
    return set(os.listdir("/dev/shm")) if os.path.isdir("/dev/shm") else set()


def wait_until(check, timeout: float, interval: float = 0.1):
    """Poll ``check`` until it returns something true (returned), or fail after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while True:
        result = check()
        if result:
            return result
        if time.monotonic() > deadline:
            raise AssertionError(f"not true after {timeout} s: {check}")
        time.sleep(interval)


@contextlib.contextmanager
def running(url: str, path: str, body: dict, timeout: float = 60.0) -> Iterator[None]:
    """A streamed request read to its end in a thread of its own: entered once its first line came, left once it
    ended. The request must be answered 200 and read whole without an error, within 120 s of the block's end.
    """
    started = threading.Event()
    status: list[int] = []
    failed: list[BaseException] = []

    def run():
        try:
            with (
                httpx.Client(base_url=url, timeout=300) as c,
                c.stream("POST", path, json={**body, "stream": True}) as r,
            ):
                status.append(r.status_code)
                for _ in r.iter_lines():
                    started.set()
        except Exception as e:  # noqa: BLE001 - raised again in the test's thread
            failed.append(e)
        finally:
            started.set()  # an answer without a line, or none: the checks below say which

    worker = threading.Thread(target=run)
    worker.start()
    try:
        assert started.wait(timeout), f"no answer from {path} within {timeout} s"
        assert not failed and status == [200], f"{path}: {failed or status}"
        yield
    finally:
        worker.join(120)
    assert not worker.is_alive(), f"{path}: still streaming 120 s after the block ended"
    assert not failed, f"{path}: {failed[0]!r}"


def health(http: httpx.Client, level: str = "full") -> dict:
    return http.get("/health", params={"level": level}).json()["data"]


def wait_idle(http: httpx.Client, timeout: float = 60.0, since: int | None = None) -> dict:
    """Health once nothing is in flight and the engine reports no sequence; with ``since`` (the engine's generated
    tokens before the work waited on: generated(http)), once its figures count tokens past it too. The engine sends
    its figures when it goes idle, after a request's last tokens: a request can end before they arrive, and the
    figures then still say idle from before it."""

    def idle():
        h = health(http)
        q = h.get("queue", {})
        counted = since is None or h["engine"]["generated_tokens"] > since
        return h if h["healthy"] and counted and q["in_flight"] == q["running"] == q["waiting"] == 0 else None

    return wait_until(idle, timeout)


def generated(http: httpx.Client) -> int:
    """The engine's generated tokens as of its last figures (wait_idle's ``since``)."""
    return health(http)["engine"]["generated_tokens"]


@pytest.fixture(scope="module")
def engine():
    """The engine in-process on the embedded model, a module's own: 4 sequences, 256 KV cells each."""
    from cllm.core.config import ServeConfig
    from cllm.core.model_file import resolve_model
    from engine_proc.engine import LLMEngine

    eng = LLMEngine(resolve_model(None), ServeConfig(parallel=4, ctx_size=1024))
    try:
        yield eng
    finally:
        eng.close()


@pytest.fixture(scope="module")
def tok():
    """The embedded model's tokenizer."""
    from cllm.core.model_file import resolve_model
    from frontend_proc.core.tokenizer import Tokenizer

    return Tokenizer(resolve_model(None))


def embedded_with(dest: str, meta: dict[str, tuple[Any, Any]]) -> str:
    """A copy of the embedded model at ``dest`` with these key-values added ({key: (GGUFValueType, value)}), written
    by the `gguf` package (the test extra's: a missing one fails the test rather than skipping it)."""
    import gguf
    from gguf.scripts.gguf_new_metadata import MetadataDetails, copy_with_new_metadata

    from cllm.core.model_file import resolve_model

    reader = gguf.GGUFReader(resolve_model(None), "r")
    arch = reader.fields[gguf.Keys.General.ARCHITECTURE].contents()
    added = {key: MetadataDetails(kind, value) for key, (kind, value) in meta.items()}
    copy_with_new_metadata(reader, gguf.GGUFWriter(dest, arch=arch, endianess=reader.endianess), added, [])
    return dest


@pytest.fixture(scope="session")
def mmproj(tmp_path_factory) -> str:
    """A made vision projector (perf/synth_mmproj.py, random weights) for the embedded model: its file."""
    from cllm.core.model_file import resolve_model
    from perf import synth_mmproj

    width = synth_mmproj.text_embedding_width(resolve_model(None))
    return synth_mmproj.write(str(tmp_path_factory.mktemp("vision") / "mmproj.gguf"), width)


@pytest.fixture(scope="session")
def smollm2_f16() -> str:
    """The embedded model's weights in F16 (perf/models.py makes it once, into perf/cache): a draft model's target,
    the embedded Q4_1 its draft."""
    from perf.models import f16_copy

    return f16_copy()


SHARED = ("--parallel", "16", "--ctx-size", "8192")  # 16 sequences at once, 512 KV cells each


@pytest.fixture(scope="session")
def server() -> Iterator[Server]:
    """The server most tests share (SHARED)."""
    with start_server(*SHARED) as srv:
        yield srv


API_KEY = "s3cret-key"


@pytest.fixture(scope="session")
def keyed() -> Iterator[Server]:
    """A server that wants API_KEY (CLLM_API_KEY), one for every module that tests the key."""
    with start_server("--parallel", "2", "--ctx-size", "1024", env={"CLLM_API_KEY": API_KEY}) as srv:
        yield srv


def client_of(server: str):
    """The `http` fixture of a module that starts a server of its own, the fixture named ``server``: a client of it."""

    @pytest.fixture(scope="module")
    def http(request) -> Iterator[httpx.Client]:
        with request.getfixturevalue(server).client() as c:
            yield c

    return http


@pytest.fixture(scope="session")
def http(server) -> Iterator[httpx.Client]:
    with server.client() as c:
        yield c


@pytest.fixture(scope="session")
def oai(server) -> Iterator[openai.OpenAI]:
    """The openai SDK pointed at the shared server."""
    import openai  # here: its import costs the unit layer a second for nothing

    with openai.OpenAI(base_url=server.url + "/v1", api_key="unused", timeout=300, max_retries=0) as client:
        yield client
