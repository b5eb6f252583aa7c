"""OpenAI's model routes: GET /v1/models and /v1/models/{model}."""

from __future__ import annotations

from starlette.requests import Request
from starlette.responses import Response

from cllm.core.errors import ApiError
from frontend_proc.core import generation
from frontend_proc.core.pool import card
from frontend_proc.http.app import server, state
from frontend_proc.http.errors import json_response
from frontend_proc.http.openapi import Operation


async def list_models(request: Request) -> Response:
    pool = server(request).pool
    if not pool.multi:
        generation.engine_info(state(request))
    return json_response({"object": "list", "data": [card(m, pool.multi) for m in pool.models]})


async def retrieve_model(request: Request) -> Response:
    pool = server(request).pool
    name = request.path_params["model"]
    model = pool.by_name.get(name)
    if model is None:
        raise ApiError(
            404, "model not found", f"the model `{name}` does not exist", param="model", code="model_not_found"
        )
    if not pool.multi:
        generation.engine_info(state(request))
    return json_response(card(model, pool.multi))


# The response bodies are OpenAI's objects, built in place: the document calls them objects.
operations = [
    Operation(
        "GET",
        "/v1/models",
        list_models,
        "OpenAI: the models, with their status when there are several",
        response=dict,
        errors=(503,),
    ),
    Operation("GET", "/v1/models/{model:path}", retrieve_model, "OpenAI: one model", response=dict, errors=(404, 503)),
]
