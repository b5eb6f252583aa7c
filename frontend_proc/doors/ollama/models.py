"""Ollama's model routes: GET /api/version, /api/tags, /api/ps and POST /api/show, and its model names.

Ollama names a model `name:tag`; cllm's models are the registry's ids and
aliases (or the one --model), each listed as `id:latest` unless the id has a tag
of its own (a Hugging Face model's `org/repo:QUANT`, as Ollama lists
`hf.co/org/repo:QUANT`). What Ollama's
clients read of a model (its family, size, quantization, context length)
comes from the GGUF file's own metadata (cllm.core.gguf_meta), read once per file.
"""

from __future__ import annotations

import asyncio
import functools
import hashlib
import os
import struct
import time
from datetime import datetime, timezone

from starlette.requests import Request
from starlette.responses import Response

from cllm.core.errors import ApiError
from cllm.core.gguf_meta import FLOAT32, STRING, read_metadata
from cllm.core.model_file import model_bytes
from frontend_proc.core.pool import Model
from frontend_proc.core.sampling import Sampling
from frontend_proc.core.tokenizer import Tokenizer, fim_tokens
from frontend_proc.doors.ollama.schemas import ShowBody
from frontend_proc.http.app import server
from frontend_proc.http.body import decode_body
from frontend_proc.http.errors import json_response
from frontend_proc.http.openapi import Operation

# The version of Ollama's API whose shapes these routes answer: clients gate features on it.
API_VERSION = "0.12.0"
FOREVER = "9999-12-31T23:59:59Z"  # the expiry of a model no keep-alive unloads
_SKIPPED = ("tokenizer.ggml.",)  # the vocabulary's arrays: Ollama leaves them out of model_info too
_VALUE_BYTES = 1 << 16  # a chat template fits; a longer value is left out


def now() -> str:
    """Ollama's created_at: RFC 3339 in UTC."""
    return rfc3339(time.time())


def rfc3339(t: float) -> str:
    return datetime.fromtimestamp(t, timezone.utc).isoformat(timespec="microseconds").replace("+00:00", "Z")


def not_found(name: str) -> ApiError:
    return ApiError(404, "model not found", f"model '{name}' not found", code="model_not_found")


def find(request: Request, name: str) -> Model:
    """The model an Ollama name means: a registry id or alias, with or without `:latest` (a Hugging Face model's
    with or without `hf.co/`); else a 404."""
    by_name = server(request).pool.by_name
    name = name.removeprefix("hf.co/")
    model = by_name.get(name)
    if model is None and name.endswith(":latest"):
        model = by_name.get(name[: -len(":latest")])
    if model is None:
        raise not_found(name)
    return model


@functools.lru_cache(maxsize=64)
def _metadata(path: str, size: int, mtime_ns: int) -> dict:
    """The file's GGUF key-values but its arrays, by key (as llama.cpp's model metadata holds them), and whether
    the model has fill-in-the-middle tokens (llama.cpp also finds those by their text, so its vocabulary says)."""
    try:
        meta = read_metadata(path, arrays=False)
        tokenizer = Tokenizer(path)
    except (OSError, ValueError, RuntimeError, struct.error) as e:
        raise ApiError(500, "model unreadable", f"could not read the metadata of {path}: {e}") from e
    try:
        fim = fim_tokens(tokenizer.vocab)
    finally:
        tokenizer.close()
    out: dict = {}
    for key in sorted(meta):
        kind, value = meta[key]
        if kind == STRING:
            value = str(value).encode(errors="surrogateescape").decode(errors="replace")
            if len(value.encode()) >= _VALUE_BYTES:
                continue
        if not key.startswith(_SKIPPED):
            out[key] = _shortest(value) if kind == FLOAT32 and isinstance(value, float) else value
    out["cllm.fim"] = fim.pre >= 0 and fim.suf >= 0
    return out


def _shortest(value: float) -> float:
    """A float32 as the shortest decimal that reads back as it (1e-05, not 9.99999974e-06), as Ollama writes it."""
    for digits in range(1, 9):
        short = float(f"{value:.{digits}g}")
        if struct.unpack("<f", struct.pack("<f", short))[0] == value:
            return short
    return value


async def metadata(model: Model) -> dict:
    path = model.spec.path
    stat = os.stat(path)
    return await asyncio.to_thread(_metadata, path, stat.st_size, stat.st_mtime_ns)


def digest(model: Model) -> str:
    """Ollama's digest names a model's content; cllm hashes what names it instead: the file's path, size and mtime."""
    stat = os.stat(model.spec.path)
    return hashlib.sha256(f"{model.spec.path}\0{stat.st_size}\0{stat.st_mtime_ns}".encode()).hexdigest()


def _parameter_size(meta: dict, model: Model) -> str:
    if label := meta.get("general.size_label"):
        return str(label)
    info = model.client.info if model.status == "loaded" else None
    n = info.n_params if info is not None else 0
    for unit, scale in (("B", 1e9), ("M", 1e6)):
        if n >= scale:
            return f"{n / scale:.3g}{unit}"
    return ""


def _quantization(meta: dict, model: Model) -> str:
    info = model.client.info if model.status == "loaded" else None
    if info is not None and info.quantization:
        return info.quantization
    # "SmolLM2-135M-Instruct.Q4_1.gguf": the usual name carries it; else the file type's number.
    stem = os.path.basename(model.spec.path).rsplit(".", 1)[0]
    tail = stem.rsplit(".", 1)[-1].rsplit("-", 1)[-1]
    return (
        tail.upper()
        if tail[:1] in "QqFfBbIi" and any(c.isdigit() for c in tail)
        else str(meta.get("general.file_type", ""))
    )


def details(meta: dict, model: Model) -> dict:
    family = str(meta.get("general.architecture", ""))
    return {
        "parent_model": "",
        "format": "gguf",
        "family": family,
        "families": [family] if family else None,
        "parameter_size": _parameter_size(meta, model),
        "quantization_level": _quantization(meta, model),
    }


def context_length(model: Model) -> int:
    """The tokens one sequence holds: the engine's figure once loaded, else what the launch gives each slot."""
    info = model.client.info if model.status == "loaded" else None
    if info is not None:
        return info.seq_ctx
    config = model.spec.config
    return config.ctx_size // config.parallel


async def _entry(model: Model) -> dict:
    meta = await metadata(model)
    name = model.id if ":" in model.id else f"{model.id}:latest"
    return {
        "name": name,
        "model": name,
        "modified_at": rfc3339(os.path.getmtime(model.spec.path)),
        "size": model_bytes(model.spec.path),
        "digest": digest(model),
        "details": details(meta, model),
    }


async def version(request: Request) -> Response:
    return json_response({"version": API_VERSION})


async def tags(request: Request) -> Response:
    return json_response({"models": [await _entry(m) for m in server(request).pool.models]})


async def ps(request: Request) -> Response:
    models = []
    for model in server(request).pool.models:
        info = model.client.info
        if model.status != "loaded" or info is None:
            continue
        entry = await _entry(model)
        size = info.model_bytes + info.kv_bytes + info.compute_bytes
        keep = model.keep_alive if server(request).pool.multi else 0
        entry.update(
            expires_at=rfc3339(time.time() + keep - (time.monotonic() - model.last_used)) if keep else FOREVER,
            size=size,
            size_vram=size if info.gpu_layers else 0,
            context_length=info.seq_ctx,
        )
        models.append(entry)
    return json_response({"models": models})


def _parameters() -> str:
    """cllm's sampling defaults, in a Modelfile's PARAMETER lines."""
    d = Sampling()
    return "\n".join(f"{k:<15}{v}" for k, v in (("temperature", d.temperature), ("top_k", d.top_k), ("top_p", d.top_p)))


async def show(request: Request) -> Response:
    body = await decode_body(request, ShowBody)
    name = body.model or body.name
    if not name:
        raise ApiError(400, "invalid request", "model is required", param="model")
    model = find(request, name)
    meta = await metadata(model)
    arch = str(meta.get("general.architecture", ""))
    info = {k: v for k, v in meta.items() if not k.startswith(("cllm.", "tokenizer.chat_template"))}
    info[f"{arch}.context_length"] = context_length(model)  # what a request can use, not what the model was trained on
    if model.status == "loaded" and model.client.info is not None:
        info["general.parameter_count"] = model.client.info.n_params
    template = str(meta.get("tokenizer.chat_template", ""))
    if f"{arch}.pooling_type" in meta:  # Ollama's test for an embedding model: one that says how it pools
        capabilities = ["embedding"]  # in place of completion, as Ollama lists it
    else:
        capabilities = ["completion", "tools"]  # cllm offers tools through any chat template
        if "<think>" in template or "reasoning" in template:
            capabilities.append("thinking")
        if meta.get("cllm.fim"):
            capabilities.append("insert")
    if model.spec.config.mmproj:
        capabilities.append("vision")  # a projector beside the model: images in chat and generate
    return json_response(
        {
            "modelfile": f"# cllm serves this GGUF file as it is\nFROM {model.spec.path}\n",
            "parameters": _parameters(),
            "template": template,  # Jinja, as the GGUF carries it (Ollama's own are Go templates)
            "details": details(meta, model),
            "model_info": info,
            "capabilities": capabilities,
            "modified_at": rfc3339(os.path.getmtime(model.spec.path)),
        }
    )


operations = [
    Operation("GET", "/api/version", version, "Ollama: the API version answered", response=dict),
    Operation("GET", "/api/tags", tags, "Ollama: the models served", response=dict),
    Operation("GET", "/api/ps", ps, "Ollama: the models loaded", response=dict),
    Operation(
        "POST",
        "/api/show",
        show,
        "Ollama: a model's details, metadata and template",
        body=ShowBody,
        response=dict,
        errors=(404,),
    ),
]
