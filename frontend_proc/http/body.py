"""A request's body read into a route's type: content type, UTF-8, JSON and fields, each refused with a 4xx naming what
is wrong."""

from __future__ import annotations

import re
from typing import TypeVar

import msgspec
from starlette.requests import Request

from cllm.core.errors import ApiError
from frontend_proc.http import lenient

T = TypeVar("T")

# curl's -d sends application/x-www-form-urlencoded, and many clients send no
# type at all: both are read as JSON. Any other type is refused with 415.
JSON_MEDIA_TYPES = ("application/json", "application/x-www-form-urlencoded")

# The deepest nesting a body may have (serde_json's limit too). What reads a body recurses (msgspec, the schema and
# tool code after it), and Python's stack ends near 1,000 frames: a small body nested a few hundred levels deep
# would otherwise end in a RecursionError, a 500.
MAX_DEPTH = 128
# What the depth scan keeps of a body: quotes and brackets, braces read as brackets (only the nesting counts).
_MARKS = bytes.maketrans(b"{}", b"[]")
_NOT_MARKS = bytes(b for b in range(256) if b not in b'"[]{}')


# msgspec names the field at fault: "Expected `int` >= 1 - at `$.max_tokens`",
# "Object contains unknown field `bogus`", "... field `role` - at `$.messages[0]`".
_FIELD = re.compile(r"field `([^`]*)`")
_PATH = re.compile(r"at `\$\.?([^`]*)`$")


def _param(message: str) -> str | None:
    field, path = _FIELD.search(message), _PATH.search(message)
    parts = [m.group(1) for m in (path, field) if m and m.group(1)]
    return ".".join(parts) or None


async def decode_body(request: Request, type_: type[T], near_misses: bool = False) -> T:
    """The body as ``type_``; ``near_misses``: an unknown field that looks like a typo of a known one is a 400."""
    _check_content_type(request.headers.get("content-type", ""))
    body = await request.body()
    if _depth(body) > MAX_DEPTH:
        raise ApiError(400, "invalid request", f"the body nests deeper than {MAX_DEPTH} levels")
    try:
        return _decode(body, type_, near_misses)
    except msgspec.ValidationError as e:
        raise ApiError(400, "invalid request", str(e), param=_param(str(e))) from None
    except msgspec.DecodeError as e:
        # msgspec >= 0.23 refuses bad UTF-8 as a JSON error of its own; the answer names UTF-8 whichever version
        # runs (the check costs nothing on a body that decoded).
        if not _is_utf8(body):
            raise _not_utf8() from None
        raise ApiError(400, "invalid JSON", str(e)) from None
    except UnicodeDecodeError:
        raise _not_utf8() from None


def _depth(body: bytes) -> int:
    """How deep the body's arrays and objects nest, as far as MAX_DEPTH + 1 (its bracket count where that is lower).

    In bytes methods, at C speed: escapes out, then only quotes and brackets kept; what lies between a pair of
    quotes is in a string; then each pass drops the innermost pairs. Brackets that do not pair (a body msgspec
    will refuse) end the count where a pass drops nothing.
    """
    opened = body.count(b"{") + body.count(b"[")
    if opened <= MAX_DEPTH:
        return opened
    if b'\\"' in body:  # a quote in a string (or an escaped backslash before a closing one)
        body = body.replace(b"\\\\", b"").replace(b'\\"', b"")
    marks = body.translate(_MARKS, _NOT_MARKS)
    nest = b"".join(marks.split(b'"')[::2])
    for depth in range(MAX_DEPTH + 1):
        inner = nest.replace(b"[]", b"")
        if len(inner) == len(nest):
            return depth
        nest = inner
    return MAX_DEPTH + 1


def _is_utf8(body: bytes) -> bool:
    try:
        body.decode()
    except UnicodeDecodeError:
        return False
    return True


def _not_utf8() -> ApiError:
    return ApiError(400, "invalid UTF-8", "the body is not valid UTF-8 text")


def _decode(body: bytes, type_: type[T], near_misses: bool) -> T:
    try:
        return msgspec.json.decode(body, type=type_)
    except msgspec.ValidationError as e:
        if "got `float`" not in str(e) and "unknown field" not in str(e):
            raise
    # JSON (and JSON Schema) count 2.0 as an integer, msgspec's strict ints do not;
    # and a field no Struct declares is what a newer client adds (lenient.decode drops it).
    return lenient.decode(_integral(msgspec.json.decode(body)), type_, near_misses)


def _integral(value):
    if type(value) is float and value.is_integer():
        return int(value)
    if type(value) is dict:
        return {k: _integral(v) for k, v in value.items()}
    if type(value) is list:
        return [_integral(v) for v in value]
    return value


def _check_content_type(value: str) -> None:
    media, *params = (part.strip().lower() for part in value.split(";"))
    if media and media not in JSON_MEDIA_TYPES and not media.endswith("+json"):
        raise ApiError(
            415, "unsupported media type", f"the body must be JSON (Content-Type: application/json), not {media}"
        )
    for param in params:
        if param.startswith("charset=") and param[8:].strip('"') not in ("utf-8", "utf8"):
            raise ApiError(415, "unsupported media type", f"JSON must be UTF-8, not {param[8:]}")
