"""cllm/children.py: when the supervisor starts a dead child again, and how it stops a set of them."""

from __future__ import annotations

import subprocess
import sys
import time

from cllm import children
from cllm.children import MAX_RESTARTS, RESTART_WINDOW, Child, terminate


def test_a_child_that_dies_before_the_server_serves_is_not_started_again(caplog):
    assert not Child("frontend").may_restart(1, serving=False)
    assert "exited during start-up (code 1)" in caplog.text


def test_restarts_are_counted_within_the_window_and_a_crash_loop_is_given_up(caplog, monkeypatch):
    now = [1000.0]
    monkeypatch.setattr(children.time, "monotonic", lambda: now[0])
    child = Child("engine m#0")
    assert all(child.may_restart(-9, serving=True) for _ in range(MAX_RESTARTS))
    assert "died (signal SIGKILL); starting it again" in caplog.text
    assert not child.may_restart(-9, serving=True)
    assert f"after {MAX_RESTARTS} restarts in {RESTART_WINDOW:g} s; giving up" in caplog.text
    now[0] += RESTART_WINDOW  # the old deaths leave the window
    assert child.may_restart(-9, serving=True)


def test_terminate_kills_what_outlives_its_grace():
    polite = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    stubborn = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); print(1, flush=True); time.sleep(60)",
        ],
        stdout=subprocess.PIPE,
    )
    assert stubborn.stdout is not None and stubborn.stdout.readline()  # its handler is set
    t0 = time.monotonic()
    terminate([polite, None, stubborn], grace=0.5)
    assert polite.returncode == -15 and stubborn.returncode == -9 and time.monotonic() - t0 < 5
