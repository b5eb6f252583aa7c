"""What an acceptable image is, checked from its bytes alone before any decoder sees them.

An image arrives as bytes (a data URI's or base64 field's, decoded by the door). Before llama.cpp's decoder
(stb_image, inside libmtmd) reads them, `check` sniffs the format from the magic bytes, reads the width and
height from the header, and bounds the bytes and the pixels (a 30 kB PNG can claim 60,000 x 60,000 pixels and
make the decoder allocate 10 GB). Only the formats stb_image decodes and clients send pass: PNG, JPEG, GIF
(first frame) and BMP; WebP, TIFF, HEIC/AVIF, SVG and the rest get an error naming them. A PNG is also walked
chunk by chunk with each CRC checked, so a truncated or corrupted one is refused here rather than half-decoded.

Pure Python with no llama.cpp, so the frontend can answer a 400 before the request crosses to the engine, and
the engine can check again what it is handed. Each error's message names the problem for that 400.
"""

from __future__ import annotations

import struct
import zlib
from dataclasses import dataclass

MAX_BYTES = 20 * 1024 * 1024  # what OpenAI and Anthropic take for one image
MAX_PIXELS = 8192 * 8192  # 192 MiB once decoded to RGB
# The most image bytes one request may carry, all its images together: what the request ring of an engine with a
# projector has room for beside its text requests (cllm/core/launch.py); the frontend answers a 400 above it.
MAX_REQUEST_BYTES = 64 * 1024 * 1024


class ImageError(ValueError):
    """An image that is not accepted; the message says why, for the client (a 400)."""


class ImageTooLarge(ImageError):
    pass


class UnsupportedImage(ImageError):
    """Not an image, or a format that is not decoded here."""


class MalformedImage(ImageError):
    """The bytes start like a supported format but are not a valid file of it."""


@dataclass(frozen=True, slots=True)
class ImageInfo:
    format: str  # "png", "jpeg", "gif" or "bmp"
    width: int
    height: int


# Formats recognised by their first bytes but not decoded: named in the error so the client knows what to convert.
_UNSUPPORTED = (
    (b"RIFF", 8, b"WEBP", "WebP"),
    (b"II*\x00", 0, b"", "TIFF"),
    (b"MM\x00*", 0, b"", "TIFF"),
    (b"8BPS", 0, b"", "PSD"),
    (b"\x00\x00\x01\x00", 0, b"", "ICO"),
    (b"\xff\x0a", 0, b"", "JPEG XL"),
    (b"\x00\x00\x00\x0cJXL ", 0, b"", "JPEG XL"),
    (b"%PDF", 0, b"", "PDF"),
)
_ISO_BRANDS = {b"heic": "HEIC", b"heix": "HEIC", b"mif1": "HEIF", b"avif": "AVIF", b"avis": "AVIF"}


def check(data: bytes, max_bytes: int = MAX_BYTES, max_pixels: int = MAX_PIXELS) -> ImageInfo:
    """The image's format and size, or an ImageError naming what is wrong with it."""
    if not data:
        raise UnsupportedImage("the image is empty (0 bytes)")
    if len(data) > max_bytes:
        raise ImageTooLarge(f"the image is {len(data)} bytes, over the limit of {max_bytes}")
    if data.startswith(b"\x89PNG\r\n\x1a\n"):
        info = _png(data)
    elif data.startswith(b"\xff\xd8\xff"):
        info = _jpeg(data)
    elif data[:6] in (b"GIF87a", b"GIF89a"):
        info = _gif(data)
    elif data.startswith(b"BM"):
        info = _bmp(data)
    else:
        raise UnsupportedImage(_unsupported(data))
    if info.width <= 0 or info.height <= 0:
        raise MalformedImage(f"the {info.format.upper()} header gives a size of {info.width}x{info.height}")
    if info.width * info.height > max_pixels:
        raise ImageTooLarge(f"the image is {info.width}x{info.height} pixels, over the limit of {max_pixels} pixels")
    return info


def _unsupported(data: bytes) -> str:
    for magic, at, tag, name in _UNSUPPORTED:
        if data.startswith(magic) and data[at : at + len(tag)] == tag:
            return f"{name} images are not supported (send PNG, JPEG, GIF or BMP)"
    if data[4:8] == b"ftyp" and data[8:12] in _ISO_BRANDS:
        return f"{_ISO_BRANDS[data[8:12]]} images are not supported (send PNG, JPEG, GIF or BMP)"
    head = data[:256].lstrip().lower()
    if head.startswith((b"<svg", b"<?xml")):
        return "SVG images are not supported (send PNG, JPEG, GIF or BMP)"
    return "the data is not an image in a supported format (PNG, JPEG, GIF or BMP)"


# More chunks than any encoder writes (libpng: 8 KiB of image data a chunk, 2,560 for 20 MiB); walking them costs
# ~1 us each, so a 20 MiB file of 1.7 million empty chunks would cost ~2 s of the frontend's CPU.
MAX_PNG_CHUNKS = 50_000


def _png(data: bytes) -> ImageInfo:
    at, width, height, seen_idat = 8, 0, 0, False
    for _ in range(MAX_PNG_CHUNKS):
        if at + 12 > len(data):
            raise MalformedImage("the PNG is truncated (it ends before its IEND chunk)")
        length, kind = struct.unpack_from(">I4s", data, at)
        end = at + 12 + length
        if length > 0x7FFFFFFF or end > len(data):
            raise MalformedImage(f"the PNG is truncated (its {kind.decode('latin-1')!r} chunk runs past the end)")
        body = data[at + 8 : at + 8 + length]
        if zlib.crc32(body, zlib.crc32(kind)) != struct.unpack_from(">I", data, end - 4)[0]:
            raise MalformedImage(f"the PNG is corrupted (bad checksum in its {kind.decode('latin-1')!r} chunk)")
        if at == 8:
            if kind != b"IHDR" or length != 13:
                raise MalformedImage("the PNG does not start with an IHDR chunk")
            width, height, depth, color, _, _, interlace = struct.unpack(">IIBBBBB", body)
            if depth not in (1, 2, 4, 8, 16) or color not in (0, 2, 3, 4, 6) or interlace > 1:
                raise MalformedImage(f"the PNG header is invalid (bit depth {depth}, color type {color})")
        elif kind == b"IDAT":
            seen_idat = True
        elif kind == b"IEND":
            if not seen_idat:
                raise MalformedImage("the PNG has no image data (no IDAT chunk)")
            return ImageInfo("png", width, height)
        at = end
    raise MalformedImage(f"the PNG has more than {MAX_PNG_CHUNKS} chunks")


# JPEG start-of-frame markers stb_image decodes: baseline, extended sequential, progressive (Huffman coded).
_SOF_DECODED = {0xC0, 0xC1, 0xC2}
_SOF_OTHER = {0xC3, 0xC5, 0xC6, 0xC7, 0xC9, 0xCA, 0xCB, 0xCD, 0xCE, 0xCF}  # lossless, hierarchical, arithmetic


# Markers (and fill bytes) before the frame header: a camera's JPEG has a few dozen; the bound keeps a file of
# millions of empty segments or fill bytes from costing the frontend seconds, as MAX_PNG_CHUNKS does for PNG.
MAX_JPEG_MARKERS = 10_000
# A progressive JPEG's refinement scan can cover the whole image in a few bytes (an end-of-band run), and the
# decoder walks every block in every scan: libjpeg writes 10 scans for a colour image; more than 100 is refused.
MAX_JPEG_SCANS = 100


def _jpeg(data: bytes) -> ImageInfo:
    at = 2
    for _ in range(MAX_JPEG_MARKERS):
        if at + 4 > len(data):
            raise MalformedImage("the JPEG is truncated (it ends before its frame header)")
        if data[at] != 0xFF:
            raise MalformedImage(f"the JPEG is corrupted (no marker at byte {at})")
        marker = data[at + 1]
        if marker == 0xFF:  # fill byte
            at += 1
            continue
        if marker == 0x01 or 0xD0 <= marker <= 0xD7:  # no length
            at += 2
            continue
        (length,) = struct.unpack_from(">H", data, at + 2)
        if length < 2 or at + 2 + length > len(data):
            raise MalformedImage("the JPEG is truncated (a header segment runs past the end)")
        if marker in _SOF_DECODED:
            if length < 8:
                raise MalformedImage("the JPEG's frame header is too short")
            # Entropy-coded data escapes 0xFF, so this counts the start-of-scan markers exactly.
            if (scans := data.count(b"\xff\xda", at)) > MAX_JPEG_SCANS:
                raise MalformedImage(f"the JPEG has {scans} scans, more than {MAX_JPEG_SCANS}")
            height, width = struct.unpack_from(">HH", data, at + 5)
            return ImageInfo("jpeg", width, height)
        if marker in _SOF_OTHER:
            raise UnsupportedImage("lossless, hierarchical and arithmetic-coded JPEGs are not supported")
        if marker in (0xDA, 0xD9):
            raise MalformedImage("the JPEG has no frame header before its image data")
        at += 2 + length
    raise MalformedImage(f"the JPEG has more than {MAX_JPEG_MARKERS} markers before its frame header")


def _gif(data: bytes) -> ImageInfo:
    if len(data) < 13:
        raise MalformedImage("the GIF is truncated (shorter than its header)")
    width, height = struct.unpack_from("<HH", data, 6)
    return ImageInfo("gif", width, height)


def _bmp(data: bytes) -> ImageInfo:
    if len(data) < 26:
        raise MalformedImage("the BMP is truncated (shorter than its header)")
    (size,) = struct.unpack_from("<I", data, 14)
    if size == 12:
        width, height = struct.unpack_from("<HH", data, 18)
    elif size >= 40:
        width, height = struct.unpack_from("<ii", data, 18)
        height = abs(height)  # negative: rows stored top-down
    else:
        raise MalformedImage(f"the BMP header is invalid (header size {size})")
    return ImageInfo("bmp", width, height)
