"""LoRA adapters: llama-server's `GET`/`POST /lora-adapters` (the list, and every adapter's scale), vLLM's
`POST /v1/load_lora_adapter` and `/v1/unload_lora_adapter` (files of `--lora-dir`, with `--allow-lora-load`).

The frontend keeps the scales (frontend_proc/core/lora.py); a load or unload goes to every engine of the model,
which loads or frees the file's weights (engine_proc/run/lora.py).
"""

from __future__ import annotations

import os
from dataclasses import replace
from typing import Annotated

import msgspec
from msgspec import Meta
from starlette.requests import Request
from starlette.responses import PlainTextResponse, Response

from cllm.core.errors import ApiError, invalid
from frontend_proc.core.lora import LoraScale
from frontend_proc.core.pool import Model
from frontend_proc.http.app import server
from frontend_proc.http.body import decode_body
from frontend_proc.http.errors import json_response
from frontend_proc.http.openapi import Operation

OFF = "loading and unloading LoRA adapters over HTTP is off: start cllm with --allow-lora-load and --lora-dir DIR"
NAME = Annotated[str, Meta(min_length=1, max_length=128, pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]*$")]


class LoraAdapter(msgspec.Struct):
    id: int
    path: str
    scale: float


class LoadLora(msgspec.Struct, kw_only=True):
    lora_name: NAME
    lora_path: Annotated[str, Meta(min_length=1)]
    model: str | None = None  # None: the default model


class UnloadLora(msgspec.Struct, kw_only=True):
    lora_name: NAME
    model: str | None = None


async def _model(request: Request, name: str | None) -> Model:
    """The model, loaded (its engines serve)."""
    pool = server(request).pool
    model = pool.find(name)
    await pool.state_for(model.id if pool.multi else None)
    return model


async def list_adapters(request: Request) -> Response:
    model = await _model(request, request.query_params.get("model"))
    return json_response(model.adapters.listed())


async def set_scales(request: Request) -> Response:
    body = await decode_body(request, list[LoraScale])
    model = await _model(request, request.query_params.get("model"))
    model.adapters.rescale(body, "lora")
    return json_response({"success": True})


def _allowed(request: Request) -> str:
    """--lora-dir, or a 403 naming the options."""
    config = server(request).config
    if not config.allow_lora_load or config.lora_dir is None:
        raise ApiError(403, "forbidden", OFF)
    return config.lora_dir


async def load_adapter(request: Request) -> Response:
    folder = _allowed(request)
    body = await decode_body(request, LoadLora)
    path = os.path.realpath(os.path.join(folder, body.lora_path))
    if os.path.commonpath([path, os.path.realpath(folder)]) != os.path.realpath(folder) or not os.path.isfile(path):
        raise invalid(f"lora_path {body.lora_path!r} is no file in the --lora-dir folder", "lora_path")
    model = await _model(request, body.model)
    adapters = model.adapters
    if adapters.by_name(body.lora_name) is not None:
        raise invalid(f"lora_name {body.lora_name!r} is loaded already", "lora_name")
    id = adapters.next_id
    adapters.next_id += 1
    done: list = []
    for client in model.clients:
        error = await client.lora(id, path)
        if error:
            for c in done:
                await c.lora(id, unload=True)
            raise invalid(f"lora_path {body.lora_path!r}: {error}", "lora_path")
        done.append(client)
    adapters.add(id, body.lora_name, path)
    return PlainTextResponse(f"Success: LoRA adapter '{body.lora_name}' added successfully.")


async def unload_adapter(request: Request) -> Response:
    _allowed(request)
    body = await decode_body(request, UnloadLora)
    model = await _model(request, body.model)
    adapter = model.adapters.by_name(body.lora_name)
    if adapter is None:
        raise ApiError(404, "not found", f"no LoRA adapter is named {body.lora_name!r}", param="lora_name")
    model.adapters.remove(adapter)  # first: no request starts under it while the engines free it
    for client in model.clients:
        await client.lora(adapter.id, unload=True)
    return PlainTextResponse(f"Success: LoRA adapter '{body.lora_name}' removed successfully.")


_LIST = Operation(
    "GET",
    "/lora-adapters",
    list_adapters,
    "llama-server: the model's LoRA adapters, their ids, files and scales",
    response=list[LoraAdapter],
    query=(("model", ()),),
    errors=(404,),
)
_LOAD = Operation(
    "POST",
    "/v1/load_lora_adapter",
    load_adapter,
    "vLLM: load a LoRA adapter file of --lora-dir under a name (403 unless --allow-lora-load)",
    body=LoadLora,
    text="text/plain",
    errors=(403, 404),
)
operations = [
    _LIST,
    replace(
        _LIST,
        method="POST",
        endpoint=set_scales,
        summary="llama-server: every LoRA adapter's scale (those not listed: 0)",
        body=list[LoraScale],
        response=dict,
    ),
    _LOAD,
    replace(
        _LOAD,
        path="/v1/unload_lora_adapter",
        endpoint=unload_adapter,
        summary="vLLM: unload a LoRA adapter by its name (403 unless --allow-lora-load)",
        body=UnloadLora,
    ),
]
