"""`cllm serve`: create the rings, start engine and frontend, stop both cleanly.

The supervisor sleeps in select() on three things: a signal, a child exiting
(SIGCHLD) and the frontend's "serving" note. Children run in their own session,
so a terminal's Ctrl-C reaches only the supervisor, which then drains them in
order: the frontend first (stop accepting, finish or cancel in-flight requests
within --shutdown-timeout), then the engine. The rings are anonymous memory,
so nothing is left in /dev/shm whatever way the processes end.
"""

from __future__ import annotations

import logging
import os
import selectors
import signal
import subprocess

from cllm.config import ServeConfig
from cllm.launch import OUTPUT_RING_BYTES, REQUEST_RING_BYTES, Launch, close_quietly
from cllm.log import setup_logging
from cllm.ring import Ring

ENGINE_EXIT_GRACE = 5.0

log = logging.getLogger("cllm.supervisor")


class Supervisor:
    def __init__(self, config: ServeConfig, model_path: str):
        self.config = config
        self.model_path = model_path
        self.stopping = False

    def run(self) -> int:
        setup_logging(self.config.log_level, self.config.log_format)
        requests = Ring.create(REQUEST_RING_BYTES)
        outputs = Ring.create(OUTPUT_RING_BYTES)
        lifeline_r, lifeline_w = os.pipe()
        ready_r, ready_w = os.pipe()
        launch = Launch(
            config=self.config,
            model_path=self.model_path,
            requests=requests.spec,
            outputs=outputs.spec,
            lifeline=lifeline_r,
        )
        wake_r, wake_w = os.pipe()
        os.set_blocking(wake_w, False)
        signal.set_wakeup_fd(wake_w)
        for sig in (signal.SIGINT, signal.SIGTERM):
            signal.signal(sig, self._on_stop_signal)
        signal.signal(signal.SIGCHLD, lambda *_: None)  # only to wake select()

        children: dict[str, subprocess.Popen] = {}
        try:
            children["engine"] = self._start("engine_proc", launch)
            launch.ready = ready_w
            children["frontend"] = self._start("frontend_proc", launch)
            close_quietly(ready_w)
            return self._watch(children, wake_r, ready_r)
        finally:
            self._stop(children)
            signal.set_wakeup_fd(-1)
            for fd in (lifeline_r, lifeline_w, ready_r, ready_w, wake_r, wake_w):
                close_quietly(fd)
            for ring in (requests, outputs):
                ring.close()
                ring.close_fds()

    def _start(self, module: str, launch: Launch) -> subprocess.Popen:
        return subprocess.Popen(launch.argv(module), pass_fds=launch.fds(), start_new_session=True)

    def _on_stop_signal(self, signum, frame) -> None:
        self.stopping = True

    def _watch(self, children: dict[str, subprocess.Popen], wake_r: int, ready_r: int) -> int:
        sel = selectors.DefaultSelector()
        sel.register(wake_r, selectors.EVENT_READ)
        sel.register(ready_r, selectors.EVENT_READ)
        serving = False
        while not self.stopping:
            for name, child in children.items():
                if child.poll() is not None:
                    when = "while serving" if serving else "during start-up"
                    log.error("the %s process exited %s (code %d)", name, when, child.returncode)
                    return 1
            for key, _ in sel.select():
                data = os.read(key.fd, 64)
                if key.fd == ready_r:
                    if not data:
                        sel.unregister(ready_r)
                        continue
                    serving = True
                    port = int(data.decode().split()[0])
                    print(f"cllm: serving {os.path.basename(self.model_path)} at http://{self.config.host}:{port}", flush=True)
        return 0

    def _stop(self, children: dict[str, subprocess.Popen]) -> None:
        """Frontend first (it drains in-flight requests), then the engine."""
        for name, grace in (("frontend", self.config.shutdown_timeout + 5), ("engine", ENGINE_EXIT_GRACE)):
            child = children.get(name)
            if child is None or child.poll() is not None:
                continue
            child.terminate()
            try:
                child.wait(grace)
            except subprocess.TimeoutExpired:
                child.kill()
                child.wait()
