"""The registry's routes, in llama-server's router shapes: GET /models, POST /models/load and /models/unload.

They take ids (or aliases) of the registry only, never a path: any other name
is a 404. Like every route but /health, they need the API key when one is set.
"""

from __future__ import annotations

import msgspec
from starlette.requests import Request
from starlette.responses import Response

from cllm.core.errors import ApiError
from frontend_proc.core.pool import Model, ModelPool, card
from frontend_proc.core.pulls import Pull
from frontend_proc.http.app import server
from frontend_proc.http.body import decode_body
from frontend_proc.http.errors import json_response
from frontend_proc.http.openapi import Operation


class ModelRequest(msgspec.Struct, forbid_unknown_fields=True):
    model: str


def _model(pool: ModelPool, name: str) -> Model:
    if not pool.multi:
        raise ApiError(
            400,
            "invalid request",
            "this server serves one model; --models-dir or a models: list lets it load and unload",
        )
    return pool.find(name)


def _pulling(pull: Pull) -> dict:
    """A model being pulled, or whose pull failed, as the router lists one it is downloading."""
    status: dict = {"value": pull.status}
    if pull.status == "failed":
        status.update(failed=True, error=pull.error)
    else:
        status.update(progress=pull.progress())
    return {"id": pull.name, "object": "model", "owned_by": "cllm", "aliases": [], "status": status}


async def list_models(request: Request) -> Response:
    srv = server(request)
    data = [card(m, True) for m in srv.pool.models]
    if srv.pulls is not None:
        data += [_pulling(p) for p in (*srv.pulls.running(), *srv.pulls.failed.values())]
    return json_response({"object": "list", "data": data})


async def load(request: Request) -> Response:
    srv = server(request)
    name = (await decode_body(request, ModelRequest)).model
    _model(srv.pool, srv.pool.default.id)  # a single-model server refuses before any pull
    assert srv.pulls is not None  # made with the server
    model = await srv.pulls.model(name)
    await srv.pool.load(model)
    return json_response({"success": True})


async def unload(request: Request) -> Response:
    pool = server(request).pool
    model = _model(pool, (await decode_body(request, ModelRequest)).model)
    if model.status not in ("loaded", "loading"):
        raise ApiError(400, "model is not running", f"the model `{model.id}` is {model.status}", param="model")
    await pool.unload(model, "request")
    return json_response({"success": True})


operations = [
    Operation("GET", "/models", list_models, "every model of the registry, with its status", response=dict),
    Operation(
        "POST",
        "/models/load",
        load,
        "load a model of the registry (by id); answers once it serves",
        body=ModelRequest,
        response=dict,
        errors=(404, 503),
    ),
    Operation(
        "POST",
        "/models/unload",
        unload,
        "unload a model (its requests in flight fail with 503)",
        body=ModelRequest,
        response=dict,
        errors=(404, 503),
    ),
]
