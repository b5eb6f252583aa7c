"""POST /v1/rerank, /rerank, /reranking and /v1/reranking: llama-server's four routes for one answer.

The body is Jina's and Cohere's (`query`, `documents` as strings or `{text}` objects, `top_n`,
`return_documents`), or TEI's (`texts`, `return_text`), as llama-server reads it; the answer is llama-server's:
the documents' indices and scores, best first, `top_n` of them. The scores are the model's classification head
on each pair's prompt (frontend_proc/core/rerank.py), served with `--rerank`.
"""

from __future__ import annotations

from typing import Annotated

import msgspec
from msgspec import Meta
from starlette.requests import Request
from starlette.responses import Response

from frontend_proc.core.rerank import rerank
from frontend_proc.http.app import model_state, server
from frontend_proc.http.body import decode_body
from frontend_proc.http.errors import json_response
from frontend_proc.http.openapi import GENERATE_ERRORS, Operation


class Document(msgspec.Struct):
    text: str


class RerankRequest(msgspec.Struct, kw_only=True):
    query: str
    documents: list[str | Document] | None = None
    texts: list[str] | None = None  # TEI's name for the documents: its answer is then a bare list
    top_n: Annotated[int, Meta(ge=1)] | None = None  # None: every document
    return_documents: bool = False  # Jina's and Cohere's: each result carries its document
    return_text: bool = False  # TEI's
    model: str | None = None  # None: the default model


class RerankResult(msgspec.Struct, omit_defaults=True):
    index: int
    relevance_score: float
    document: Document | None = None


class RerankUsage(msgspec.Struct):
    prompt_tokens: int
    total_tokens: int


class RerankList(msgspec.Struct):
    model: str
    usage: RerankUsage
    results: list[RerankResult]
    object: str = "list"


class TeiRank(msgspec.Struct, omit_defaults=True):
    index: int
    score: float
    text: str | None = None


async def rerank_route(request: Request) -> Response:
    body = await decode_body(request, RerankRequest)
    st = await model_state(request, body.model)
    tei = body.texts is not None
    docs = body.texts if tei else [d if isinstance(d, str) else d.text for d in body.documents or ()]
    assert docs is not None  # texts, when tei
    scores, n_tokens = await rerank(st, request, body.query, docs)
    server(request).metrics.reranked.labels(st.model_id).inc(len(docs))
    best = sorted(range(len(docs)), key=lambda i: -scores[i])[: body.top_n or len(docs)]
    if tei:
        return json_response([TeiRank(i, float(scores[i]), docs[i] if body.return_text else None) for i in best])
    results = [RerankResult(i, float(scores[i]), Document(docs[i]) if body.return_documents else None) for i in best]
    return json_response(RerankList(body.model or st.model_id, RerankUsage(n_tokens, n_tokens), results))


operations = [
    Operation(
        "POST",
        path,
        rerank_route,
        f"{who}: rerank documents against a query (501 unless started with --rerank)",
        body=RerankRequest,
        response=RerankList | list[TeiRank],
        errors=(*GENERATE_ERRORS, 501),
    )
    for path, who in (
        ("/v1/rerank", "Jina and Cohere"),
        ("/rerank", "llama-server"),
        ("/reranking", "llama-server"),
        ("/v1/reranking", "llama-server"),
    )
]
