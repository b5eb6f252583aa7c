"""N engines of one model behind the face of one EngineClient, routed by cllm.core.prefix_router.

The routes see a model's ``client``: the EngineClient of its engine when it
has one replica (nothing in between), else a ReplicaSet that sends each
request to a replica the router picks and remembers what that replica was
sent (the prompt at once, so the n choices of one request stay together;
prompt and output once the request ends).
"""

from __future__ import annotations

import asyncio

from cllm.core.errors import ApiError
from cllm.core.prefix_router import BLOCK, PrefixRouter, block_hashes
from cllm.core.protocol import EngineStats, ImageInput, ModelInfo, PrefixCacheStats, SamplingParams
from frontend_proc.engine.client import EngineClient, not_ready
from frontend_proc.engine.limits import Limits
from frontend_proc.engine.request_stream import RequestStream


class ReplicaSet:
    def __init__(self, replicas: list[EngineClient]):
        self.replicas = replicas
        head = replicas[0]._config
        # Remember about what an engine can hold; let the cached replica be up to half a batch busier.
        self.router = PrefixRouter(
            len(replicas),
            max_blocks=2 * head.ctx_size // BLOCK,
            slack=max(2, head.parallel // 2),
            affinity=head.replica_routing == "prefix",
        )
        self._prompts: dict[RequestStream, tuple[int, list[int]]] = {}  # -> (replica, prompt)

    @property
    def _serving(self) -> list[EngineClient]:
        return [c for c in self.replicas if c.info is not None]

    @property
    def info(self) -> ModelInfo | None:
        serving = self._serving
        return serving[0].info if serving else None

    @property
    def limits(self) -> Limits | None:
        serving = self._serving
        return serving[0].limits if serving else None

    @property
    def ready(self) -> asyncio.Future | None:
        return self.replicas[0].ready

    @property
    def ready_at(self) -> float | None:
        return max((c.ready_at for c in self._serving if c.ready_at is not None), default=None)

    @property
    def generation(self) -> int:
        return sum(c.generation for c in self.replicas)

    @property
    def in_flight(self) -> int:
        return sum(c.in_flight for c in self.replicas)

    @property
    def stats(self) -> EngineStats | None:
        """All replicas' figures added up."""
        stats = [c.stats for c in self.replicas if c.stats is not None]
        if not stats:
            return None
        total = EngineStats(
            running=sum(s.running for s in stats),
            waiting=sum(s.waiting for s in stats),
            kv_used=sum(s.kv_used for s in stats),
            steps=sum(s.steps for s in stats),
            generated_tokens=sum(s.generated_tokens for s in stats),
            prefix_cache=PrefixCacheStats(
                *(sum(getattr(s.prefix_cache, f) for s in stats) for f in PrefixCacheStats.__struct_fields__)
            ),
        )
        return total

    async def submit(
        self,
        prompt: list[int],
        sampling: SamplingParams,
        per_step: bool,
        images: list[ImageInput] | None = None,
        scope: int = 0,
    ) -> RequestStream:
        usable = [c.info is not None for c in self.replicas]
        if not any(usable):
            raise not_ready()
        hashes = block_hashes(prompt)
        i = self.router.choose(hashes, [c.in_flight for c in self.replicas], usable)
        self.router.sent(i, hashes)
        stream = await self.replicas[i].submit(prompt, sampling, per_step, images, scope)
        self._prompts[stream] = (i, prompt)
        return stream

    async def embed(self, inputs: list[list[int]], rank: bool = False) -> bytes:
        """On the least busy replica: no prefix to route by."""
        serving = self._serving
        if not serving:
            raise not_ready()
        return await min(serving, key=lambda c: c.in_flight).embed(inputs, rank)

    def cancel(self, stream: RequestStream, error: ApiError) -> None:
        stream.fail(error)
        self.abort(stream)

    def abort(self, stream: RequestStream) -> None:
        sent = self._prompts.pop(stream, None)
        if sent is not None and stream.tokens and stream.owner.info is not None:
            # The engine keeps what it generated too: the next turn of a chat starts with it.
            self.router.sent(sent[0], block_hashes(sent[1] + stream.tokens))
        stream.owner.abort(stream)

    def forget(self, replica: int) -> None:
        """That replica's engine restarted or stopped: its cache is empty."""
        self.router.forget(replica)
