"""One Ray Serve replica of cllm: its own engine process and rings, and the frontend's app in-process.

Ray places the replica (an actor) on a node; the replica starts an engine
process there on a fresh pair of rings, and runs the frontend's Starlette app
(frontend_proc.main.build) on its own event loop. A request arrives over
Ray's RPC as an HttpCall and goes straight into the app, then onto the ring:
no HTTP server and no second HTTP hop on the node. Validation, limits, errors
(cllm's 4xx JSON), streaming and /metrics are the frontend's own.

Ray restarts, not cllm: an engine that dies fails the requests in flight with
503 at once (the frontend's path for a dead engine), then the replica exits
(``check_health`` fails too, should it not), and Ray replaces it with a new
replica and engine. If the replica itself dies, the engine's lifeline pipe
closes and the engine exits on its own.
"""

from __future__ import annotations

import asyncio
import os
import re
import threading

from ray import serve

from cllm.core.launch import OUTPUT_RING_BYTES, EngineRings, Launch, ModelSlot, close_quietly, request_ring_bytes
from cllm.core.prefix_router import PrefixMemory
from cllm.core.protocol import EngineExited
from cllm.core.registry import ModelSpec
from cllm.core.ring import Ring
from cllm.ray_serve.call import HttpCall
from cllm.spawn import spawn_engine
from frontend_proc.main import build

ENGINE_EXIT_GRACE = 5.0
EXIT_GRACE = 2.0  # most seconds the 503s of a dead engine's requests get to reach their clients
FLUSH = 0.1  # seconds for a last answer's end to leave the replica
_SAMPLE = re.compile(rb"^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{)?", re.M)


class EngineReplica:
    async def __init__(self, spec: ModelSpec, api_key: str | None = None):  # type: ignore[misc]  # Ray awaits it
        self._spec = spec
        self.replica_id = serve.get_replica_context().replica_id.unique_id
        self._rings = (Ring.create(request_ring_bytes(spec.config)), Ring.create(OUTPUT_RING_BYTES))
        rings = EngineRings(*(ring.spec for ring in self._rings))
        self._engine_lifeline = os.pipe()
        # The frontend's lifeline (supervisor notices) and control pipe: this replica
        # serves one model, always loaded, and tells the frontend of its engine's death itself.
        self._notices = os.pipe()
        self._control = os.pipe()
        self._engine = spawn_engine(spec, rings, 0, self._engine_lifeline[0], 0)
        if api_key is not None:
            os.environ["CLLM_API_KEY"] = api_key  # the frontend takes it from there (and removes it)
        launch = Launch(
            config=spec.config,
            models=[ModelSlot(spec=spec, rings=[rings], loaded=True)],
            lifeline=self._notices[0],
            control=self._control[1],
        )
        self.app, self._pool = build(launch)
        self._active = 0  # calls running
        self._dead = False  # the engine exited: the replica ends as soon as its calls are answered
        self._served = PrefixMemory(2 * spec.config.ctx_size // 32)  # about what the engine's KV cells hold
        self._lifespan = self.app.router.lifespan_context(self.app)
        loop = asyncio.get_running_loop()
        threading.Thread(target=self._watch_engine, args=(loop,), daemon=True, name="cllm-engine-watch").start()
        await self._lifespan.__aenter__()  # attaches to the rings and waits for the engine's answer

    def _watch_engine(self, loop: asyncio.AbstractEventLoop) -> None:
        code = self._engine.wait()
        if not loop.is_closed():
            loop.call_soon_threadsafe(self._engine_died, code)

    def _engine_died(self, code: int) -> None:
        """Fail what runs with 503, then end this replica once those answers are out: Ray's handles see the
        actor gone at once and send requests elsewhere, where a failing health check would leave it taking
        (and failing) them for seconds."""
        self._dead = True
        why = f"its engine exited ({code}); Ray Serve replaces this replica"
        self._pool.engine_exited(EngineExited(0, self._spec.id, 0, restarting=False, reason=why))
        loop = asyncio.get_running_loop()
        loop.call_later(EXIT_GRACE, os._exit, 1)  # at the latest
        if not self._active:
            loop.call_later(FLUSH, os._exit, 1)

    def check_health(self) -> None:
        if self._engine.poll() is not None:
            raise RuntimeError(f"the engine process exited ({self._engine.returncode})")

    def record_routing_stats(self) -> dict:
        """For cllm's router: the prefixes this replica's engine was sent; and its cache's figures so far."""
        registry = self._pool.metrics.registry
        engine = {"model": self._spec.id, "replica": "0"}
        return {
            "prefixes": frozenset(self._served._blocks),
            "prompt_tokens": registry.get_sample_value("cllm_prompt_tokens_total") or 0.0,
            "prefix_hit_tokens": registry.get_sample_value("cllm_prefix_cache_hit_tokens_total", engine) or 0.0,
        }

    async def call(self, call: HttpCall):
        """Run one request through the app; yields (status, headers, first body, more?), then body chunks."""
        if self._dead:  # nothing ran: the ingress sends it again, by then to another replica
            raise RuntimeError("this replica's engine is gone")
        self._active += 1
        try:
            async for item in self._run(call):
                yield item
        finally:
            self._active -= 1
            if self._dead and not self._active:
                asyncio.get_running_loop().call_later(FLUSH, os._exit, 1)

    async def _run(self, call: HttpCall):
        if call.blocks:
            self._served.add(call.blocks)
        sent: asyncio.Queue = asyncio.Queue()
        disconnected = asyncio.Event()
        body = [call.body]

        async def receive() -> dict:
            if body:
                return {"type": "http.request", "body": body.pop(), "more_body": False}
            await disconnected.wait()
            return {"type": "http.disconnect"}

        scope = {
            "type": "http",
            "asgi": {"version": "3.0"},
            "http_version": "1.1",
            "scheme": "http",
            "method": call.method,
            "path": call.path,
            "raw_path": call.path.encode(),
            "query_string": call.query,
            "root_path": "",
            "headers": call.headers,
            "client": None,
            "server": None,
            "app": self.app,
        }
        task = asyncio.get_running_loop().create_task(self.app(scope, receive, sent.put))
        task.add_done_callback(lambda _: sent.put_nowait(None))
        try:
            start = await sent.get()
            if start is None:
                task.result()  # what the app raised; Starlette answers every error itself, so this is a bug
                raise RuntimeError(f"{call.method} {call.path}: the app sent no response")
            first = await sent.get()
            more = first is not None and first.get("more_body", False)
            chunk = first.get("body", b"") if first is not None else b""
            headers = start.get("headers", [])
            if call.path == "/metrics" and start["status"] == 200:
                chunk = self._label(chunk)
                headers = [(k, v) for k, v in headers if k != b"content-length"] + [
                    (b"content-length", str(len(chunk)).encode())
                ]
            yield start["status"], headers, chunk, more
            while more:
                msg = await sent.get()
                if msg is None:
                    break
                if msg.get("body"):
                    yield msg["body"]
                more = msg.get("more_body", False)
        finally:
            disconnected.set()  # a client that hung up: the app aborts the request
            if not task.done():
                task.cancel()

    def _label(self, text: bytes) -> bytes:
        """Every sample of /metrics gets replica="<Ray replica id>", so that replicas' series stay apart."""
        label = b'replica="' + self.replica_id.encode() + b'"'

        def add(m: re.Match) -> bytes:
            return m.group(1) + b"{" + label + (b"," if m.group(2) else b"}")

        lines = []
        for line in text.split(b"\n"):
            if line and not line.startswith(b"#"):
                # The engine's own figures carry replica="0" (its index in this replica): that one is replaced.
                line = (
                    line.replace(b'replica="0"', label, 1)
                    if b'replica="0"' in line
                    else _SAMPLE.sub(add, line, count=1)
                )
            lines.append(line)
        return b"\n".join(lines)

    async def __del__(self):
        await self._lifespan.__aexit__(None, None, None)
        if self._engine.poll() is None:
            self._engine.terminate()
            try:
                await asyncio.to_thread(self._engine.wait, ENGINE_EXIT_GRACE)
            except Exception:
                self._engine.kill()
        for fd in (*self._engine_lifeline, *self._notices, *self._control):
            close_quietly(fd)
        for ring in self._rings:
            ring.close()
            ring.close_fds()
