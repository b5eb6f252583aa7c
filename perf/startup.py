"""What `cllm serve` costs from launch to its first served request, trees side by side.

Each launch starts `cllm serve` (the embedded model unless the arguments name one) from a tree's root with that
tree on PYTHONPATH, waits for the line that says it serves, then sends one completion of one token. The figures:
wall seconds to that line ("ready") and to the answer ("served"), and the CPU seconds (user + system) each of the
three processes (supervisor, frontend, engine) had spent by then; then it stops the server (SIGTERM): the wall
seconds that took ("stop") and the CPU seconds of the three over their whole life ("life", as a test that starts
a server, asks it once and stops it spends them). Trees alternate (A B A B ...), so a shared
machine's load falls on both alike; --busy N keeps N busy programs (`yes`, in a session of their own) running
through every launch, as other tests' servers do in `make test`; --together N starts N servers of a tree at once
(as make test's workers do; "life" is then the N servers' CPU over their lives divided by N). Usage:
    .venv/bin/python -m perf.startup --tree main=/work/main --tree new=. [--rounds 4] [--busy 2] [--together 4]
        [-- serve arguments]
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import httpx
import psutil

from perf.servers import free_port

ROLES = ("supervisor", "frontend", "engine")
KEYS = ("ready", "served", *ROLES, "cpu", "stop", "life")
TIMEOUT = 180.0


def launch(tree: str, args: list[str]) -> dict[str, float]:
    env = {**os.environ, "PYTHONPATH": os.path.abspath(tree)}
    env.pop("CLLM_API_KEY", None)
    cmd = [sys.executable, "-m", "cllm.cli", "serve", "--port", str(free_port()), *args]
    before = os.times()  # its children's figures: the supervisor's, which counts those it waited for
    t0 = time.monotonic()
    proc = subprocess.Popen(cmd, cwd=tree, env=env, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    url: list[str] = []
    ready = threading.Event()

    def read():
        assert proc.stdout is not None
        for line in proc.stdout:
            if " at http://" in line and not url:
                url.append(line.rsplit(" at ", 1)[1].strip())
                ready.set()
        ready.set()

    threading.Thread(target=read, daemon=True).start()
    try:
        if not ready.wait(TIMEOUT) or not url:
            raise RuntimeError(f"{tree}: cllm serve did not start")
        t_ready = time.monotonic() - t0
        r = httpx.post(url[0] + "/v1/completions", json={"prompt": "Hello", "max_tokens": 1}, timeout=TIMEOUT)
        r.raise_for_status()
        t_served = time.monotonic() - t0
        root = psutil.Process(proc.pid)
        row = {"ready": t_ready, "served": t_served}
        for p in [root, *root.children(recursive=True)]:
            line = " ".join(p.cmdline())
            role = "engine" if "engine_proc" in line else "frontend" if "frontend_proc" in line else "supervisor"
            times = p.cpu_times()
            row[role] = row.get(role, 0.0) + times.user + times.system
        row["cpu"] = sum(row.get(role, 0.0) for role in ROLES)
        t_stop = time.monotonic()
        proc.terminate()
        proc.wait(30)
        row["stop"] = time.monotonic() - t_stop
        after = os.times()
        row["life"] = after.children_user - before.children_user + after.children_system - before.children_system
        return row
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def together(tree: str, args: list[str], n: int) -> list[dict[str, float]]:
    if n == 1:
        return [launch(tree, args)]
    before = os.times()
    with ThreadPoolExecutor(n) as pool:
        rows = list(pool.map(lambda _: launch(tree, args), range(n)))
    after = os.times()
    life = after.children_user - before.children_user + after.children_system - before.children_system
    for row in rows:
        row["life"] = life / n  # each launch's own figure counted the others' that ended meanwhile
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--tree", action="append", required=True, metavar="NAME=PATH", help="a tree to start, in turn")
    ap.add_argument("--rounds", type=int, default=4)
    ap.add_argument("--busy", type=int, default=0, help="busy programs beside every launch")
    ap.add_argument("--together", type=int, default=1, help="servers of a tree started at once")
    ap.add_argument("serve_args", nargs="*", help="after --: cllm serve's arguments")
    a = ap.parse_args()
    trees = [t.split("=", 1) for t in a.tree]
    rows: dict[str, list[dict[str, float]]] = {name: [] for name, _ in trees}
    keys = KEYS
    print("| round | tree | " + " | ".join(keys) + " |")
    print("|---" * (len(keys) + 2) + "|")
    for r in range(a.rounds):
        for name, path in trees:
            busy = [subprocess.Popen(["yes"], stdout=subprocess.DEVNULL, start_new_session=True) for _ in range(a.busy)]
            try:
                got = together(path, a.serve_args, a.together)
            finally:
                for p in busy:
                    p.kill()
                    p.wait()
            for row in got:
                rows[name].append(row)
                print(f"| {r + 1} | {name} | " + " | ".join(f"{row.get(k, 0.0):.2f}" for k in keys) + " |", flush=True)
    print()
    print("| tree | " + " | ".join(f"{k} median (min-max)" for k in keys) + " |")
    print("|---" * (len(keys) + 1) + "|")
    for name, got in rows.items():
        cells = []
        for k in keys:
            v = [row.get(k, 0.0) for row in got]
            cells.append(f"{statistics.median(v):.2f} ({min(v):.2f}-{max(v):.2f})")
        print(f"| {name} | " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main()
