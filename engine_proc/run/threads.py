"""How many threads llama.cpp decodes on: all of them, or fewer while other programs take the CPUs.

llama.cpp's CPU graph meets at a barrier after every op (~540 a token for
the embedded model). When the engine's threads get fewer CPUs than they
are, a thread waits at each barrier for a partner that is not running.
Beside one busy program in a session of its own (Linux then gives this
session one CPU of two) a stream kept 0.23 of its idle speed on two threads
and 0.56 on one, which has no barriers (perf/results/2026-11-26-threads.md).

So the runner times each llama_decode and the CPU the engine spent in it.
Threads that got less than SHARED of their CPUs over a WINDOW of decodes
are more than the CPUs they get: the engine goes down to as many as it got.
After a wait (doubled while the CPUs stay taken) it tries all of them again
for a window, and keeps them if they run. A new engine judges its threads
before it serves (probe): its first request's first llama_decode can be long
(a restarted server's next turn over a long history), and would otherwise
run at the shared speed. It judges them on as many plain busy threads, not
on llama.cpp's: beside busy programs one two-thread decode of one token took
0.1 to 9 s of wall and up to 3 CPU s there, waiting at its barriers, which
made a server's start-up there slow and dear (perf/results/2026-11-28-startup-probe.md).
The server's own other processes (the frontend, starting beside the
engine) are no other program: the CPU they take over the probe counts as
the threads' own, for they are done before the engine serves (judged as
such, a fresh server decoded its first ~2 s on one thread). Their share is
the threads' own rather than the machine's busy time less theirs, which
would read a virtual machine's stolen time as free CPUs.

The count is not free of consequence: under flash attention llama.cpp's CPU
decode of one query over 512 or more KV cells splits the cells between the
threads and adds up their parts, so other counts give other last bits and at
times other greedy text (docs/internals.md: Threads; --fixed-threads holds the count).

The engine leaves libgomp's barrier spin as it is (GOMP_SPINCOUNT 300000,
as llama-server runs). A short spin gives the CPU up at a barrier: beside
a busy program two threads then kept 0.25 of their idle speed (0.01 with
the long spin), fewer threads do better still, and on free CPUs the short
spin cost one sequence 1-10% (perf/results/2026-11-25-omp-spin.md and
2026-11-26-threads.md, where 5000 spins came between the two). The
spinning threads also keep the share honest: on free CPUs it is ~1 (0.996
to 0.997 here, at 1, 8 or 32 sequences), where threads that slept when
they ran out of work would lower it without sharing anything.
"""

from __future__ import annotations

import hashlib
import logging
import os
import threading
import time
from collections.abc import Callable

import psutil

WINDOW = 0.25  # seconds of decoding judged at once
PROBE = 0.05  # seconds a new engine keeps its threads' number of busy threads running to judge them
SHARED = 0.7  # the threads' CPU share (CPU seconds ÷ wall seconds ÷ threads) below which they share CPUs
FIRST_WAIT, LONGEST_WAIT = 2.0, 16.0  # seconds on fewer threads before trying all again

log = logging.getLogger("cllm.engine")


def busy(n: int, seconds: float) -> tuple[float, float]:
    """``n`` threads kept busy for ``seconds``: the wall seconds and the process's CPU seconds meanwhile. They hash,
    which runs outside the GIL as llama.cpp's threads do, and like those threads (which spin at their barriers)
    they never sleep, so they get what the engine's threads would."""
    block = bytes(1 << 20)  # ~1 ms of hashing a call: the GIL is held for ~0.1% of the time
    start = threading.Barrier(n + 1)

    def spin() -> None:
        start.wait()
        end = time.perf_counter() + seconds
        while time.perf_counter() < end:
            hashlib.sha256(block)

    workers = [threading.Thread(target=spin, daemon=True) for _ in range(n)]
    for w in workers:
        w.start()
    start.wait()
    wall, cpu = time.perf_counter(), time.process_time()
    for w in workers:
        w.join()
    return time.perf_counter() - wall, time.process_time() - cpu


def server_cpu(supervisor: int | None) -> Callable[[], dict[int, float]]:
    """The CPU seconds so far of each of the server's processes but this one, by pid: ``supervisor`` (the process
    that started the engine: cllm's supervisor, Ray's replica) and its children as they are now (the frontend,
    other engines). None: an engine that runs in its caller's process (cllm bench engine) has no server."""
    try:
        top = psutil.Process(supervisor) if supervisor is not None else None
        procs = [top, *top.children(recursive=True)] if top is not None else []
    except psutil.Error:
        procs = []
    procs = [p for p in procs if p.pid != os.getpid()]

    def cpu() -> dict[int, float]:
        seconds = {}
        for p in procs:
            try:
                t = p.cpu_times()
            except psutil.Error:  # it ended
                continue
            seconds[p.pid] = t.user + t.system
        return seconds

    return cpu


class Threads:
    def __init__(
        self,
        most: int,
        apply: Callable[[int], None],
        follow: bool = True,
        clock: Callable[[], float] = time.monotonic,
    ):
        self.most = most
        self.n = most
        self._apply = apply  # sets the thread count of the engine's llama.cpp contexts
        self._clock = clock
        self._follow = follow and most > 1
        self._wait = FIRST_WAIT
        self._since = 0.0  # when the engine went down to fewer threads
        self._trying = False  # all threads again, for one window
        self._new_window()

    def probe(
        self,
        run: Callable[[int, float], tuple[float, float]] = busy,
        server: Callable[[], dict[int, float]] = dict,
    ) -> None:
        """Judge the threads before the engine serves, on the CPU that as many busy threads get over PROBE
        seconds (``run``: busy(), or a stand-in) and the server's other processes take meanwhile (``server``:
        server_cpu(), or a stand-in): a restarted engine's first request, often a long history's next turn, then
        runs on the threads the CPUs give, not at the shared speed until a WINDOW of decodes has judged them."""
        if not self._follow:
            return
        before = server()
        wall, cpu = run(self.most, PROBE)
        after = server()
        theirs = sum(after[pid] - before[pid] for pid in after.keys() & before.keys())
        self.decoded(wall, cpu + theirs, window=0.0)

    def decoded(self, wall: float, cpu: float, window: float = WINDOW) -> None:
        """One llama_decode took ``wall`` seconds and the engine ``cpu`` seconds of CPU meanwhile; the
        decoding since the last judgement is judged once it reaches ``window`` seconds."""
        if not self._follow:
            return
        if self.n < self.most and self._clock() - self._since >= self._wait:
            self._set(self.most)
            self._trying = True
            return
        if self.n == 1:
            return  # one thread meets no barrier: nothing to judge
        self._wall += wall
        self._cpu += cpu
        if self._wall < window:
            return
        share = self._cpu / (self._wall * self.n)
        if share >= SHARED:
            if self._trying:
                log.info("CPUs free again: decoding on %d threads", self.n)
                self._trying, self._wait = False, FIRST_WAIT
            self._new_window()
            return
        fewer = max(1, int(share * self.n + 0.5))
        if self._trying:
            self._wait = min(2 * self._wait, LONGEST_WAIT)
        else:
            log.info(
                "the engine's %d threads got %.0f%% of their CPUs: decoding on %d while others run",
                self.n,
                100 * share,
                fewer,
            )
        self._trying = False
        self._since = self._clock()
        self._set(fewer)

    def _set(self, n: int) -> None:
        self.n = n
        self._apply(n)
        self._new_window()

    def _new_window(self) -> None:
        self._wall = self._cpu = 0.0
