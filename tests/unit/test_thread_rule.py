"""The engine's thread count: the rule (engine_proc/run/threads.py) on given timings, no model (the real engine:
tests/test_threads.py)."""

from __future__ import annotations

import os
import subprocess
import sys
import time

from engine_proc.run import threads


class Machine:
    """The clock the rule reads."""

    def __init__(self):
        self.now = 100.0

    def governor(self, most: int = 2, follow: bool = True) -> tuple[threads.Threads, list[int]]:
        applied: list[int] = []
        return threads.Threads(most, applied.append, follow, clock=lambda: self.now), applied

    def decode(self, rule: threads.Threads, share: float, seconds: float = 0.3) -> None:
        """One decode of ``seconds`` in which the threads got ``share`` of their CPUs."""
        self.now += seconds
        rule.decoded(seconds, share * seconds * rule.n)


def test_threads_that_run_keep_their_count():
    m = Machine()
    rule, applied = m.governor()
    for _ in range(5):
        m.decode(rule, 0.97)
    assert applied == [] and rule.n == 2


def test_threads_that_share_their_cpus_go_down_to_the_cpus_they_get():
    m = Machine()
    rule, applied = m.governor()
    m.decode(rule, 0.5)
    assert applied == [1] and rule.n == 1
    m8 = Machine()
    rule8, applied8 = m8.governor(most=8)
    m8.decode(rule8, 0.6)
    assert applied8 == [5]  # 0.6 of 8 CPUs


def test_a_window_is_judged_whole():
    m = Machine()
    rule, applied = m.governor()
    m.decode(rule, 0.5, seconds=threads.WINDOW * 0.6)
    assert applied == []
    m.decode(rule, 0.5, seconds=threads.WINDOW * 0.6)
    assert applied == [1]


def test_all_threads_are_tried_again_after_the_wait_and_kept_if_they_run():
    m = Machine()
    rule, applied = m.governor()
    m.decode(rule, 0.5)
    m.now += threads.FIRST_WAIT - 0.5
    m.decode(rule, 1.0)  # one thread: nothing to judge, and the wait is not over
    assert applied == [1]
    m.now += 0.5
    m.decode(rule, 1.0)
    assert applied == [1, 2]  # trying them
    m.decode(rule, 0.97)
    assert rule.n == 2
    for _ in range(5):
        m.decode(rule, 0.97)
    assert applied == [1, 2]


def test_a_failed_try_doubles_the_wait_up_to_the_longest():
    m = Machine()
    rule, applied = m.governor()
    m.decode(rule, 0.5)
    waits = []
    for _ in range(6):
        went_down = m.now
        while rule.n == 1:
            m.decode(rule, 1.0, seconds=0.1)
        waits.append(round(m.now - went_down))
        m.decode(rule, 0.5)  # the try: still shared
        assert rule.n == 1
    assert waits == [2, 4, 8, 16, 16, 16]
    # Once the CPUs are free again, the next time they are taken the wait starts over.
    while rule.n == 1:
        m.decode(rule, 1.0, seconds=0.5)
    m.decode(rule, 0.97)
    m.decode(rule, 0.5)
    went_down = m.now
    while rule.n == 1:
        m.decode(rule, 1.0, seconds=0.1)
    assert round(m.now - went_down) == threads.FIRST_WAIT


def test_fixed_threads_never_change():
    m = Machine()
    rule, applied = m.governor(follow=False)
    m.decode(rule, 0.3)
    m.now += 100
    m.decode(rule, 0.3)
    assert applied == [] and rule.n == 2


def probing(m: Machine, share: float):
    """A stand-in for the probe's busy threads that got ``share`` of their CPUs; what it was asked."""
    asked: list[tuple[int, float]] = []

    def run(n: int, seconds: float) -> tuple[float, float]:
        asked.append((n, seconds))
        m.now += seconds
        return seconds, share * seconds * n

    return run, asked


def test_a_new_engine_judges_its_threads_on_busy_threads_before_it_serves():
    m = Machine()
    rule, applied = m.governor()
    run, asked = probing(m, 0.5)
    rule.probe(run)
    assert asked == [(2, threads.PROBE)] and applied == [1]
    m.now += threads.FIRST_WAIT
    m.decode(rule, 1.0)
    assert applied == [1, 2]  # and all of them are tried again later, as after any judgement

    quiet = Machine()
    rule, applied = quiet.governor()
    run, asked = probing(quiet, 0.97)
    rule.probe(run)
    assert asked == [(2, threads.PROBE)] and applied == [] and rule.n == 2


def test_fixed_threads_are_not_probed():
    m = Machine()
    rule, applied = m.governor(follow=False)
    run, asked = probing(m, 0.5)
    rule.probe(run)
    assert asked == [] and applied == []


def test_the_probes_busy_threads_run_their_time_on_the_cpu():
    wall, cpu = threads.busy(2, 0.02)
    assert wall >= 0.02 and cpu > 0


def test_the_servers_own_processes_starting_beside_the_probe_are_no_other_program():
    """The frontend starts while the engine probes: the CPU it takes from the busy threads is theirs to have once
    it serves, so the engine keeps all its threads; other programs' still count."""
    m = Machine()
    rule, applied = m.governor()
    run, _ = probing(m, 0.5)
    frontend = iter([{7: 1.0}, {7: 1.0 + threads.PROBE}])  # one CPU of the two over the probe
    rule.probe(run, server=lambda: next(frontend))
    assert applied == [] and rule.n == 2

    other = Machine()
    rule, applied = other.governor()
    run, _ = probing(other, 0.5)
    idle = iter([{7: 1.0, 8: 2.0}, {7: 1.0, 9: 5.0}])  # 8 ended and 9 began meanwhile: neither counts
    rule.probe(run, server=lambda: next(idle))
    assert applied == [1]


def test_the_servers_processes_are_the_supervisors_tree_but_the_engine():
    spin = "import time\nend = time.time() + 30\nwhile time.time() < end: pass"
    child = subprocess.Popen([sys.executable, "-c", spin])
    try:
        deadline = time.monotonic() + 30
        cpu = threads.server_cpu(os.getpid())  # this process as the supervisor: only its child is counted
        while time.monotonic() < deadline and cpu().get(child.pid, 0.0) < 0.05:
            time.sleep(0.05)
        seconds = cpu()
        assert seconds.get(child.pid, 0.0) >= 0.05 and os.getpid() not in seconds
    finally:
        child.kill()
        child.wait()
    assert threads.server_cpu(None)() == {}
