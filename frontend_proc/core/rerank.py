"""Scores of (query, document) pairs from the served reranker: the one path behind every rerank route.

Each pair's prompt is built as llama-server's format_prompt_rerank builds it (frontend_proc/core/tokenizer.py:
rerank_prompt) and scored in the engine's step loop beside generation, as embeddings are (engine_proc/run/embedder.py:
the model's classification head, llama.cpp's rank pooling).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from starlette.requests import Request

from cllm.core.errors import ApiError
from frontend_proc.core import generation
from frontend_proc.core.embed import engine_vectors
from frontend_proc.core.state import ModelState

if TYPE_CHECKING:
    import numpy as np

MAX_DOCUMENTS = 1000  # Cohere's limit for one request
NOT_STARTED = "This server does not support reranking. Start it with `--rerank`"  # llama-server's words


def _invalid(message: str, param: str) -> ApiError:
    return ApiError(400, "invalid request", message, param=param)


async def rerank(st: ModelState, request: Request, query: str, documents: list[str]) -> tuple[np.ndarray, int]:
    """Each document's score against the query, in order, and the prompts' tokens in all."""
    import numpy as np  # here, not at start-up: as frontend_proc/core/embed.py

    info = generation.engine_info(st)
    if not info.rerank:
        raise ApiError(501, "not supported", NOT_STARTED)
    if not query:
        raise _invalid("query is empty", "query")
    if not documents:
        raise _invalid("documents must hold at least one document", "documents")
    if len(documents) > MAX_DOCUMENTS:
        raise _invalid(f"{len(documents)} documents; a request may rank at most {MAX_DOCUMENTS}", "documents")
    most = info.max_embedding_tokens  # what one scoring decode holds (--batch-size)
    if (n := len(st.tokenizer.rerank_prompt(query, ""))) > most:
        raise _invalid(f"the query makes a prompt of {n} tokens; a rerank prompt holds at most {most}", "query")
    prompts = []
    for i, doc in enumerate(documents):
        tokens = st.tokenizer.rerank_prompt(query, doc)
        if len(tokens) > most:
            message = f"the query and document {i} make {len(tokens)} tokens; a rerank prompt holds at most {most}"
            raise _invalid(message, f"documents[{i}]")
        prompts.append(tokens)
    scores = np.frombuffer(await engine_vectors(st, request, prompts, rank=True), np.float32)
    return scores, sum(map(len, prompts))
