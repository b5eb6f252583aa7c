"""llama-server's /tokenize and /detokenize, in its shapes, for clients written against it.

Bodies are llama-server's own (not wrapped in cLLM's `success`/`data`), so
its clients work unchanged; cLLM's /encode stays as it was.
"""

from __future__ import annotations

import msgspec
from starlette.requests import Request
from starlette.responses import Response

from frontend_proc.app import decode_body, state
from cllm.core.errors import ApiError, json_response
from frontend_proc.openapi import Operation


class TokenizeRequest(msgspec.Struct, forbid_unknown_fields=True):
    content: str
    add_special: bool = False  # BOS, as the model's file asks
    parse_special: bool = True  # <|im_end|> written out is one token
    with_pieces: bool = False


class TokenPiece(msgspec.Struct):
    id: int
    piece: str | list[int]  # the bytes when they are not whole UTF-8 characters


class TokenizeResult(msgspec.Struct):
    tokens: list[int | TokenPiece]


class DetokenizeRequest(msgspec.Struct, forbid_unknown_fields=True):
    tokens: list[int]


class DetokenizeResult(msgspec.Struct):
    content: str


async def tokenize(request: Request) -> Response:
    body = await decode_body(request, TokenizeRequest)
    tokenizer = state(request).tokenizer
    tokens = tokenizer.encode(body.content, body.add_special, body.parse_special)
    if not body.with_pieces:
        return json_response(TokenizeResult(tokens))
    pieces = []
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
        raise ApiError(400, "invalid request", f"token {bad} is outside the vocabulary (0..{tokenizer.n_vocab - 1})", param="tokens")
    return json_response(DetokenizeResult(tokenizer.decode(body.tokens).decode(errors="replace")))


operations = [
    Operation("POST", "/tokenize", tokenize, "llama-server: text to tokens", body=TokenizeRequest, response=TokenizeResult),
    Operation("POST", "/detokenize", detokenize, "llama-server: tokens to text", body=DetokenizeRequest, response=DetokenizeResult),
]
