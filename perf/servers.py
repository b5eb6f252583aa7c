"""The servers a benchmark compares, each started on a free port and always stopped.

All get the same GGUF file, llama.cpp thread count, parallel sequences and
KV cells per sequence. llama-cpp-python's server has no parallel slots: it
answers one request at a time with a context of one sequence.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import tarfile
import tempfile
import time
import urllib.error
import urllib.request
from dataclasses import dataclass

from cllm.core.model_file import resolve_model

PERF = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(PERF)
CACHE = os.path.join(PERF, "cache")
LLAMA_SERVER = os.path.join(CACHE, "bin", "llama-server")
LCPP_PYTHON = os.path.join(CACHE, "lcpp-server", "bin", "python")
LOGS = os.path.join(CACHE, "logs")
START_TIMEOUT = 180.0
STOP_TIMEOUT = 30.0

SYSTEMS = ("cllm", "llama-server", "llama-cpp-python")
DIALECT = {"cllm": "cllm", "llama-server": "llama-server", "llama-cpp-python": "openai"}


@dataclass
class Settings:
    model: str
    threads: int
    parallel: int
    seq_ctx: int  # KV cells per sequence
    cllm_args: tuple[str, ...] = ()  # more `cllm serve` options (its own knobs, which the peers lack)


@dataclass
class Server:
    system: str
    url: str
    proc: subprocess.Popen
    log: str

    @property
    def dialect(self) -> str:
        return DIALECT[self.system]

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(STOP_TIMEOUT)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()

    def __enter__(self) -> Server:
        return self

    def __exit__(self, *exc) -> None:
        self.stop()


def add_arguments(ap, seq_ctx: int) -> None:
    """The options every side-by-side benchmark takes: what both servers get."""
    ap.add_argument("--model", metavar="PATH", help="GGUF file (default: the embedded SmolLM2)")
    ap.add_argument("--threads", type=int, default=os.cpu_count())
    ap.add_argument("--parallel", type=int, default=8)
    ap.add_argument("--seq-ctx", type=int, default=seq_ctx, help="KV cells per sequence")
    ap.add_argument(
        "--cllm-args", default="", help="more `cllm serve` options, as one string (e.g. '--stream-interval-ms 0')"
    )


def env_and_args(words) -> tuple[dict[str, str], tuple[str, ...]]:
    """Words of the form NAME=value as an environment; the rest (options, ``--x=1`` too) as command-line words."""
    is_env = [("=" in w and not w.startswith("-")) for w in words]
    env = dict(w.split("=", 1) for w, e in zip(words, is_env) if e)
    return env, tuple(w for w, e in zip(words, is_env) if not e)


def tree_and_args(words: tuple[str, ...]) -> tuple[str | None, tuple[str, ...]]:
    """A word ``--rev=REV`` runs that cllm server from the git revision's tree (see unpack); the other words."""
    revs = [w for w in words if w.startswith("--rev=")]
    return (unpack(revs[-1][len("--rev=") :])[1] if revs else None), tuple(
        w for w in words if not w.startswith("--rev=")
    )


def unpack(rev: str) -> tuple[str, str]:
    """The revision's full commit and the directory its tree is unpacked in (perf/cache/rev-<commit>/, kept)."""
    commit = subprocess.run(
        ["git", "rev-parse", "--verify", f"{rev}^{{commit}}"], cwd=ROOT, check=True, stdout=subprocess.PIPE, text=True
    ).stdout.strip()
    where = os.path.join(CACHE, f"rev-{commit[:12]}")
    if not os.path.isdir(where):
        os.makedirs(CACHE, exist_ok=True)
        with tempfile.TemporaryDirectory(dir=CACHE) as tmp:
            archive = os.path.join(tmp, "tree.tar")
            subprocess.run(["git", "archive", "-o", archive, commit], cwd=ROOT, check=True)
            with tarfile.open(archive) as tar:
                tar.extractall(os.path.join(tmp, "tree"), filter="data")
            os.rename(os.path.join(tmp, "tree"), where)
    return commit, where


def add_variant_arguments(ap) -> None:
    """--also and --peer-env: more cllm servers beside the default one, and llama-server's environment."""
    ap.add_argument(
        "--also",
        action="append",
        default=[],
        metavar="ARGS",
        help="one more cllm server in the same rounds, with these `cllm serve` options too (e.g. "
        "'--stream-interval-ms 20'); words of the form NAME=value go into its environment instead, "
        "and --rev=REV runs it from that git revision's tree",
    )
    ap.add_argument(
        "--peer-env",
        metavar="NAME=VALUE",
        action="append",
        default=[],
        help="a variable in llama-server's environment (e.g. GOMP_SPINCOUNT=1000)",
    )


def variants(ap, args) -> list[tuple[str, str, tuple[str, ...]]]:
    """(name, system, words) of each server to start: cllm, one more cllm for each --also, then llama-server."""
    if env_and_args(args.peer_env)[1]:
        ap.error("--peer-env takes NAME=VALUE")
    return [
        ("cllm", "cllm", ()),
        *((f"cllm {a}", "cllm", tuple(a.split())) for a in args.also),
        ("llama-server", "llama-server", tuple(args.peer_env)),
    ]


def settings_of(args) -> Settings:
    return Settings(resolve_model(args.model), args.threads, args.parallel, args.seq_ctx, tuple(args.cllm_args.split()))


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def command(system: str, s: Settings, port: int) -> tuple[list[str], str]:
    """The command line that starts `system`, and the path that answers 200 once it serves."""
    served = ["--model", s.model, "--host", "127.0.0.1", "--port", str(port)]  # the peers' flags for these alike
    if system == "cllm":
        return [
            sys.executable,
            "-m",
            "cllm.cli",
            "serve",
            "--model",
            s.model,
            "--port",
            str(port),
            "--threads",
            str(s.threads),
            "--parallel",
            str(s.parallel),
            "--ctx-size",
            str(s.parallel * s.seq_ctx),
            *s.cllm_args,
        ], "/health"
    if system == "llama-server":
        return [
            LLAMA_SERVER,
            *served,
            "--threads",
            str(s.threads),
            "--threads-batch",
            str(s.threads),
            "--parallel",
            str(s.parallel),
            "--ctx-size",
            str(s.parallel * s.seq_ctx),
            "--no-webui",
        ], "/health"
    if system == "llama-cpp-python":
        # By default it cuts a streaming answer short when the next request arrives.
        return [
            LCPP_PYTHON,
            "-m",
            "llama_cpp.server",
            *served,
            "--n_threads",
            str(s.threads),
            "--n_threads_batch",
            str(s.threads),
            "--n_ctx",
            str(s.seq_ctx),
            "--verbose",
            "False",
            "--interrupt_requests",
            "False",
        ], "/v1/models"
    raise ValueError(f"unknown system {system!r}")


def start(
    system: str,
    settings: Settings,
    env: dict[str, str] | None = None,
    args: tuple[str, ...] = (),
    label: str | None = None,
    tree: str | None = None,
) -> Server:
    """Start a server (with `env` added to its environment, `args` to its command line; cllm from `tree`,
    by default this one) and wait, bounded, until it answers.

    Its output goes to perf/cache/logs/<label or system>.log.
    """
    port = free_port()
    cmd, ready_path = command(system, settings, port)
    return launch(system, [*cmd, *args], port, ready_path, env, label, cwd=tree)


def launch(
    system: str,
    cmd: list[str],
    port: int,
    ready_path: str,
    env: dict[str, str] | None = None,
    label: str | None = None,
    cwd: str | None = None,
    logs: str = LOGS,
    new_session: bool = False,
) -> Server:
    """Run a server's command line (listening on `port`, from `cwd`: by default this tree; its output in
    `logs`; in a session of its own if asked) and wait, bounded, until `ready_path` answers 200."""
    if not os.path.exists(cmd[0]):
        raise FileNotFoundError(f"{cmd[0]} is missing: `make bench-deps` builds and installs the peers")
    os.makedirs(logs, exist_ok=True)
    log = os.path.join(logs, f"{label or system}.log")
    with open(log, "wb") as out:
        proc = subprocess.Popen(
            cmd,
            stdout=out,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            cwd=cwd or ROOT,
            env={**os.environ, **(env or {})},
            start_new_session=new_session,
        )
    server = Server(system, f"http://127.0.0.1:{port}", proc, log)
    deadline = time.monotonic() + START_TIMEOUT
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            break
        try:
            with urllib.request.urlopen(server.url + ready_path, timeout=5) as r:
                if r.status == 200:
                    return server
        except (urllib.error.URLError, ConnectionError, TimeoutError):
            pass
        time.sleep(0.25)
    server.stop()
    with open(log, errors="replace") as f:
        tail = f.read()[-2000:]
    raise RuntimeError(f"{system} did not start (exit code {proc.returncode}); the end of {log}:\n{tail}")
