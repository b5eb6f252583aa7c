"""llama-server's own small routes, in its shapes: /tokenize, /detokenize, /props, /slots (/apply-template reads
OpenAI's chat body: frontend_proc.doors.openai.chat_completions).

POST /slots/{id}?action=save|restore|erase (with --slot-save-path) acts on
the engine's KV stream behind that slot: see engine_proc/kv/slot_files.py.

Bodies are llama-server's own (not wrapped in cLLM's `success`/`data`), and
so are its errors ({"error": {"code", "message", "type"}}), so its clients
work unchanged; cLLM's /encode and /health stay as they were (where the two
APIs share a path, /health, cLLM's contract wins). Generation is in
frontend_proc.doors.llama_server.completion.
"""

from __future__ import annotations

import os

import llama_cpp as L
from starlette.requests import Request
from starlette.responses import Response

from cllm.core.errors import ApiError
from cllm.core.protocol import ModelInfo
from frontend_proc.chat.images import SHOWN_MARKER
from frontend_proc.core import generation
from frontend_proc.core.pool import Model
from frontend_proc.core.state import ModelState
from frontend_proc.doors.llama_server.completion import default_settings, settings, summary
from frontend_proc.doors.llama_server.schemas import (
    DetokenizeRequest,
    DetokenizeResult,
    RestoreTimings,
    SaveTimings,
    SlotErased,
    SlotFileRequest,
    SlotRestored,
    SlotSaved,
    TokenizeRequest,
    TokenizeResult,
    TokenPiece,
)
from frontend_proc.engine.request_stream import RequestStream
from frontend_proc.http.app import server, state
from frontend_proc.http.body import decode_body
from frontend_proc.http.errors import json_response
from frontend_proc.http.openapi import Operation


async def tokenize(request: Request) -> Response:
    body = await decode_body(request, TokenizeRequest)
    tokenizer = state(request).tokenizer
    tokens = tokenizer.encode(body.content, body.add_special, body.parse_special)
    if not body.with_pieces:
        return json_response(TokenizeResult(list[int | TokenPiece](tokens)))
    pieces: list[int | TokenPiece] = []
    for t in tokens:
        raw = tokenizer.decode([t])
        try:
            pieces.append(TokenPiece(t, raw.decode()))
        except UnicodeDecodeError:
            pieces.append(TokenPiece(t, list(raw)))
    return json_response(TokenizeResult(pieces))


async def detokenize(request: Request) -> Response:
    body = await decode_body(request, DetokenizeRequest)
    tokenizer = state(request).tokenizer
    bad = next((t for t in body.tokens if not 0 <= t < tokenizer.n_vocab), None)
    if bad is not None:
        raise ApiError(
            400,
            "invalid request",
            f"token {bad} is outside the vocabulary (0..{tokenizer.n_vocab - 1})",
            param="tokens",
        )
    return json_response(DetokenizeResult(tokenizer.decode(body.tokens).decode(errors="replace")))


def _replicas(st) -> list:
    """The engine clients of the default model: one, or a ReplicaSet's."""
    return getattr(st.client, "replicas", [st.client])


async def _named(request: Request) -> tuple[Model, ModelState]:
    """The model `?model=` names (else the default), as llama-server's router takes it; a sleeping one stays asleep,
    one never loaded is loaded."""
    pool = server(request).pool
    model = pool.find(request.query_params.get("model"))
    st = model.state if model.state is not None else await pool.state_for(model.id)
    return model, st


def _info(model: Model, st: ModelState) -> ModelInfo:
    """What the model's engines said: as they last served while it sleeps, else now."""
    return model.info if model.status == "sleeping" and model.info is not None else generation.engine_info(st)


async def get_props(request: Request) -> Response:
    model, st = await _named(request)
    info = _info(model, st)
    template = st.chat_template
    return json_response(
        {
            "default_generation_settings": {"params": default_settings(), "n_ctx": info.seq_ctx},
            "total_slots": info.parallel * len(_replicas(st)),
            "model_alias": st.model_id,
            "model_ftype": info.quantization,
            "model_path": info.model_path,
            "modalities": {"vision": bool(info.mmproj), "video": False, "audio": False},
            "media_marker": SHOWN_MARKER,  # where /completion's multimodal_data go in its prompt_string
            "endpoint_slots": True,
            "endpoint_props": False,
            "endpoint_metrics": True,
            "ui": True,  # cllm's chat page, at / in a browser
            "ui_settings": {},
            "chat_template": template.source,
            "chat_template_caps": template.caps,
            "bos_token": template.bos_token,
            "eos_token": template.eos_token,
            "build_info": f"cllm {_version()} (llama-cpp-python {L.__version__})",
            "is_sleeping": model.status == "sleeping",
            "cors_proxy_enabled": False,  # no proxy for the web UI's MCP servers
        }
    )


def _version() -> str:
    from importlib.metadata import version  # here: its import costs every frontend's start ~0.05 CPU s

    return version("cllm")


async def post_props(request: Request) -> Response:
    # llama-server changes nothing here unless started with --props; cLLM's settings are fixed at launch.
    raise ApiError(
        501,
        "not supported",
        "This server does not support changing global properties: cLLM's settings are fixed at launch",
    )


def _slot(slot_id: int, n_ctx: int, speculative: bool, rs: RequestStream | None) -> dict:
    entry = {"id": slot_id, "n_ctx": n_ctx, "speculative": speculative, "is_processing": rs is not None}
    if rs is None:
        return entry
    n_decoded = len(rs.tokens)
    sampling = rs.sampling
    assert sampling is not None, "an embeddings request in a slot"  # a generation's stream has its sampling
    params = summary(settings(sampling))
    return {
        **entry,
        "id_task": rs.id,
        "n_prompt_tokens": rs.prompt_tokens,
        "n_prompt_tokens_processed": rs.prompt_tokens - rs.cached_tokens if rs.t_first is not None else 0,
        "n_prompt_tokens_cache": rs.cached_tokens,
        "params": params,
        "next_token": [
            {
                "has_next_token": rs.finish is None,
                "has_new_line": False,  # not tracked per token: the text is made in the request's own task
                "n_remain": max(sampling.max_tokens - n_decoded, 0),
                "n_decoded": n_decoded,
            }
        ],
    }


async def slots(request: Request) -> Response:
    """One entry per slot of each engine. cLLM does not pin requests to slots: an engine's requests in flight
    fill its slots in arrival order (the engine admits them so), the rest wait."""
    model, st = await _named(request)
    info = _info(model, st)  # asleep: every slot idle
    out: list[dict] = []
    for client in _replicas(st):
        running = client.streams[: info.parallel]
        for i in range(info.parallel):
            out.append(
                _slot(len(out), info.seq_ctx, info.spec_type != "none", running[i] if i < len(running) else None)
            )
    if "fail_on_no_slot" in request.query_params and all(s["is_processing"] for s in out):
        raise ApiError(503, "unavailable", "no slot available")
    return json_response(out)


# What llama-server's fs_validate_filename refuses besides control characters and surrogates: path separators,
# characters Windows forbids, and look-alikes of the full stop, slash and backslash, the replacement character, the byte
# order mark.
_NOT_IN_NAMES = frozenset(':*?"<>|/\\\uff0e\u2215\u2216\ufffd\ufeff')


def valid_filename(name: str) -> bool:
    """A name llama-server's --slot-save-path takes: one file in that folder, the same on every system."""
    for ch in name:
        c = ord(ch)
        if c <= 0x1F or 0x7F <= c <= 0x9F or 0xD800 <= c <= 0xDFFF or ch in _NOT_IN_NAMES:
            return False
    return (
        0 < len(name.encode()) <= 255
        and name[0] != " "
        and name[-1] not in " ."  # Windows strips them: another file's name
        and ".." not in name
    )


async def slot_action(request: Request) -> Response:
    """Save a slot's cache entry to a file, restore one into it, erase it; llama-server's checks in its order."""
    st = state(request)
    folder = st.config.slot_save_path
    if folder is None:
        raise ApiError(
            501, "not supported", "This server does not support slots action. Start it with `--slot-save-path`"
        )
    raw_id = request.path_params["id_slot"]
    if not (raw_id.isascii() and raw_id.isdigit()):
        raise ApiError(400, "invalid request", "Invalid slot ID")
    id_slot = int(raw_id)
    action = request.query_params.get("action", "")
    if action not in ("save", "restore", "erase"):
        raise ApiError(400, "invalid request", "Invalid action")
    path = ""
    if action != "erase":
        filename = (await decode_body(request, SlotFileRequest)).filename
        if not valid_filename(filename):
            raise ApiError(400, "invalid request", "Invalid filename", param="filename")
        path = os.path.join(folder, filename)
    parallel = generation.engine_info(st).parallel
    replicas = _replicas(st)
    if not 0 <= id_slot < parallel * len(replicas):
        raise ApiError(400, "invalid request", "Invalid slot ID")
    done = await replicas[id_slot // parallel].slot_action(id_slot % parallel, action, path)
    if done.error:
        raise ApiError(done.status, "invalid request" if done.status < 500 else "slot action failed", done.error)
    if action == "save":
        return json_response(SlotSaved(id_slot, filename, done.n_tokens, done.n_bytes, SaveTimings(done.ms)))
    if action == "restore":
        return json_response(SlotRestored(id_slot, filename, done.n_tokens, done.n_bytes, RestoreTimings(done.ms)))
    return json_response(SlotErased(id_slot, done.n_tokens))


operations = [
    Operation(
        "POST", "/tokenize", tokenize, "llama-server: text to tokens", body=TokenizeRequest, response=TokenizeResult
    ),
    Operation(
        "POST",
        "/detokenize",
        detokenize,
        "llama-server: tokens to text",
        body=DetokenizeRequest,
        response=DetokenizeResult,
    ),
    Operation(
        "GET", "/props", get_props, "llama-server: the server's and model's properties", response=dict, errors=(503,)
    ),
    Operation(
        "POST",
        "/props",
        post_props,
        "llama-server: change properties (refused, as llama-server without --props)",
        errors=(501,),
    ),
    Operation(
        "GET", "/slots", slots, "llama-server: the slots and the requests they run", response=dict, errors=(503,)
    ),
    Operation(
        "POST",
        "/slots/{id_slot}",
        slot_action,
        "llama-server: save a slot's cached cells to a file, restore them, or erase them",
        response=dict,
        query=(("action", ("save", "restore", "erase")),),
        errors=(400, 408, 501, 503),
    ),
]
