"""POST /v1/embeddings (OpenAI's) and /embeddings (llama-server's): the same answer.

The vectors come from the served model, in the engine's step loop (see
engine_proc/run/embedder.py): pooled as the GGUF says (mean when it names no
pooling) and L2-normalised, so a dot product is the cosine similarity.
"""

from __future__ import annotations

import base64
from typing import Annotated, Literal

import msgspec
from msgspec import Meta
from starlette.requests import Request
from starlette.responses import Response

from cllm.core.errors import ApiError
from frontend_proc.core import generation
from frontend_proc.core.embed import embed
from frontend_proc.http.app import model_state
from frontend_proc.http.body import decode_body
from frontend_proc.http.errors import json_response
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


async def embeddings(request: Request) -> Response:
    body = await decode_body(request, EmbeddingRequest)
    st = await model_state(request, body.model)
    info = generation.engine_info(st)
    if body.dimensions is not None and body.dimensions != info.embedding_dim:
        raise ApiError(
            400, "invalid request", f"this model's vectors have {info.embedding_dim} dimensions", param="dimensions"
        )
    vectors, n_tokens = await embed(st, request, body.input)
    if body.encoding_format == "base64":
        data = [Embedding(i, base64.b64encode(v.astype("<f4").tobytes()).decode()) for i, v in enumerate(vectors)]
    else:
        data = [Embedding(i, v) for i, v in enumerate(vectors.tolist())]
    return json_response(EmbeddingList(data, st.model_id, EmbeddingUsage(n_tokens, n_tokens)))


operations = [
    Operation("POST", path, embeddings, summary, body=EmbeddingRequest, response=EmbeddingList, errors=(408, 429, 503))
    for path, summary in (("/v1/embeddings", "OpenAI: embeddings"), ("/embeddings", "llama-server: embeddings"))
]
