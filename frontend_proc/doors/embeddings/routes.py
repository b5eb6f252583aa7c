"""POST /v1/embeddings (OpenAI's) and /embeddings (llama-server's): the same answer.

The vectors come from the served model, in the engine's step loop (see
engine_proc/embedder.py): pooled as the GGUF says (mean when it names no
pooling) and L2-normalised, so a dot product is the cosine similarity.
"""

from __future__ import annotations

import asyncio
import base64
from typing import Annotated, Literal

import msgspec
import numpy as np
from msgspec import Meta
from starlette.requests import Request
from starlette.responses import Response

from cllm.core.errors import ApiError, json_response
from frontend_proc.core import generation
from frontend_proc.core.state import AppState
from frontend_proc.http.app import decode_body, model_state
from frontend_proc.http.openapi import Operation

MAX_INPUTS = 2048  # OpenAI's limit


class EmbeddingRequest(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    # A string, token ids, or a list of strings and token-id lists: one vector each.
    input: str | Annotated[list[str | int | list[int]], Meta(min_length=1, max_length=MAX_INPUTS)]
    model: str | None = None  # None: the default model
    encoding_format: Literal["float", "base64"] = "float"
    dimensions: Annotated[int, Meta(ge=1)] | None = None  # the model's own only
    user: str | None = None


class EmbeddingUsage(msgspec.Struct):
    prompt_tokens: int
    total_tokens: int


class Embedding(msgspec.Struct):
    index: int
    embedding: list[float] | str  # base64 of the float32s, little-endian, with encoding_format base64
    object: str = "embedding"


class EmbeddingList(msgspec.Struct):
    data: list[Embedding]
    model: str
    usage: EmbeddingUsage
    object: str = "list"


def _invalid(message: str, param: str = "input") -> ApiError:
    return ApiError(400, "invalid request", message, param=param)


def _inputs(st: AppState, value: str | list, max_tokens: int) -> list[list[int]]:
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


async def embeddings(request: Request) -> Response:
    body = await decode_body(request, EmbeddingRequest)
    st = await model_state(request, body.model)
    info = generation.engine_info(st)
    if body.dimensions is not None and body.dimensions != info.embedding_dim:
        raise ApiError(400, "invalid request", f"this model's vectors have {info.embedding_dim} dimensions", param="dimensions")
    vectors, n_tokens = await embed(st, request, body.input)
    if body.encoding_format == "base64":
        data = [Embedding(i, base64.b64encode(v.astype("<f4").tobytes()).decode()) for i, v in enumerate(vectors)]
    else:
        data = [Embedding(i, v) for i, v in enumerate(vectors.tolist())]
    return json_response(EmbeddingList(data, st.model_id, EmbeddingUsage(n_tokens, n_tokens)))


async def embed(st: AppState, request: Request, value: str | list) -> tuple[np.ndarray, int]:
    """The vectors of the inputs (one row each) and their tokens in all; Ollama's door uses it too."""
    inputs = _inputs(st, value, generation.engine_info(st).max_embedding_tokens)
    vectors = np.frombuffer(await _engine_vectors(st, request, inputs), np.float32).reshape(len(inputs), -1)
    return vectors, sum(map(len, inputs))


async def _engine_vectors(st: AppState, request: Request, inputs: list[list[int]]) -> bytes:
    """The engine's vectors; a client hanging up first cancels the request."""
    job = asyncio.ensure_future(st.client.embed(inputs))
    hangup = asyncio.ensure_future(generation.disconnected(request))
    try:
        await asyncio.wait((job, hangup), return_when=asyncio.FIRST_COMPLETED)
    finally:
        hangup.cancel()
    if not job.done():
        job.cancel()
        raise ApiError(499, "client closed request", "the client hung up")
    return job.result()


operations = [
    Operation(
        "POST", path, embeddings, summary, body=EmbeddingRequest, response=EmbeddingList, errors=(408, 429, 503)
    )
    for path, summary in (("/v1/embeddings", "OpenAI: embeddings"), ("/embeddings", "llama-server: embeddings"))
]
