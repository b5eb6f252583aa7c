"""The lifecycle of a response, the same for every door: whole, or a stream of events.

whole() waits for every choice's text; stream() runs the loop of a stream:
the door's opening events, one write per text piece, the closing events,
an error inside the stream said in the door's own shape (the status line is
already sent), and the generation closed however it ends (a client that
hangs up cancels the stream; closing aborts what still runs). A door
says only what each moment writes, by subclassing Stream.
"""

from __future__ import annotations

import asyncio

from starlette.requests import Request
from starlette.responses import StreamingResponse

from cllm.core.errors import ApiError
from frontend_proc.core.generation import Choice, Generation, engine_refused
from frontend_proc.http.sse import KEEP_ALIVE, sse_response

PING_SECONDS = 5.0  # between keep-alive comments while a stream waits for its first piece


async def whole(request: Request, gen: Generation) -> list[str]:
    """Every choice's whole text (a choice the engine refused is a 400)."""
    try:
        return await gen.texts(request)
    finally:
        gen.close()


class Stream:
    """What a door's stream writes at each moment."""

    ping: bytes | None = KEEP_ALIVE  # written every PING_SECONDS while the first piece is awaited (None: nothing)
    media_type: str | None = None  # None: Server-Sent Events; else the stream's own type (Ollama's NDJSON)

    def start(self) -> bytes:
        return b""

    def piece(self, choice: Choice, text: str | None) -> bytes:
        """The events of a piece of a choice's text; None: the choice is over (choice.finish says why)."""
        raise NotImplementedError

    def end(self) -> bytes:
        """The events once every choice is over."""
        return b""

    def error(self, e: ApiError) -> bytes:
        raise NotImplementedError


def stream(gen: Generation, door: Stream) -> StreamingResponse:
    if door.media_type is None:
        return sse_response(_events(gen, door))
    return StreamingResponse(_events(gen, door), media_type=door.media_type, headers={"Cache-Control": "no-cache"})


async def _events(gen: Generation, door: Stream):
    pieces, piece = gen.pieces(), door.piece
    try:
        if out := door.start():
            yield out
        if door.ping is not None:
            # Only the wait for the first piece is watched: every later one is awaited as it is.
            first = asyncio.ensure_future(anext(pieces, None))
            try:
                while not (await asyncio.wait((first,), timeout=PING_SECONDS))[0]:
                    yield door.ping
            finally:
                first.cancel()
            if (item := first.result()) is not None:
                choice, text = item
                if text is None and choice.finish == "error":
                    raise engine_refused(choice.refusal)
                if out := piece(choice, text):
                    yield out
        async for choice, text in pieces:
            if text is None and choice.finish == "error":  # the engine refused it (its grammar led nowhere...)
                raise engine_refused(choice.refusal)
            if out := piece(choice, text):
                yield out
        if out := door.end():
            yield out
    except ApiError as e:
        yield door.error(e)
    finally:
        gen.close()
