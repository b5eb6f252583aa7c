"""What the ingress hands an engine replica: one HTTP request, and the text it is routed by.

Ray Serve's HTTP proxy does not show a request's body to the router that picks
a replica, so a thin ingress deployment reads it and calls the engine
replicas through a DeploymentHandle, whose router sees this object. ``prompt``
is named as Ray's PrefixCacheAffinityRouter expects (it reads ``.prompt``), so
Ray's router can be measured on the same deployment; cllm's router reads
``blocks``, stable hashes of its leading ``BLOCK_CHARS``-character blocks.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field

import msgspec

# About 32 tokens of English: the block size of the engine pool's router (cllm/core/prefix_router.py).
BLOCK_CHARS = 128

_any_json = msgspec.json.Decoder()


@dataclass(slots=True)
class HttpCall:
    method: str
    path: str
    query: bytes
    headers: list[tuple[bytes, bytes]]
    body: bytes
    prompt: str = ""  # the conversation as one text: system, messages or prompt, in order (else "METHOD /path")
    blocks: list[int] = field(default_factory=list)  # text_blocks(prompt)


def routing_text(body: bytes) -> str:
    """The text a request's prompt starts with, whatever its API; "" when the body says none.

    Each message contributes its role and content with separators, so a chat's
    next turn has this turn's text as its prefix.
    """
    try:
        doc = _any_json.decode(body)
    except (msgspec.DecodeError, UnicodeDecodeError):
        return ""
    if type(doc) is not dict:
        return ""
    return "".join(_text(doc.get(key)) for key in ("system", "instructions", "messages", "prompt", "input"))


def _text(value) -> str:
    if type(value) is str:
        return value
    if type(value) is list:
        return "".join(_text(v) for v in value)
    if type(value) is dict:
        role = value.get("role")
        body = _text(value.get("content", value.get("text")))
        return f"\x1f{role}\x1f{body}\x1e" if type(role) is str else body
    if type(value) is int:  # a prompt given as token ids
        return f"{value},"
    return ""


def text_blocks(text: str) -> list[int]:
    """Hashes of text[:B], text[:2B], ... each chained from the one before; the same in every process."""
    hashes = []
    h = b""
    data = text.encode("utf-8", "surrogatepass")
    for end in range(BLOCK_CHARS, len(data) + 1, BLOCK_CHARS):
        h = hashlib.blake2b(h + data[end - BLOCK_CHARS : end], digest_size=8).digest()
        hashes.append(int.from_bytes(h, "little"))
    return hashes
