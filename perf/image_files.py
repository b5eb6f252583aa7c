"""Image files written by hand (numpy and zlib; no Pillow), for the tests and benchmarks of the image path.

png: any RGB array, lossless. jpeg: a baseline JPEG whose every 8x8 block is one flat colour (only DC
coefficients, all quantized by 1, so it decodes to within a step or two of the colours given). bmp: 24-bit,
uncompressed. gif: a palette image, its LZW codes all single pixels (lossless, not compressed).
"""

from __future__ import annotations

import struct
import zlib

import numpy as np


def picture(width: int = 64, height: int = 48, seed: int = 0) -> np.ndarray:
    """An RGB image (height x width x 3, uint8) of flat 8x8 blocks in random colours."""
    blocks = np.random.default_rng(seed).integers(0, 256, (height // 8, width // 8, 3), dtype=np.uint8)
    return blocks.repeat(8, axis=0).repeat(8, axis=1)


def png_chunk(kind: bytes, body: bytes) -> bytes:
    return struct.pack(">I", len(body)) + kind + body + struct.pack(">I", zlib.crc32(body, zlib.crc32(kind)))


def png(rgb: np.ndarray, level: int = 6) -> bytes:
    height, width, _ = rgb.shape
    raw = b"".join(b"\x00" + rgb[y].tobytes() for y in range(height))  # filter type 0 on every row
    return (
        b"\x89PNG\r\n\x1a\n"
        + png_chunk(b"IHDR", struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0))
        + png_chunk(b"IDAT", zlib.compress(raw, level))
        + png_chunk(b"IEND", b"")
    )


def png_raw(width: int, height: int, idat: bytes) -> bytes:
    """A PNG whose chunks are all well-formed (checksums right) around any IDAT content."""
    return (
        b"\x89PNG\r\n\x1a\n"
        + png_chunk(b"IHDR", struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0))
        + png_chunk(b"IDAT", idat)
        + png_chunk(b"IEND", b"")
    )


def bmp(rgb: np.ndarray) -> bytes:
    height, width, _ = rgb.shape
    stride = (width * 3 + 3) // 4 * 4
    rows = b"".join(rgb[y, :, ::-1].tobytes().ljust(stride, b"\0") for y in range(height - 1, -1, -1))
    info = struct.pack("<IiiHHIIiiII", 40, width, height, 1, 24, 0, len(rows), 2835, 2835, 0, 0)
    return b"BM" + struct.pack("<IHHI", 14 + 40 + len(rows), 0, 0, 14 + 40) + info + rows


def _segment(marker: int, body: bytes) -> bytes:
    return struct.pack(">BBH", 0xFF, marker, len(body) + 2) + body


def jpeg(rgb: np.ndarray) -> bytes:
    """Baseline JPEG, 3 components (YCbCr, no subsampling), each block's mean colour as its DC coefficient."""
    height, width, _ = rgb.shape
    assert width % 8 == 0 and height % 8 == 0
    r, g, b = (rgb[..., i].astype(np.float64) for i in range(3))
    ycc = [
        0.299 * r + 0.587 * g + 0.114 * b,
        128 - 0.168736 * r - 0.331264 * g + 0.5 * b,
        128 + 0.5 * r - 0.418688 * g - 0.081312 * b,
    ]
    # DC of an 8x8 DCT with quantizer 1: 8 x (block mean - 128)
    dc = [np.rint(8 * (c.reshape(height // 8, 8, width // 8, 8).mean(axis=(1, 3)) - 128)).astype(int) for c in ycc]
    bits: list[str] = []
    prev = [0, 0, 0]
    for by in range(height // 8):
        for bx in range(width // 8):
            for c in range(3):
                diff = int(dc[c][by, bx]) - prev[c]
                prev[c] = int(dc[c][by, bx])
                size = abs(diff).bit_length()
                bits.append(format(size, "04b"))  # DC table: category k has the 4-bit code k
                if size:
                    bits.append(format(diff if diff > 0 else diff + (1 << size) - 1, f"0{size}b"))
                bits.append("0")  # AC table: end-of-block has the 1-bit code 0
    stream = "".join(bits)
    stream += "1" * (-len(stream) % 8)
    data = bytes(int(stream[i : i + 8], 2) for i in range(0, len(stream), 8)).replace(b"\xff", b"\xff\x00")
    dc_table = bytes([0x00]) + bytes([0, 0, 0, 12] + [0] * 12) + bytes(range(12))
    ac_table = bytes([0x10]) + bytes([1] + [0] * 15) + bytes([0x00])
    return (
        b"\xff\xd8"
        + _segment(0xDB, bytes([0]) + bytes([1] * 64))
        + _segment(0xC0, struct.pack(">BHHB", 8, height, width, 3) + bytes([1, 0x11, 0, 2, 0x11, 0, 3, 0x11, 0]))
        + _segment(0xC4, dc_table + ac_table)
        + _segment(0xDA, bytes([3, 1, 0x00, 2, 0x00, 3, 0x00, 0, 63, 0]))
        + data
        + b"\xff\xd9"
    )


def gif(indices: np.ndarray, palette: np.ndarray) -> bytes:
    """A GIF of ``indices`` (height x width, uint8) into ``palette`` (256 x 3, uint8)."""
    height, width = indices.shape
    clear, end = 256, 257
    codes: list[int] = []
    for i, index in enumerate(indices.ravel().tolist()):
        if i % 250 == 0:  # a clear code before the table grows to 512 entries: every code stays 9 bits wide
            codes.append(clear)
        codes.append(index)
    codes.append(end)
    value = sum(code << (9 * i) for i, code in enumerate(codes))  # packed least significant bit first
    lzw = value.to_bytes((9 * len(codes) + 7) // 8, "little")
    blocks = b"".join(bytes([len(lzw[i : i + 255])]) + lzw[i : i + 255] for i in range(0, len(lzw), 255))
    return (
        b"GIF89a"
        + struct.pack("<HHBBB", width, height, 0xF7, 0, 0)
        + palette.astype(np.uint8).tobytes()
        + b"\x2c"
        + struct.pack("<HHHHB", 0, 0, width, height, 0)
        + b"\x08"
        + blocks
        + b"\x00\x3b"
    )
