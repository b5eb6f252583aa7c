"""The one generation path behind every API: limits, submit, stop strings, n choices, hang-ups.

Every door starts here (the chat doors through frontend_proc.chat.turn) and differs
only in how it formats what comes back. A request becomes one engine sequence per choice
(n per prompt); each choice's tokens are detokenized as they arrive and, when
the request has stop strings, cut at the first one (the engine is told to stop
at once).
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Sequence
from contextvars import ContextVar

import msgspec
from starlette.requests import Request

from cllm.core.errors import ApiError
from cllm.core.image_grid import prompt_images
from cllm.core.protocol import ImageInput, ModelInfo, SamplingParams
from frontend_proc.core.state import ModelState
from frontend_proc.core.tokenizer import Detokenizer
from frontend_proc.engine.client import EngineClient, not_ready
from frontend_proc.engine.limits import Limits
from frontend_proc.engine.request_stream import RequestStream

# The generations of the HTTP request being served, for frontend_proc.http.observe; set by its middleware.
watched: ContextVar[list[Generation] | None] = ContextVar("cllm_generations", default=None)
# The scope of the client's API key (cllm.core.protocol.Submit.scope), set by frontend_proc.http.guard.
client_scope: ContextVar[int] = ContextVar("cllm_client_scope", default=0)


def engine_info(st: ModelState) -> ModelInfo:
    info = st.client.info
    if info is None:
        raise not_ready()
    return info


def engine_limits(st: ModelState) -> Limits:
    """What a request may ask of the model's engine, known once it has answered."""
    limits = st.client.limits
    if limits is None:
        raise not_ready()
    return limits


async def start(
    st: ModelState,
    prompts: list[list[int]],
    sampling: SamplingParams,
    *,
    n: int = 1,
    stops: Sequence[str] = (),
    stream: bool = False,
    prompt_param: str = "prompt",
    limit_param: str = "max_tokens",
    shown: frozenset[int] = frozenset(),
    images: list[ImageInput] | None = None,
) -> Generation:
    """Check limits and submit n sequences per prompt (seed, seed+1, ... when seeded).

    limit_param: the door's name for max_tokens, as the client sent it. shown: control tokens written out in the
    text (a tool-call opener). images: the one prompt's (frontend_proc.chat.images), each taking the prompt tokens
    its projector gives it (cllm/core/image_grid.py).
    """
    info = engine_info(st)
    assert not images or len(prompts) == 1
    image_positions = prompt_images(info, images)
    limits = engine_limits(st)
    sampling = limits.capped(sampling)
    if st.adapters.items or sampling.lora is not None:  # a model without adapters never looks
        sampling = msgspec.structs.replace(sampling, lora=st.adapters.resolve(sampling.lora, st.adapter))
    limits.check(prompts, sampling.max_tokens, n, prompt_param, limit_param, image_positions)
    per_step = stream or bool(stops)  # stop strings are looked for as the text grows
    choices: list[Choice] = []
    try:
        for prompt in prompts:
            for i in range(n):
                params = (
                    sampling
                    if i == 0 or sampling.seed is None
                    else msgspec.structs.replace(sampling, seed=sampling.seed + i)
                )
                rs = await st.client.submit(prompt, params, per_step, images, client_scope.get())
                choices.append(Choice(len(choices), rs, st.client, st.tokenizer.detokenizer(shown), stops))
    except BaseException:
        for choice in choices:
            choice.abort()
        raise
    gen = Generation(choices, sum(map(len, prompts)) + image_positions, n)
    if (generations := watched.get()) is not None:
        generations.append(gen)
    return gen


class StopMatcher:
    """Finds the first stop string in text fed piece by piece.

    Only the tail that could still be the start of a stop string is held back.
    """

    def __init__(self, stops: Sequence[str]):
        self.stops = stops
        self.matched: str | None = None  # the stop string that ended the text (Anthropic reports it)
        self._held = ""

    def feed(self, text: str) -> tuple[str, bool]:
        """The text that is safe to release, and whether a stop string ended it."""
        text = self._held + text
        cut, self.matched = min(((i, stop) for stop in self.stops if (i := text.find(stop)) >= 0), default=(-1, None))
        if cut >= 0:
            self._held = ""
            return text[:cut], True
        keep = max(overlap(text, stop) for stop in self.stops)
        self._held = text[len(text) - keep :]
        return text[: len(text) - keep], False

    def flush(self) -> str:
        held, self._held = self._held, ""
        return held


def overlap(text: str, stop: str) -> int:
    """The length of the longest end of text that is a beginning of stop."""
    for k in range(min(len(stop) - 1, len(text)), 0, -1):
        if text.endswith(stop[:k]):
            return k
    return 0


def cut_at_first(text: str, markers: Sequence[str]) -> tuple[str, str | None, str]:
    """(before, marker, after) at the first of markers in text; with none, marker is None and after is the
    end of text that could still be the start of one, to hold back."""
    at, marker = min(((i, m) for m in markers if (i := text.find(m)) >= 0), default=(-1, None))
    if marker is None:
        keep = max(overlap(text, m) for m in markers)
        return text[: len(text) - keep], None, text[len(text) - keep :]
    return text[:at], marker, text[at + len(marker) :]


class Choice:
    """One sequence of a request: its text, cut at a stop string, and why it ended."""

    def __init__(
        self, index: int, stream: RequestStream, client: EngineClient, detok: Detokenizer, stops: Sequence[str]
    ):
        self.index = index
        self.stream = stream
        self.n_tokens = 0  # tokens that made the text (a stop string ends the count)
        self.finish: str | None = None  # "stop", "length" or "error"
        self._client = client
        self._detok = detok
        self._stop = StopMatcher(stops) if stops else None

    @property
    def stop_string(self) -> str | None:
        """The stop string that ended the text, if one did."""
        return self._stop.matched if self._stop is not None else None

    @property
    def refusal(self) -> str:
        """Where the engine gave up on it (finish "error"): its reason, if it gave one."""
        return self.stream.refusal

    def abort(self) -> None:
        self._client.abort(self.stream)

    def cancel(self, error: ApiError) -> None:
        """End it early; whoever waits for its text gets ``error``."""
        self._client.cancel(self.stream, error)

    async def text(self) -> str:
        """The whole text, once the choice is done."""
        if self._stop is not None:
            return "".join([piece async for piece in self.pieces()])
        tokens = await self.stream.result()
        self.n_tokens, self.finish = len(tokens), self.stream.finish
        return self._detok.feed(tokens) + self._detok.flush()

    async def pieces(self) -> AsyncIterator[str]:
        """The text as it grows, at most one piece per update (the tokens of one engine wake-up); whole UTF-8
        characters only."""
        detok, stop = self._detok, self._stop
        async for new in self.stream.updates():
            if stop is None:
                self.n_tokens += len(new)
                piece = detok.feed(new)
            else:
                piece, hit = self._feed_until_stop(new)
                if hit:
                    self.finish = "stop"
                    self.abort()
                    if piece:
                        yield piece
                    return
            if piece:
                yield piece
        piece = detok.flush()
        self.finish = self.stream.finish
        if stop is not None:
            piece, hit = stop.feed(piece)
            if hit:
                self.finish = "stop"
            else:
                piece += stop.flush()
        if piece:
            yield piece

    def _feed_until_stop(self, tokens: list[int]) -> tuple[str, bool]:
        """The text of the tokens up to a stop string, and whether one ended it; n_tokens counts those used."""
        text, hit = [], False
        for token in tokens:
            self.n_tokens += 1
            piece, hit = self._stop.feed(self._detok.feed((token,)))
            text.append(piece)
            if hit:
                break
        return "".join(text), hit


class Generation:
    """The choices of one request."""

    def __init__(self, choices: list[Choice], prompt_tokens: int, n: int = 1):
        self.choices = choices
        self.prompt_tokens = prompt_tokens
        self._n = n  # choices per prompt

    @property
    def completion_tokens(self) -> int:
        return sum(c.n_tokens for c in self.choices)

    @property
    def cached_tokens(self) -> int:
        """Prompt tokens the engine's prefix cache served (a prompt's first choice says, once it has begun)."""
        return sum(c.stream.cached_tokens for c in self.choices[:: self._n])

    async def texts(self, request: Request) -> list[str]:
        """Every choice's whole text, once all are done; the client hanging up first cancels them."""
        watcher = asyncio.ensure_future(self._cancel_on_disconnect(request))
        try:
            if len(self.choices) == 1:
                texts = [await self.choices[0].text()]
            else:
                texts = await asyncio.gather(*(c.text() for c in self.choices))
        finally:
            watcher.cancel()
        for c in self.choices:
            if c.finish == "error":
                raise engine_refused(c.refusal)
        return texts

    async def _cancel_on_disconnect(self, request: Request) -> None:
        await disconnected(request)
        gone = ApiError(499, "client closed request", "the client hung up")
        for choice in self.choices:
            choice.cancel(gone)

    async def pieces(self) -> AsyncIterator[tuple[Choice, str | None]]:
        """(choice, text) as the choices' texts grow; (choice, None) once a choice is done.

        A choice that fails (deadline, engine death) raises its ApiError here.
        """
        if len(self.choices) == 1:
            choice = self.choices[0]
            async for piece in choice.pieces():
                yield choice, piece
            yield choice, None
            return
        queue: asyncio.Queue[tuple[Choice, str | ApiError | None]] = asyncio.Queue()

        async def pump(choice: Choice) -> None:
            try:
                async for piece in choice.pieces():
                    queue.put_nowait((choice, piece))
            except ApiError as e:
                queue.put_nowait((choice, e))
            else:
                queue.put_nowait((choice, None))

        tasks = [asyncio.create_task(pump(c)) for c in self.choices]
        try:
            left = len(tasks)
            while left:
                choice, got = await queue.get()
                if isinstance(got, ApiError):
                    raise got
                left -= got is None
                yield choice, got
        finally:
            for task in tasks:
                task.cancel()

    def close(self) -> None:
        """Stop whatever has not finished (the client left, or a stop string ended it)."""
        for choice in self.choices:
            choice.abort()


async def disconnected(request: Request) -> None:
    """Return once the client hangs up."""
    # The body is read, so what comes next is http.disconnect. (A stream
    # needs no watcher: Starlette cancels it when the client goes.)
    while (await request.receive())["type"] != "http.disconnect":
        pass


def engine_refused(reason: str = "") -> ApiError:
    """The engine gave up on a request: for ``reason`` (an image it could not decode, say), or else its grammar,
    which the frontend parsed before submitting, led to a dead end."""
    if reason:
        return ApiError(400, "invalid request", reason)
    return ApiError(
        400,
        "invalid request",
        "the engine gave up on this request's grammar: it allows no token to go on with",
        param="response_format",
    )
