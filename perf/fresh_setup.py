"""`make serve` on a fresh machine: a clean checkout, empty package caches, timed to the first token.

Clones a commit of the repository into a temporary folder, runs the README's `make serve` there with uv's and pip's
caches pointed at empty folders (so llama.cpp compiles and every package downloads, as on a new machine), and asks
the server for one token until it answers. Prints the seconds to the venv (uv installed), to the end of the install
(the `uv sync` done), to the line that says the server serves, and to the first token; the load average around it,
since a shared machine's load stretches the compile. With --then-test, `make test` runs next in the same checkout,
as a new user's second command (its seconds and pytest's summary line; --perf-cache links a perf/cache/ holding
llama-server, so the comparisons with it run too). Standard library only: it runs before any venv exists. Usage:
    python3 perf/fresh_setup.py [--repo .] [--rev HEAD] [--keep] [--then-test [--perf-cache perf/cache]]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import threading
import time
import urllib.error
import urllib.request

LIMIT = 1800.0  # seconds before the run is given up


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def first_token(port: int) -> bool:
    body = json.dumps({"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 1}).encode()
    req = urllib.request.Request(f"http://127.0.0.1:{port}/v1/chat/completions", body, method="POST")
    try:
        with urllib.request.urlopen(req, timeout=30) as r:
            return r.status == 200 and bool(json.load(r)["choices"])
    except (urllib.error.URLError, ConnectionError, TimeoutError):
        return False


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--repo", default=".")
    ap.add_argument("--rev", default="HEAD")
    ap.add_argument("--keep", action="store_true", help="keep the temporary folder")
    ap.add_argument("--then-test", action="store_true", help="then run make test in the same checkout")
    ap.add_argument("--perf-cache", help="a perf/cache/ folder to link into the checkout (llama-server)")
    args = ap.parse_args()
    root = tempfile.mkdtemp(prefix="cllm-fresh-")
    tree = os.path.join(root, "cllm")
    rev = subprocess.run(["git", "-C", args.repo, "rev-parse", args.rev], capture_output=True, text=True, check=True)
    subprocess.run(["git", "clone", "-q", "--no-checkout", os.path.abspath(args.repo), tree], check=True)
    subprocess.run(["git", "-C", tree, "checkout", "-q", rev.stdout.strip()], check=True)
    env = {**os.environ, "UV_CACHE_DIR": os.path.join(root, "uv-cache"), "PIP_CACHE_DIR": os.path.join(root, "pip")}
    env.pop("VIRTUAL_ENV", None)
    port = free_port()
    marks: dict[str, float] = {}
    load0 = os.getloadavg()
    t0 = time.monotonic()
    proc = subprocess.Popen(
        ["make", "serve", f"ARGS=--port {port}"],
        cwd=tree,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )
    log: list[str] = []

    def read() -> None:
        assert proc.stdout is not None
        for line in proc.stdout:
            log.append(line)
            now = time.monotonic() - t0
            if "uv sync" in line:
                marks.setdefault("venv", now)
            elif "cllm serve" in line and "sync" not in line:
                marks.setdefault("installed", now)
            elif "serving" in line.lower() or "http://127.0.0.1" in line:
                marks.setdefault("serving", now)

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    try:
        try:
            while time.monotonic() - t0 < LIMIT and proc.poll() is None:
                if "serving" in marks and first_token(port):
                    marks["first token"] = time.monotonic() - t0
                    break
                time.sleep(0.5)
        finally:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGTERM)
                try:
                    proc.wait(30)
                except subprocess.TimeoutExpired:
                    os.killpg(proc.pid, signal.SIGKILL)
            reader.join(5)
        if "first token" not in marks:
            print("".join(log[-40:]))
            raise SystemExit("no first token")
        figures = ", ".join(f"{k} {v:.0f} s" for k, v in marks.items())
        load = f"load average before {load0[0]:.1f}, after {os.getloadavg()[0]:.1f}"
        print(f"rev {rev.stdout.strip()[:7]}: make serve: {figures}; {load}", flush=True)
        if args.then_test:
            make_test(tree, env, args.perf_cache)
    finally:
        if not args.keep:
            shutil.rmtree(root, ignore_errors=True)


def make_test(tree: str, env: dict[str, str], perf_cache: str | None) -> None:
    if perf_cache:
        os.symlink(os.path.abspath(perf_cache), os.path.join(tree, "perf", "cache"))
    load0 = os.getloadavg()
    t0 = time.monotonic()
    done = subprocess.run(["make", "test"], cwd=tree, env=env, capture_output=True, text=True, timeout=LIMIT)
    took = time.monotonic() - t0
    lines = [line for line in done.stdout.splitlines() if " passed" in line or " failed" in line or "error" in line]
    if done.returncode:
        print(done.stdout[-6000:], done.stderr[-3000:])
    load = f"load average before {load0[0]:.1f}, after {os.getloadavg()[0]:.1f}"
    print(f"make test: exit {done.returncode} in {took:.0f} s; {' | '.join(lines[-3:])}; {load}")


if __name__ == "__main__":
    main()
