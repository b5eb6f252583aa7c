"""`cllm serve`: hold the port and the rings, run engine and frontend, restart either if it dies.

The supervisor sleeps in select() on three things: a signal, a child exiting
(SIGCHLD) and the frontend's "serving" note. Children run in their own session,
so a terminal's Ctrl-C reaches only the supervisor, which then drains them in
order: the frontend first (stop accepting, finish or cancel in-flight requests
within --shutdown-timeout), then the engine. If the supervisor itself is
killed, the lifeline pipes it alone writes close, and both children exit on
their own. The rings are anonymous memory, so nothing is left in /dev/shm
whatever way the processes end.

A child that dies while serving is started again on the same rings:
- the engine: the frontend is told (a line on its lifeline), fails what it has
  in flight with 503 and says Hello to the new engine;
- the frontend: the new one says Hello, and the engine drops the sequences of
  the old one. It serves the listening socket the supervisor holds, so
  connections made in between wait in the backlog.
Neither ring is ever reset: records written before a Hello are skipped, and
each side clears its own wait flag when it attaches.
"""

from __future__ import annotations

import logging
import os
import selectors
import signal
import socket
import subprocess
import sys
import time

import msgspec

from cllm.config import ServeConfig
from cllm.launch import OUTPUT_RING_BYTES, REQUEST_RING_BYTES, Launch, close_quietly
from cllm.log import setup_logging
from cllm.protocol import EngineExited
from cllm.ring import Ring

ENGINE_EXIT_GRACE = 5.0
MAX_RESTARTS = 5  # of one child within RESTART_WINDOW seconds; more is a crash loop
RESTART_WINDOW = 60.0

log = logging.getLogger("cllm.supervisor")


class Supervisor:
    def __init__(self, config: ServeConfig, model_path: str):
        self.config = config
        self.model_path = model_path
        self.stopping = False
        self.serving = False
        self.sel = selectors.DefaultSelector()
        self.procs: dict[str, subprocess.Popen] = {}
        self.starts = {"engine": 0, "frontend": 0}
        self.restarted_at: dict[str, list[float]] = {"engine": [], "frontend": []}
        self.frontend_fds: tuple[int, int] = (-1, -1)  # its lifeline's write end, its ready note's read end

    def run(self) -> int:
        host, port = self.config.host, self.config.port
        try:
            self.listener = socket.create_server((host, port), family=socket.AF_INET6 if ":" in host else socket.AF_INET, backlog=2048)
        except OSError as e:
            print(f"cllm: cannot listen on {host}:{port}: {e.strerror}", file=sys.stderr)
            return 2
        setup_logging(self.config.log_level, self.config.log_format)
        self.requests = Ring.create(REQUEST_RING_BYTES)
        self.outputs = Ring.create(OUTPUT_RING_BYTES)
        self.engine_lifeline = os.pipe()
        wake_r, wake_w = os.pipe()
        os.set_blocking(wake_w, False)
        signal.set_wakeup_fd(wake_w)
        for sig in (signal.SIGINT, signal.SIGTERM):
            signal.signal(sig, self._on_stop_signal)
        signal.signal(signal.SIGCHLD, lambda *_: None)  # only to wake select()
        self.sel.register(wake_r, selectors.EVENT_READ)
        try:
            self._start("engine")
            self._start("frontend")
            return self._watch(wake_r)
        finally:
            self._stop()
            signal.set_wakeup_fd(-1)
            self._close_frontend_fds()
            for fd in (*self.engine_lifeline, wake_r, wake_w):
                close_quietly(fd)
            for ring in (self.requests, self.outputs):
                ring.close()
                ring.close_fds()

    def _start(self, name: str) -> None:
        launch = Launch(
            config=msgspec.structs.replace(self.config, api_key=None),
            model_path=self.model_path,
            requests=self.requests.spec,
            outputs=self.outputs.spec,
            lifeline=self.engine_lifeline[0],
            generation=self.starts[name],
        )
        env = {k: v for k, v in os.environ.items() if k != "CLLM_API_KEY"}
        child_ends: tuple[int, ...] = ()
        if name == "frontend":
            self._close_frontend_fds()
            lifeline_r, lifeline_w = os.pipe()
            ready_r, ready_w = os.pipe()
            os.set_blocking(lifeline_w, False)  # a notice never blocks the supervisor
            self.frontend_fds = (lifeline_w, ready_r)
            self.sel.register(ready_r, selectors.EVENT_READ)
            launch.lifeline, launch.listen, launch.ready = lifeline_r, self.listener.fileno(), ready_w
            child_ends = (lifeline_r, ready_w)
            if self.config.api_key is not None:
                env["CLLM_API_KEY"] = self.config.api_key
        try:
            self.procs[name] = subprocess.Popen(
                launch.argv(f"{name}_proc"), pass_fds=launch.fds(), env=env, start_new_session=True
            )
        finally:
            for fd in child_ends:
                os.close(fd)
        self.starts[name] += 1

    def _on_stop_signal(self, signum, frame) -> None:
        self.stopping = True

    def _watch(self, wake_r: int) -> int:
        while not self.stopping:
            for name, proc in list(self.procs.items()):
                if proc.poll() is None:
                    continue
                how = _exit_status(proc.returncode)
                if not self.serving:
                    log.error("the %s process exited during start-up (%s)", name, how)
                    return 1
                if not self._may_restart(name):
                    log.error("the %s process died (%s) after %d restarts in %g s; giving up", name, how, MAX_RESTARTS, RESTART_WINDOW)
                    return 1
                log.error("the %s process died (%s); starting it again", name, how)
                if name == "engine":
                    self._notify_frontend(EngineExited(self.starts["engine"] - 1))
                self._start(name)
            for key, _ in self.sel.select():
                data = os.read(key.fd, 64)
                if key.fd == wake_r:
                    continue
                if not data:  # that frontend has served its note, or died
                    self.sel.unregister(key.fd)
                elif not self.serving:
                    self.serving = True
                    port = self.listener.getsockname()[1]
                    print(f"cllm: serving {os.path.basename(self.model_path)} at http://{self.config.host}:{port}", flush=True)
        return 0

    def _may_restart(self, name: str) -> bool:
        now = time.monotonic()
        recent = [t for t in self.restarted_at[name] if now - t < RESTART_WINDOW] + [now]
        self.restarted_at[name] = recent
        return len(recent) <= MAX_RESTARTS

    def _notify_frontend(self, notice: EngineExited) -> None:
        try:
            os.write(self.frontend_fds[0], msgspec.json.encode(notice) + b"\n")
        except OSError:
            pass  # that frontend is gone too; its successor says Hello anyway

    def _close_frontend_fds(self) -> None:
        for fd in self.frontend_fds:
            if fd >= 0:
                if fd in self.sel.get_map():
                    self.sel.unregister(fd)
                close_quietly(fd)
        self.frontend_fds = (-1, -1)

    def _stop(self) -> None:
        """Stop listening, then the frontend (it drains in-flight requests), then the engine."""
        self.listener.close()
        for name, grace in (("frontend", self.config.shutdown_timeout + 5), ("engine", ENGINE_EXIT_GRACE)):
            proc = self.procs.get(name)
            if proc is None or proc.poll() is not None:
                continue
            proc.terminate()
            try:
                proc.wait(grace)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


def _exit_status(code: int) -> str:
    return f"signal {signal.Signals(-code).name}" if code < 0 else f"code {code}"
