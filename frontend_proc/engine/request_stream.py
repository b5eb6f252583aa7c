"""One request's outputs as they arrive from the engine: a generation's tokens (``RequestStream``) or an embeddings
request's vectors (``EmbeddingJob``). The engine client (client.py) pushes each step's outputs in and fails what
the engine can no longer finish; the request's reader awaits them here."""

from __future__ import annotations

import asyncio
import time
from typing import Protocol

from cllm.core.errors import RETRY_AFTER, ApiError
from cllm.core.protocol import Embeddings, ModelInfo, SamplingParams, SeqOutput, TokenLogprobs


class StreamOwner(Protocol):
    """The engine client a request runs on (one replica's): what its reader asks of it."""

    info: ModelInfo | None

    def abort(self, stream: RequestStream) -> None: ...


class RequestStream:
    """Tokens of one request as they arrive from the engine."""

    __slots__ = (
        "id",
        "owner",
        "prompt_tokens",
        "sampling",
        "tokens",
        "logprobs",
        "prompt_logprobs",
        "cached_tokens",
        "drafted",
        "accepted",
        "finish",
        "refusal",
        "error",
        "t_submit",
        "t_first",
        "t_done",
        "timer",
        "_tail",
        "_event",
        "_per_step",
    )

    def __init__(
        self, rid: int, owner: StreamOwner, prompt_tokens: int, per_step: bool, sampling: SamplingParams | None = None
    ):
        self.id = rid
        self.owner = owner  # the engine client that runs it (of one replica)
        self.prompt_tokens = prompt_tokens
        self.sampling = sampling  # as submitted (GET /slots shows it)
        self.tokens: list[int] = []
        self.logprobs: list[TokenLogprobs] = []  # one per token, when the request asked for them
        self.prompt_logprobs: list[TokenLogprobs] = []  # one per prompt token after the first, when asked
        self.cached_tokens = 0  # of the prompt, served by the engine's prefix cache
        self.drafted = self.accepted = 0  # speculative tokens, once done: llama-server's draft_n, draft_n_accepted
        self.finish: str | None = None
        self.refusal = ""  # the engine's reason, where it gave up on the request (SeqOutput.error)
        self.error: ApiError | None = None  # why it ended early: timeout, hang-up, engine death
        self.t_submit = time.perf_counter()
        self.t_first: float | None = None
        self.t_done: float | None = None  # when it finished, or was aborted
        self.timer: asyncio.TimerHandle | None = None
        self._tail = 0  # 1 when the engine's last output carried no token (it sampled EOS)
        self._event = asyncio.Event()
        self._per_step = per_step

    def time_per_output(self) -> float | None:
        """Mean time between the engine's outputs after the first token, once done."""
        outputs = len(self.tokens) + self._tail
        if self.t_first is None or self.t_done is None or outputs < 2:
            return None
        return (self.t_done - self.t_first) / (outputs - 1)

    def push(self, out: SeqOutput) -> None:
        token, finish = out.token, out.finish
        if token is not None:
            if self.t_first is None:
                self.t_first = time.perf_counter()
                self.cached_tokens = out.cached_tokens  # the first output says it
            self.tokens.append(token)
            if out.logprobs is not None:
                self.logprobs.append(out.logprobs)
        if finish is not None:
            if self.t_first is None:  # ended at its first output, without a token
                self.cached_tokens = out.cached_tokens
            self.finish = finish
            self.drafted, self.accepted = out.drafted, out.accepted
            self.refusal = out.error  # why the engine gave up on it, with finish "error"
            self.t_done = time.perf_counter()
            self._tail = token is None
            self._event.set()
        elif self._per_step:
            self._event.set()

    def fail(self, error: ApiError) -> None:
        if self.finish is None and self.error is None:
            self.error = error
            self._event.set()

    async def updates(self):
        """Yield lists of new token ids until the request finishes; raise its error if it fails."""
        sent = 0
        while True:
            await self._event.wait()
            self._event.clear()
            if len(self.tokens) > sent:
                new = self.tokens[sent:]
                sent = len(self.tokens)
                yield new
            if self.finish is not None:
                return
            if self.error is not None:
                raise self.error

    async def result(self) -> list[int]:
        async for _ in self.updates():
            pass
        return self.tokens


class EmbeddingJob:
    """The vectors of one embeddings request as they arrive, a step's worth at a time."""

    __slots__ = ("n", "dim", "parts", "received", "done")

    def __init__(self, n: int, dim: int, done: asyncio.Future):
        self.n = n  # inputs
        self.dim = dim  # float32s an input gives: a vector's, or a rerank score's 1
        self.parts: list[bytes] = []
        self.received = 0
        self.done = done  # set to all the vectors' bytes, or to the error that ended the request

    def push(self, msg: Embeddings) -> bool:
        if msg.error:
            if not self.done.done():
                self.done.set_exception(ApiError(503, "embeddings unavailable", msg.error, RETRY_AFTER))
            return True
        self.parts.append(msg.vectors)
        self.received += len(msg.vectors) // (4 * self.dim)
        if self.received < self.n:
            return False
        if not self.done.done():
            self.done.set_result(b"".join(self.parts))
        return True
