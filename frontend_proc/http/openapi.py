"""Operations: each route with what the OpenAPI 3.1 document says of it.

The document is built from the Structs the routes decode and encode, so it
cannot drift from what they do.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from types import UnionType
from typing import Any

import msgspec
from starlette.routing import Route

from frontend_proc.http.errors import AnthropicError, Error, LlamaServerError, OllamaError, OpenAIError, error_type

ERRORS = {
    400: "Bad input; the message names the field",
    401: "Missing or wrong API key",
    403: "Not allowed on this server: a model management route without --allow-pull",
    404: "No such model",
    408: "The request ran past --request-timeout",
    413: "The body is over --max-body-bytes",
    415: "The body is not JSON",
    429: "Too many requests waiting; retry after Retry-After seconds",
    501: "Not supported by this server or model (llama-server's answer for the same case)",
    503: "The engine is starting or restarting; retry after Retry-After seconds",
}
BODY_ERRORS = (400, 413, 415)  # any operation that reads a body may answer these
_PARAM = re.compile(r"{(\w+)(?::\w+)?}")

GENERATE_ERRORS = (408, 429, 503)  # what generating adds to the errors of reading a body


@dataclass(frozen=True)
class Operation:
    method: str
    path: str
    endpoint: Callable
    summary: str
    body: type | None = None  # the JSON request body
    response: type | UnionType | None = None  # the JSON body of a 200 (a union: any of those JSON types)
    events: type | None = None  # a 200 may be Server-Sent Events instead, each this JSON (str: any text)
    text: str | None = None  # a 200 that is text of this media type instead of JSON
    also: tuple[int, ...] = ()  # other statuses answered with the 200's body (/health's 503)
    query: tuple[tuple[str, tuple[str, ...]], ...] = ()  # optional parameters: (name, the values it takes; (): any)
    errors: tuple[int, ...] = ()  # statuses, beyond those of reading a body, answered with an Error

    def route(self) -> Route:
        return Route(self.path, self.endpoint, methods=[self.method])

    @property
    def doc_path(self) -> str:
        """The path as OpenAPI writes it: {model}, not Starlette's {model:path}."""
        return _PARAM.sub(r"{\1}", self.path)


def document(
    title: str, operations: list[Operation], open_paths: tuple[str, ...], secured: bool, maxima: dict[str, int]
) -> dict:
    """``maxima``: limits set at run time, as the maximum of request fields of that name."""
    types = list(
        dict.fromkeys(t for op in operations for t in (op.body, op.response, op.events) if t not in (None, str))
    )
    types += [Error, OpenAIError, AnthropicError, OllamaError, LlamaServerError]
    refs, schemas = msgspec.json.schema_components(types, ref_template="#/components/schemas/{name}")
    for (
        schema
    ) in schemas.values():  # a field no Struct declares is ignored (frontend_proc/http/lenient.py), not refused
        if schema.get("additionalProperties") is False:
            del schema["additionalProperties"]
    ref = dict(zip(types, refs))
    for body in {op.body for op in operations if op.body}:
        if "$ref" not in ref[body]:  # a list of objects (llama-server's POST /lora-adapters): no fields of its own
            continue
        fields = schemas[ref[body]["$ref"].rsplit("/", 1)[1]]["properties"]
        for name in maxima.keys() & fields.keys():
            fields[name]["maximum"] = maxima[name]
    paths: dict[str, dict] = {}
    for op in operations:
        content: dict[str, Any] = {"application/json": {"schema": ref[op.response]}} if op.response else {}
        if op.text:
            content[op.text] = {"schema": {"type": "string"}}
        if op.events:  # OpenAPI 3.1: the schema of one event, its data holding the JSON
            data: dict[str, Any] = {"type": "string"}
            if op.events is not str:
                data |= {"contentMediaType": "application/json", "contentSchema": ref[op.events]}
            content["text/event-stream"] = {
                "schema": {"type": "object", "properties": {"data": data}, "required": ["data"]}
            }
        responses = {"200": {"description": "OK", "content": content}}
        for status in op.also:
            responses[str(status)] = {"description": ERRORS[status], "content": content}
        errors = set(op.errors) | (set(BODY_ERRORS) if op.body else set())
        if secured and op.path not in open_paths:
            errors.add(401)
        error = ref[error_type(op.path)]
        for status in sorted(errors):
            responses[str(status)] = {"description": ERRORS[status], "content": {"application/json": {"schema": error}}}
        path = op.doc_path
        entry: dict[str, Any] = {
            "summary": op.summary,
            "operationId": _PARAM.sub(r"\1", path).strip("/").replace("/", "_") or "index",
            "responses": responses,
        }
        parameters = [
            {"name": name, "in": "path", "required": True, "schema": {"type": "string"}}
            for name in _PARAM.findall(path)
        ]
        parameters += [
            {"name": name, "in": "query", "required": False, "schema": {"enum": list(v)} if v else {"type": "string"}}
            for name, v in op.query
        ]
        if parameters:
            entry["parameters"] = parameters
        if op.body:
            entry["requestBody"] = {"required": True, "content": {"application/json": {"schema": ref[op.body]}}}
        if secured:
            entry["security"] = [] if op.path in open_paths else [{"bearer": []}]
        paths.setdefault(path, {})[op.method.lower()] = entry
    components: dict = {"schemas": schemas}
    if secured:
        components["securitySchemes"] = {"bearer": {"type": "http", "scheme": "bearer"}}
    return {"openapi": "3.1.0", "info": {"title": title, "version": "1"}, "paths": paths, "components": components}
