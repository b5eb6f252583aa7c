"""The supervisor's children: a process slot (the frontend, or one replica of one model), when a child that died
may start again, and how a set of them is stopped."""

from __future__ import annotations

import logging
import signal
import subprocess
import time
from dataclasses import dataclass, field

from cllm.core.registry import ModelSpec
from cllm.core.ring import Ring

MAX_RESTARTS = 5  # of one child within RESTART_WINDOW seconds; more is a crash loop
RESTART_WINDOW = 60.0

log = logging.getLogger("cllm.supervisor")


@dataclass
class Child:
    """One process slot and its history."""

    name: str  # "frontend", or "engine <model>#<replica>"
    proc: subprocess.Popen | None = None
    starts: int = 0
    restarted_at: list[float] = field(default_factory=list)
    stop_by: float | None = None  # asked to stop (unloaded): killed if still alive then

    def may_restart(self, code: int, serving: bool) -> bool:
        """Whether the child, dead with exit status ``code``, may start again; says why not. One that dies before
        the server serves is not retried: the same start would fail the same way."""
        how = _exit_status(code)
        if not serving:
            log.error("the %s process exited during start-up (%s)", self.name, how)
            return False
        now = time.monotonic()
        self.restarted_at = [t for t in self.restarted_at if now - t < RESTART_WINDOW] + [now]
        if len(self.restarted_at) > MAX_RESTARTS:
            log.error(
                "the %s process died (%s) after %d restarts in %g s; giving up",
                self.name,
                how,
                MAX_RESTARTS,
                RESTART_WINDOW,
            )
            return False
        log.error("the %s process died (%s); starting it again", self.name, how)
        return True


@dataclass(kw_only=True)
class Engine(Child):
    spec: ModelSpec
    replica: int = 0
    rings: tuple[Ring, Ring]  # requests, outputs


def terminate(procs: list[subprocess.Popen | None], grace: float) -> None:
    """SIGTERM to those still running, then SIGKILL to any not gone within ``grace`` seconds of it."""
    live = [p for p in procs if p is not None and p.poll() is None]
    for proc in live:
        proc.terminate()
    deadline = time.monotonic() + grace
    for proc in live:
        try:
            proc.wait(max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def _exit_status(code: int) -> str:
    return f"signal {signal.Signals(-code).name}" if code < 0 else f"code {code}"
