"""cllm.core.images: which bytes may go on to an image decoder, and the error that names what is wrong otherwise."""

from __future__ import annotations

import struct

import pytest

from cllm.core import images
from cllm.core.images import ImageTooLarge, MalformedImage, UnsupportedImage, check
from perf import image_files as F

RGB = F.picture(64, 48)


def test_supported_formats_give_their_size():
    assert check(F.png(RGB)) == images.ImageInfo("png", 64, 48)
    assert check(F.jpeg(RGB)) == images.ImageInfo("jpeg", 64, 48)
    assert check(F.bmp(RGB)) == images.ImageInfo("bmp", 64, 48)
    top_down = bytearray(F.bmp(RGB))
    top_down[22:26] = struct.pack("<i", -48)  # a negative height: rows stored top to bottom
    assert check(bytes(top_down)) == images.ImageInfo("bmp", 64, 48)
    gif = b"GIF89a" + struct.pack("<HH", 10, 20) + b"\x00\x00\x00" + b";"
    assert check(gif) == images.ImageInfo("gif", 10, 20)


@pytest.mark.parametrize(
    ("data", "named"),
    [
        (b"hello, I am text", "not an image"),
        (b"RIFF\x00\x00\x00\x00WEBPVP8 ", "WebP"),
        (b"II*\x00" + b"\x00" * 20, "TIFF"),
        (b"\x00\x00\x00\x18ftypheic" + b"\x00" * 20, "HEIC"),
        (b"\x00\x00\x00\x18ftypavif" + b"\x00" * 20, "AVIF"),
        (b'  <svg xmlns="http://www.w3.org/2000/svg"/>', "SVG"),
        (b"%PDF-1.7", "PDF"),
    ],
)
def test_other_bytes_are_refused_by_name(data, named):
    with pytest.raises(UnsupportedImage, match=named):
        check(data)


def test_empty_and_oversized():
    with pytest.raises(UnsupportedImage, match="empty"):
        check(b"")
    data = F.png(RGB)
    with pytest.raises(ImageTooLarge, match=f"{len(data)} bytes"):
        check(data, max_bytes=len(data) - 1)
    assert check(data, max_bytes=len(data)).width == 64


def test_pixel_bomb_refused_from_the_header():
    # a few hundred bytes that claim 60,000 x 60,000 pixels (10 GB decoded)
    bomb = F.png_raw(60_000, 60_000, b"\x78\x9c\x03\x00\x00\x00\x00\x01")
    with pytest.raises(ImageTooLarge, match="60000x60000"):
        check(bomb)
    with pytest.raises(ImageTooLarge, match="64x48"):
        check(F.jpeg(RGB), max_pixels=64 * 48 - 1)


def test_broken_png_refused():
    good = F.png(RGB)
    with pytest.raises(MalformedImage, match="truncated"):
        check(good[: len(good) - 20])
    corrupt = bytearray(good)
    corrupt[60] ^= 0xFF  # a byte inside the IDAT data
    with pytest.raises(MalformedImage, match="checksum"):
        check(bytes(corrupt))
    no_ihdr = good[:8] + good[33:]
    with pytest.raises(MalformedImage, match="IHDR"):
        check(no_ihdr)
    with pytest.raises(MalformedImage, match="0x48"):
        check(F.png_raw(0, 48, b""))


def test_png_of_countless_chunks_refused():
    """Walking a chunk costs ~1 us: a file of a million empty ones is refused after the first 50,000."""
    empty = F.png_chunk(b"tEXt", b"")
    head = F.png(RGB)[:33]  # signature and IHDR
    tail = F.png_chunk(b"IDAT", b"") + F.png_chunk(b"IEND", b"")
    assert check(head + empty * (images.MAX_PNG_CHUNKS - 3) + tail).format == "png"
    with pytest.raises(MalformedImage, match="more than 50000 chunks"):
        check(head + empty * images.MAX_PNG_CHUNKS + tail)


def test_jpeg_of_countless_markers_refused():
    good = F.jpeg(RGB)
    for filler in (b"\xff\xfe\x00\x02", b"\xff"):  # empty comment segments; fill bytes
        many = good[:2] + filler * images.MAX_JPEG_MARKERS + good[2:]
        with pytest.raises(MalformedImage, match="more than 10000 markers"):
            check(many)
    assert check(good[:2] + b"\xff\xfe\x00\x02" * 100 + good[2:]).format == "jpeg"


def test_jpeg_of_too_many_scans_refused():
    good = F.jpeg(RGB)
    end = len(good) - 2  # before the end-of-image marker
    with pytest.raises(MalformedImage, match="101 scans"):
        check(good[:end] + b"\xff\xda\x00\x02" * images.MAX_JPEG_SCANS + good[end:])
    assert check(good[:end] + b"\xff\xda\x00\x02" * (images.MAX_JPEG_SCANS - 1) + good[end:]).format == "jpeg"


def test_broken_jpeg_refused():
    good = F.jpeg(RGB)
    sof = good.index(b"\xff\xc0")
    with pytest.raises(MalformedImage, match="truncated"):
        check(good[: sof + 6])
    with pytest.raises(MalformedImage, match="no frame header"):
        check(good[:sof] + good[good.index(b"\xff\xda") :])
    arithmetic = good[:sof] + b"\xff\xc9" + good[sof + 2 :]
    with pytest.raises(UnsupportedImage, match="arithmetic"):
        check(arithmetic)


def test_broken_gif_and_bmp_refused():
    with pytest.raises(MalformedImage, match="GIF"):
        check(b"GIF89a\x0a\x00\x14\x00")  # its size, then nothing of the rest of its header
    with pytest.raises(MalformedImage, match="BMP"):
        check(b"BM" + b"\x00" * 10)
    bad_header = bytearray(F.bmp(RGB))
    bad_header[14:18] = struct.pack("<I", 7)
    with pytest.raises(MalformedImage, match="header size 7"):
        check(bytes(bad_header))
