"""An image part of a chat message, from what a door reads off the wire, and its place in the prompt.

A door turns its wire format's image (an OpenAI data URI, Anthropic's or Ollama's base64, a URL) into an `Image`
with one of the helpers here and puts it in a message's content list beside the text; it decodes nothing itself.
The chat layer (frontend_proc.chat.turn) fetches what is a URL (only when the operator allows it), checks every
image with cllm.core.images.check, renders the template with a marker where each one goes, and splits the prompt
there. Malformed data gets a 400 naming the field it came in.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import secrets
import urllib.error
from dataclasses import dataclass

from cllm.core import images
from cllm.core.config import ServeConfig
from cllm.core.errors import invalid
from cllm.core.protocol import ImageInput
from frontend_proc.chat.url_fetch import download

# What llama-server's /apply-template writes where an image goes (its default media marker).
SHOWN_MARKER = "<__media__>"


@dataclass(frozen=True, slots=True)
class Image:
    """An image part: its file's bytes, or (data None) a URL the chat layer fetches; param: where it came in."""

    param: str
    data: bytes | None = None
    url: str | None = None


def from_base64(text: object, param: str, media_type: object = "image/") -> Image:
    """Base64 as JSON carries it (whitespace a MIME encoder wraps lines with is allowed); media_type: what the
    client declared it (it must be an image type; the format itself is sniffed from the bytes)."""
    if not isinstance(media_type, str) or not media_type.lower().startswith("image/"):
        raise invalid(f"the media type {media_type!r} is not an image type", param)
    if not isinstance(text, str):
        raise invalid("the image must be a base64 string", param)
    try:
        return Image(param, base64.b64decode("".join(text.split()), validate=True))
    except (binascii.Error, ValueError):
        raise invalid("the image is not valid base64", param) from None


def from_url(url: str, param: str) -> Image:
    """A data URI (`data:image/png;base64,...`), or an http(s) URL to fetch; anything else is a 400."""
    if url.startswith("data:"):
        head, comma, data = url.partition(",")
        if not comma:
            raise invalid("the data URI has no comma before its data", param)
        kind, *attrs = head[5:].split(";")
        if "base64" not in (a.strip().lower() for a in attrs):
            raise invalid("the data URI must be base64 encoded (data:image/png;base64,...)", param)
        return from_base64(data, param, kind or "missing")
    if url.lower().startswith(("http://", "https://")):
        return Image(param, url=url)
    raise invalid("an image URL must be a data URI (data:image/png;base64,...) or an http(s) URL", param)


async def fetch(image: Image, config: ServeConfig) -> Image:
    """An image with its bytes: fetched when it is a URL and --image-urls allows it (from a public address unless
    --image-urls-private: frontend_proc.chat.url_fetch)."""
    if image.data is not None or image.url is None:
        return image
    if not config.image_urls:
        raise invalid(
            "this server does not fetch image URLs (the operator may allow it with --image-urls); "
            "send the image as a data URI (data:image/png;base64,...)",
            image.param,
        )
    limit, timeout = images.MAX_BYTES, config.image_url_timeout
    try:
        data = await asyncio.wait_for(
            asyncio.to_thread(download, image.url, limit, timeout, config.image_urls_private), timeout + 1
        )
    except (TimeoutError, asyncio.TimeoutError):
        raise invalid(f"fetching the image took longer than {timeout:g} s", image.param) from None
    except urllib.error.HTTPError as e:
        raise invalid(f"fetching the image failed: HTTP {e.code}", image.param) from None
    except (urllib.error.URLError, OSError, ValueError) as e:
        raise invalid(f"fetching the image failed: {getattr(e, 'reason', e)}", image.param) from None
    if len(data) > limit:
        raise invalid(f"the image at the URL is over the limit of {limit} bytes", image.param)
    return Image(image.param, data)


def checked(image: Image) -> bytes:
    """The image's bytes once cllm.core.images accepts them; else a 400 saying why."""
    assert image.data is not None
    try:
        images.check(image.data)
    except images.ImageError as e:
        raise invalid(str(e), image.param) from None
    return image.data


def new_marker() -> str:
    """A marker for one request's images: random, so that no client's text can spell it."""
    return f"<__image_{secrets.token_hex(12)}__>"


def joined(parts: list, marker: str) -> str:
    """A message's content parts as one text, as llama-server joins them: text parts on lines of their own, an
    image's marker with nothing around it."""
    text, last_image = "", False
    for part in parts:
        if isinstance(part, Image):
            text, last_image = text + marker, True
        else:
            text, last_image = text + ("\n" if text and not last_image else "") + part, False
    return text


def split(
    tokenize, text: str, marker: str, found: list[bytes], param: str = "messages"
) -> tuple[list[int], list[ImageInput]]:
    """The prompt's tokens and its images: the text between markers tokenized piece by piece (special tokens
    only at the start), each image placed before the tokens that follow its marker, as mtmd's tokenizer does, with
    its size (checked bytes: what sizes it for a projector that takes images at their own size)."""
    pieces = text.split(marker)
    if len(pieces) - 1 != len(found):
        raise invalid(f"the prompt has {len(pieces) - 1} places marked for images but {len(found)} images", param)
    tokens: list[int] = tokenize(pieces[0], True)
    inputs = []
    for data, piece in zip(found, pieces[1:]):
        info = images.check(data)
        inputs.append(ImageInput(len(tokens), data, info.width, info.height))
        if piece:
            tokens += tokenize(piece, False)
    return tokens, inputs
