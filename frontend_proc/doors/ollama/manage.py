"""Ollama's model management: POST /api/pull (progress as JSON lines), DELETE /api/delete, POST /api/copy, in
Ollama's shapes; what they do is frontend_proc/core/pulls.py's. /api/create, /api/push and the blob routes stay
refused: cllm serves GGUF files from the Hugging Face hub or the disk, and takes none over HTTP."""

from __future__ import annotations

import msgspec
from starlette.requests import Request
from starlette.responses import Response, StreamingResponse

from cllm.core.errors import ApiError, invalid
from frontend_proc.core.pulls import Pull, Pulls
from frontend_proc.doors.ollama.writer import NDJSON, line
from frontend_proc.http.app import server
from frontend_proc.http.body import decode_body
from frontend_proc.http.errors import json_response
from frontend_proc.http.openapi import Operation

_NO_FILES = (
    "cllm does not create or push models, nor take model files over HTTP: it serves GGUF files from the Hugging Face "
    "hub (/api/pull with --allow-pull, or `cllm pull`) or the disk (--model, --models-dir, a models: list)"
)


class PullBody(msgspec.Struct, kw_only=True):
    model: str | None = None
    name: str | None = None  # older clients' name for it
    insecure: bool = False
    stream: bool = True


class DeleteBody(msgspec.Struct, kw_only=True):
    model: str | None = None
    name: str | None = None


class CopyBody(msgspec.Struct, kw_only=True):
    source: str
    destination: str


def _pulls(request: Request) -> Pulls:
    """The server's pulls, once it is known they are allowed: refused before the body is read."""
    pulls = server(request).pulls
    assert pulls is not None  # made with the server
    pulls.allow()
    return pulls


def _named(body: PullBody | DeleteBody) -> str:
    if not (body.model or body.name):
        raise invalid("model is required", "model")
    return str(body.model or body.name)


async def _lines(pull: Pull):
    """Ollama's progress: the manifest, each file's bytes as they arrive, then success or the error."""
    yield line({"status": "pulling manifest"})
    sent: dict[str, tuple[int, int]] = {}
    async for _ in pull.updates():
        for f in list(pull.files.values()):
            if sent.get(f.digest) != (f.completed, f.total):
                sent[f.digest] = (f.completed, f.total)
                yield line(
                    {
                        "status": f"pulling {f.digest[:12]}",
                        "digest": f"sha256:{f.digest}",
                        "total": f.total,
                        "completed": f.completed,
                    }
                )
    if pull.status == "failed":
        yield line({"error": pull.error})
        return
    for status in ("verifying sha256 digest", "writing manifest", "success"):
        yield line({"status": status})


async def pull(request: Request) -> Response:
    pulls = _pulls(request)
    body = await decode_body(request, PullBody)
    under_way = pulls.pull(_named(body))
    if body.stream:
        return StreamingResponse(_lines(under_way), media_type=NDJSON, headers={"Cache-Control": "no-cache"})
    await under_way.ended.wait()
    if under_way.status == "failed":
        raise ApiError(400, "pull failed", under_way.error, param="model")
    return json_response({"status": "success"})


async def delete(request: Request) -> Response:
    pulls = _pulls(request)
    await pulls.delete(_named(await decode_body(request, DeleteBody)))
    return Response(status_code=200)


async def copy(request: Request) -> Response:
    pulls = _pulls(request)
    body = await decode_body(request, CopyBody)
    pulls.copy(body.source, body.destination)
    return Response(status_code=200)


async def no_files(request: Request) -> Response:
    """Nothing is fetched, and no body read: the request is refused as it arrives."""
    raise ApiError(400, "not supported", _NO_FILES)


operations = [
    Operation(
        "POST",
        "/api/pull",
        pull,
        "Ollama: pull a model from the Hugging Face hub (with --allow-pull), its progress as JSON lines",
        body=PullBody,
        errors=(400, 403),
    ),
    Operation(
        "DELETE",
        "/api/delete",
        delete,
        "Ollama: delete a pulled model (with --allow-pull)",
        body=DeleteBody,
        errors=(400, 403, 404),
    ),
    Operation(
        "POST",
        "/api/copy",
        copy,
        "Ollama: another name for a model (with --allow-pull)",
        body=CopyBody,
        errors=(400, 403, 404),
    ),
    *(
        Operation(
            method, path, no_files, f"Ollama: {what} (refused: cllm takes no model files over HTTP)", errors=(400,)
        )
        for method, path, what in (
            ("POST", "/api/push", "push a model"),
            ("POST", "/api/create", "create a model"),
            ("POST", "/api/blobs/{digest}", "upload a blob"),
            ("HEAD", "/api/blobs/{digest}", "check a blob"),
        )
    ),
]
