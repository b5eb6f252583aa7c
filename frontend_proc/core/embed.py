"""The vectors of inputs, from the served model's engine: the one path behind every embeddings route.

The vectors come from the engine's step loop (see engine_proc/run/embedder.py): pooled as the GGUF says (mean when
it names no pooling) and L2-normalised, so a dot product is the cosine similarity.
"""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING

from starlette.requests import Request

from cllm.core.errors import ApiError
from frontend_proc.core import generation
from frontend_proc.core.state import ModelState

if TYPE_CHECKING:
    import numpy as np


async def embed(st: ModelState, request: Request, value: str | list) -> tuple[np.ndarray, int]:
    """The vectors of the inputs (one row each) and their tokens in all."""
    import numpy as np  # here, not at start-up: every frontend imports this module, few ask for embeddings

    inputs = _inputs(st, value, generation.engine_info(st).max_embedding_tokens)
    vectors = np.frombuffer(await engine_vectors(st, request, inputs), np.float32).reshape(len(inputs), -1)
    return vectors, sum(map(len, inputs))


async def engine_vectors(st: ModelState, request: Request, inputs: list[list[int]], rank: bool = False) -> bytes:
    """The engine's vectors (``rank``: rerank scores); a client hanging up first cancels the request."""
    job = asyncio.ensure_future(st.client.embed(inputs, rank))
    hangup = asyncio.ensure_future(generation.disconnected(request))
    try:
        await asyncio.wait((job, hangup), return_when=asyncio.FIRST_COMPLETED)
    finally:
        hangup.cancel()
    if not job.done():
        job.cancel()
        raise ApiError(499, "client closed request", "the client hung up")
    return job.result()


def _invalid(message: str, param: str = "input") -> ApiError:
    return ApiError(400, "invalid request", message, param=param)


def _inputs(st: ModelState, value: str | list, max_tokens: int) -> list[list[int]]:
    """One token list per input, each checked: not empty, in the vocabulary, not longer than one decode holds."""
    if isinstance(value, str):
        value = [value]
    elif all(type(v) is int for v in value):
        value = [value]
    n_vocab = st.tokenizer.n_vocab
    inputs = []
    for i, v in enumerate(value):
        param = f"input[{i}]" if len(value) > 1 else "input"
        if isinstance(v, str):
            tokens = st.tokenizer.encode(v)
        elif isinstance(v, list):
            tokens = v
            if not all(0 <= t < n_vocab for t in tokens):
                raise _invalid(f"input {i} has a token id outside the vocabulary (0..{n_vocab - 1})", param)
        else:
            raise _invalid("input must be a string, a list of token ids, or a list of strings or token-id lists", param)
        if not tokens:
            raise _invalid(f"input {i} is empty", param)
        if len(tokens) > max_tokens:
            raise _invalid(f"input {i} is {len(tokens)} tokens; an embeddings input holds at most {max_tokens}", param)
        inputs.append(tokens)
    return inputs
