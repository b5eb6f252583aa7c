"""`cllm serve`: hold the port and the rings, run the engines and the frontend, restart any that dies.

The supervisor sleeps in select() on a signal, a child exiting (SIGCHLD), the
frontend's "serving" note and its control pipe. It runs one engine process per
loaded model replica, each on its own pair of rings, created for every model
of the registry at start-up (so the frontend holds them all from its launch);
the default model's engines start with the server, the others when the
frontend asks (LoadModel) and stop when it says (UnloadModel). Children run in
their own session, so a terminal's Ctrl-C reaches only the supervisor, which
then drains them in order: the frontend first (stop accepting, finish or
cancel in-flight requests within --shutdown-timeout), then the engines. If the
supervisor itself is killed, the lifeline pipes it alone writes close, and
every child exits on its own. The rings are anonymous memory, so nothing is
left in /dev/shm whatever way the processes end.

A child that dies while serving is started again on the same rings:
- an engine: the frontend is told (a line on its lifeline), fails what that
  engine had in flight with 503 and says Hello to the new one; other engines
  never notice. One that could not load its model, or dies too often, is given
  up: its model is unloaded (with a single model, `cllm serve` exits 1).
- the frontend: the new one says Hello to every running engine, and each drops
  the sequences of the old one. It serves the listening socket the supervisor
  holds, so connections made in between wait in the backlog.
Neither ring is ever reset: records written before a Hello are skipped, and
each side clears its own wait flag when it attaches.
"""

from __future__ import annotations

import logging
import os
import selectors
import signal
import socket
import sys
import time
from typing import TYPE_CHECKING

import msgspec

from cllm.children import Child, Engine, terminate
from cllm.core.config import ServeConfig
from cllm.core.launch import (
    EXIT_LOAD_FAILED,
    OUTPUT_RING_BYTES,
    PULL_SLOTS,
    EngineRings,
    Launch,
    ModelSlot,
    SpareSlot,
    close_quietly,
    request_ring_bytes,
)
from cllm.core.log import setup_logging
from cllm.core.protocol import (
    Control,
    DeleteEnded,
    DeleteModel,
    EngineExited,
    LoadModel,
    ModelInfo,
    Notice,
    PullEnded,
    PullModel,
    PullProgress,
    UnloadModel,
)
from cllm.core.registry import ModelSpec, pulled_spec
from cllm.core.ring import Ring
from cllm.spawn import spawn_engine, spawn_frontend

if TYPE_CHECKING:
    from cllm.hub.jobs import HubJobs

ENGINE_EXIT_GRACE = 5.0

log = logging.getLogger("cllm.supervisor")


class Supervisor:
    def __init__(self, config: ServeConfig, models: list[ModelSpec], pool: bool = False):
        self.config = config
        self.models = models  # the default first
        self.pool = pool  # a registry: a model that fails is unloaded instead of ending the server
        self.stopping = False
        self.serving = False
        self.sel = selectors.DefaultSelector()
        self.frontend = Child("frontend")
        self.engines: dict[tuple[str, int], Engine] = {}
        self.frontend_fds: tuple[int, ...] = ()  # its lifeline's write end, its ready and control read ends
        self.spare: list[list[tuple[Ring, Ring]] | None] = []  # rings for models pulled while serving; None: taken
        self.jobs: HubJobs | None = None  # with --allow-pull: the pulls and deletions clients ask for
        self.asleep: dict[str, ModelInfo] = {}  # models put to sleep: what a frontend started meanwhile answers with
        self._control_buf = b""

    def run(self) -> int:
        host, port = self.config.host, self.config.port
        try:
            self.listener = socket.create_server(
                (host, port), family=socket.AF_INET6 if ":" in host else socket.AF_INET, backlog=2048
            )
        except OSError as e:
            print(f"cllm: cannot listen on {host}:{port}: {e.strerror}", file=sys.stderr)
            return 2
        setup_logging(self.config.log_level, self.config.log_format)
        for spec in self.models:
            for r in range(spec.replicas):
                rings = (Ring.create(request_ring_bytes(spec.config)), Ring.create(OUTPUT_RING_BYTES))
                self.engines[spec.id, r] = Engine(f"engine {spec.id}#{r}", spec=spec, replica=r, rings=rings)
        if self.config.pulled and self.config.allow_pull:
            size = request_ring_bytes(msgspec.structs.replace(self.config, mmproj="any"))  # a pull may bring one
            self.spare = [
                [(Ring.create(size), Ring.create(OUTPUT_RING_BYTES)) for _ in range(self.config.replicas)]
                for _ in range(PULL_SLOTS)
            ]
        self.engine_lifeline = os.pipe()
        wake_r, wake_w = os.pipe()
        os.set_blocking(wake_w, False)
        if self.config.allow_pull:
            from cllm.hub.jobs import HubJobs  # here: only a server that allows pulls loads the hub's client

            self.jobs = HubJobs(wake_w, self.config.offline)
        signal.set_wakeup_fd(wake_w)
        for sig in (signal.SIGINT, signal.SIGTERM):
            signal.signal(sig, self._on_stop_signal)
        signal.signal(signal.SIGCHLD, lambda *_: None)  # only to wake select()
        self.sel.register(wake_r, selectors.EVENT_READ)
        try:
            self._load(self.models[0].id)
            self._start_frontend()
            return self._watch(wake_r)
        finally:
            self._stop()
            signal.set_wakeup_fd(-1)
            self._close_frontend_fds()
            for fd in (*self.engine_lifeline, wake_r, wake_w):
                close_quietly(fd)
            for rings in [e.rings for e in self.engines.values()] + [r for s in self.spare if s for r in s]:
                _close(rings)

    def _start_engine(self, engine: Engine) -> None:
        rings = EngineRings(*(ring.spec for ring in engine.rings))
        engine.proc = spawn_engine(engine.spec, rings, engine.replica, self.engine_lifeline[0], engine.starts)
        engine.starts += 1
        engine.stop_by = None

    def _start_frontend(self) -> None:
        self._close_frontend_fds()
        lifeline_r, lifeline_w = os.pipe()
        ready_r, ready_w = os.pipe()
        control_r, control_w = os.pipe()
        os.set_blocking(lifeline_w, False)  # a notice never blocks the supervisor
        self.frontend_fds = (lifeline_w, ready_r, control_r)
        self._control_buf = b""
        self.sel.register(ready_r, selectors.EVENT_READ)
        self.sel.register(control_r, selectors.EVENT_READ)
        slots = [
            ModelSlot(
                spec=spec,
                rings=[
                    EngineRings(*(ring.spec for ring in self.engines[spec.id, r].rings)) for r in range(spec.replicas)
                ],
                loaded=self._running(spec.id),
                asleep=self.asleep.get(spec.id),
            )
            for spec in self.models
        ]
        spare = [
            SpareSlot(index=i, rings=[EngineRings(req.spec, out.spec) for req, out in rings])
            for i, rings in enumerate(self.spare)
            if rings is not None
        ]
        launch = Launch(
            config=msgspec.structs.replace(self.config, api_key=None),
            models=slots,
            spare=spare,
            hub_cache=self.jobs.cache_dir if self.jobs is not None else "",
            lifeline=lifeline_r,
            listen=self.listener.fileno(),
            ready=ready_w,
            control=control_w,
            generation=self.frontend.starts,
        )
        try:
            self.frontend.proc = spawn_frontend(launch, self.config.api_key)
        finally:
            for fd in (lifeline_r, ready_w, control_w):
                os.close(fd)
        self.frontend.starts += 1

    def _running(self, model: str) -> bool:
        return any(e.proc is not None and e.stop_by is None for (m, _), e in self.engines.items() if m == model)

    def _load(self, model: str) -> None:
        for (m, _), engine in self.engines.items():
            if m == model and engine.proc is None:
                log.info("starting %s", engine.name)
                self._start_engine(engine)

    def _unload(self, model: str) -> None:
        for (m, _), engine in self.engines.items():
            if m == model and engine.proc is not None and engine.stop_by is None:
                engine.proc.terminate()
                engine.stop_by = time.monotonic() + ENGINE_EXIT_GRACE

    def _on_stop_signal(self, signum, frame) -> None:
        self.stopping = True

    def _watch(self, wake_r: int) -> int:
        while not self.stopping:
            proc = self.frontend.proc
            assert proc is not None  # started before the loop, and again at once whenever it ends
            if proc.poll() is not None:
                if not self.frontend.may_restart(proc.returncode, self.serving):
                    return 1
                self._start_frontend()
            for engine in self.engines.values():
                if engine.proc is not None and engine.proc.poll() is not None and not self._engine_exited(engine):
                    return 1
            stopping = [e.stop_by for e in self.engines.values() if e.stop_by is not None]
            timeout = max(0.0, min(stopping) - time.monotonic()) if stopping else None
            if self.jobs is not None:
                self._on_jobs()
            for key, _ in self.sel.select(timeout):
                data = os.read(key.fd, 4096)
                if key.fd == wake_r:
                    continue
                if not data:  # that frontend has served its note, or died
                    self.sel.unregister(key.fd)
                elif key.fd == self.frontend_fds[2]:
                    self._on_control(data)
                elif not self.serving:
                    self.serving = True
                    port = self.listener.getsockname()[1]
                    print(
                        f"cllm: serving {os.path.basename(self.models[0].path)} at http://{self.config.host}:{port}",
                        flush=True,
                    )
            for engine in self.engines.values():
                proc = engine.proc
                if engine.stop_by is not None and time.monotonic() >= engine.stop_by and proc and proc.poll() is None:
                    proc.kill()
        return 0

    def _engine_exited(self, engine: Engine) -> bool:
        """Restart an engine that died, or give its model up; False: the server must end."""
        assert engine.proc is not None  # it has just been seen to end
        code, generation = engine.proc.returncode, engine.starts - 1
        engine.proc = None
        if engine.stop_by is not None:  # unloaded
            engine.stop_by = None
            log.info("stopped %s", engine.name)
            self._notify_frontend(EngineExited(generation, engine.spec.id, engine.replica, False, "unloaded"))
            return True
        if code == EXIT_LOAD_FAILED and self.serving:
            log.error("the %s process could not load %s; not starting it again", engine.name, engine.spec.path)
            reason = "its engine could not load the model file"
        elif engine.may_restart(code, self.serving):
            self._notify_frontend(EngineExited(generation, engine.spec.id, engine.replica))
            self._start_engine(engine)
            return True
        else:
            reason = "its engine kept failing"
        if not self.pool:
            return False
        self._notify_frontend(EngineExited(generation, engine.spec.id, engine.replica, False, reason))
        self._unload(engine.spec.id)  # a model serves with all its replicas or not at all
        return True

    def _on_control(self, data: bytes) -> None:
        *lines, self._control_buf = (self._control_buf + data).split(b"\n")
        for line in lines:
            msg = _control.decode(line)
            if type(msg) is LoadModel:
                self.asleep.pop(msg.model, None)
                self._load(msg.model)
            elif type(msg) is UnloadModel:
                if msg.asleep is None:
                    self.asleep.pop(msg.model, None)
                else:
                    self.asleep[msg.model] = msg.asleep
                self._unload(msg.model)
            elif type(msg) is PullModel and self.jobs is not None:  # (the frontend asks only with --allow-pull)
                self.jobs.pull(msg.name)
            elif type(msg) is DeleteModel:
                self._delete(msg.name)

    def _on_jobs(self) -> None:
        """What the pulls have to say: progress goes to the frontend; a pulled model joins the registry."""
        assert self.jobs is not None
        for item in self.jobs.drain():
            if isinstance(item, PullProgress):
                self._notify_frontend(item)
            elif item.model is None:
                self._notify_frontend(PullEnded(item.name, error=item.error))
            else:
                self._notify_frontend(self._join(item.name, item.model.name, item.model.path, item.model.mmproj))

    def _join(self, name: str, model: str, path: str, mmproj: str | None) -> PullEnded:
        """With --pulled a pulled model joins the registry on spare rings (the frontend was launched with them)."""
        free = [i for i, rings in enumerate(self.spare) if rings is not None]
        if not self.config.pulled or any(m.id == model for m in self.models):
            return PullEnded(name, model)
        if not free:
            return PullEnded(
                name,
                model,
                f"{model} is in the cache, but this server has added the {PULL_SLOTS} models it can "
                "while serving; a restart serves it",
            )
        spec = pulled_spec(self.config, model, path, mmproj)
        rings, self.spare[free[0]] = self.spare[free[0]], None
        assert rings is not None
        self.models.append(spec)
        for r, pair in enumerate(rings):
            self.engines[spec.id, r] = Engine(f"engine {spec.id}#{r}", spec=spec, replica=r, rings=pair)
        log.info("added %s to the registry", spec.id)
        return PullEnded(name, model, spec=spec, spare=free[0])

    def _delete(self, name: str) -> None:
        """A pulled model leaves the registry (its engines are gone: the frontend unloaded it) and the cache."""
        if self.jobs is None:
            return self._notify_frontend(DeleteEnded(name, "this server was not started with --allow-pull"))
        mine = [(k, e) for k, e in self.engines.items() if k[0] == name]
        if any(e.proc is not None for _, e in mine):
            return self._notify_frontend(DeleteEnded(name, f"{name} is still running"))
        self.models = [m for m in self.models if m.id != name]
        self.asleep.pop(name, None)
        for key, engine in mine:
            del self.engines[key]
            _close(engine.rings)
        self._notify_frontend(self.jobs.delete(name))

    def _notify_frontend(self, notice: Notice) -> None:
        try:
            os.write(self.frontend_fds[0], msgspec.json.encode(notice) + b"\n")
        except OSError:
            pass  # that frontend is gone too; its successor says Hello anyway

    def _close_frontend_fds(self) -> None:
        for fd in self.frontend_fds:
            if fd in self.sel.get_map():
                self.sel.unregister(fd)
            close_quietly(fd)
        self.frontend_fds = ()

    def _stop(self) -> None:
        """Stop listening, then the frontend (it drains in-flight requests), then the engines."""
        self.listener.close()
        terminate([self.frontend.proc], self.config.shutdown_timeout + 5)
        terminate([e.proc for e in self.engines.values()], ENGINE_EXIT_GRACE)


_control = msgspec.json.Decoder(Control)


def _close(rings: tuple[Ring, Ring]) -> None:
    for ring in rings:
        ring.close()
        ring.close_fds()
