"""A vision projector beside the loaded text model, through llama.cpp's multimodal library (mtmd).

The projector GGUF (`--mmproj`) is loaded against the engine's llama_model, which it must match in embedding
width. An image's bytes are checked (cllm.core.images: format, header, size; mtmd's own decoder, stb_image,
only ever sees bytes that passed) and decoded into an mtmd bitmap, whose id is the SHA-256 of its size and RGB
pixels: the same picture sent again, even re-encoded losslessly, gets the same id, so a prefix cache keyed by it
reuses its encoding and never serves one image's cells for another. (llama-server, through
mtmd_helper_bitmap_init_from_buf, hashes the file's bytes instead.)

A prompt is given as parts, text and images in order; mtmd tokenizes it into chunks: text chunks of token ids
and one chunk per image, which takes ``n_tokens`` embeddings (KV cells) and ``n_pos`` positions. The two are the
same but with M-RoPE (Qwen2-VL): there each embedding has four position components (time, row, column, unused),
all of an image's rows start at its first position, and the image takes max(rows, columns) positions; text
after it goes on from there (`positions` gives an image's components). Encoding an image chunk runs the
projector and gives its embeddings, one row of the text model's width per KV cell, which EmbdBatch
(engine_proc/run/batch.py) decodes into a sequence as llama_decode decodes tokens: a llama_batch carries tokens or
embeddings, never both, so an image is a decode of its own. Some projectors' rows see each other (Gemma 3:
mtmd_decode_use_non_causal): such an image is decoded whole, in one ubatch, with the context's causal mask off for
that decode alone (`non_causal`, `batch_error`).

A projector that takes images at about their own size (Qwen2-VL's) gives an image of w x h pixels a number of
tokens that follows its size: `image_sizing` describes its grid for the frontend's count (cllm/core/image_grid.py)
and checks that count against mtmd's on made images of several sizes.
"""

from __future__ import annotations

import ctypes
import hashlib
import math
from collections.abc import Sequence
from dataclasses import dataclass

import llama_cpp as L
import llama_cpp.mtmd_cpp as M
import numpy as np

from cllm.core import images
from cllm.core.gguf_meta import read_metadata
from cllm.core.image_grid import grid_tokens
from cllm.core.images import MalformedImage
from cllm.core.llama_log import capture, silence_mtmd_logs
from cllm.core.protocol import ImageGrid

# The helper falls back to decoding as video with ffmpeg (a subprocess, on the client's bytes) when stb_image
# cannot read them: pointing it at a folder with no ffmpeg in it makes that fallback fail at once.
_NO_FFMPEG = b"/nonexistent/cllm-no-ffmpeg"
# Made images whose positions are counted at load: a landscape and a portrait of other sizes than the tower's, so
# that a projector whose count follows the image's size is caught.
PROBE_SIZES = ((640, 480), (300, 900))
# Projectors that size each image (tools/mtmd/clip.cpp: an image's tokens follow its size), by their
# clip.projector_type: the fewest and most tokens an image takes, which clip.cpp sets for them.
SIZED = {"qwen2vl_merger": (8, 4096), "qwen2.5vl_merger": (8, 4096), "qwen3vl_merger": (8, 4096)}


class ProjectorError(RuntimeError):
    """The projector file cannot serve with this model; the message says why."""


class Image:
    """One decoded image: its mtmd bitmap (freed by close), its id (SHA-256 of size and pixels), its size."""

    __slots__ = ("bitmap", "id", "width", "height", "format")

    def __init__(self, bitmap: int, id: str, width: int, height: int, format: str):
        self.bitmap: int | None = bitmap
        self.id, self.width, self.height, self.format = id, width, height, format

    def close(self) -> None:
        if self.bitmap:
            M.mtmd_bitmap_free(self.bitmap)
            self.bitmap = None


@dataclass(frozen=True, slots=True)
class Chunk:
    """A text chunk (``tokens``) or an image chunk (``image_id``; its tokens are embeddings made by encoding)."""

    ptr: int  # the mtmd_input_chunk, owned by its Chunks
    tokens: np.ndarray | None  # int32 token ids; None for an image
    image_id: str | None
    n_tokens: int
    n_pos: int

    @property
    def is_image(self) -> bool:
        return self.tokens is None


class Chunks(Sequence[Chunk]):
    """A tokenized prompt: its chunks in order, alive until close()."""

    def __init__(self, ptr: int):
        self._ptr: int | None = ptr
        self._chunks = [_chunk(M.mtmd_input_chunks_get(ptr, i)) for i in range(M.mtmd_input_chunks_size(ptr))]

    def __getitem__(self, i):
        return self._chunks[i]

    def __len__(self) -> int:
        return len(self._chunks)

    @property
    def n_pos(self) -> int:
        """Positions the whole prompt takes (fewer than its KV cells with M-RoPE)."""
        return sum(c.n_pos for c in self._chunks)

    @property
    def n_tokens(self) -> int:
        """KV cells the whole prompt takes: what llama-server counts as its prompt tokens."""
        return sum(c.n_tokens for c in self._chunks)

    def close(self) -> None:
        if self._ptr:
            M.mtmd_input_chunks_free(self._ptr)
            self._ptr, self._chunks = None, []

    def __enter__(self) -> Chunks:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def _chunk(ptr: int) -> Chunk:
    n_pos = M.mtmd_input_chunk_get_n_pos(ptr)
    if M.mtmd_input_chunk_get_type(ptr) == M.MTMD_INPUT_CHUNK_TYPE_TEXT:
        n = ctypes.c_size_t()
        data = M.mtmd_input_chunk_get_tokens_text(ptr, ctypes.byref(n))
        tokens = np.ctypeslib.as_array(data, (n.value,)).astype(np.int32) if n.value else np.zeros(0, np.int32)
        return Chunk(ptr, tokens, None, n.value, n_pos)
    return Chunk(ptr, None, M.mtmd_input_chunk_get_id(ptr).decode(), M.mtmd_input_chunk_get_n_tokens(ptr), n_pos)


def _identified(bitmap: int, format: str) -> Image:
    """A decoded bitmap as an Image, its id set (the chunks mtmd makes of it carry the id)."""
    width, height = M.mtmd_bitmap_get_nx(bitmap), M.mtmd_bitmap_get_ny(bitmap)
    address = ctypes.cast(M.mtmd_bitmap_get_data(bitmap), ctypes.c_void_p).value
    rgb = (ctypes.c_uint8 * M.mtmd_bitmap_get_n_bytes(bitmap)).from_address(address)  # hashed in place, no copy
    image_id = pixel_id(width, height, rgb)
    M.mtmd_bitmap_set_id(bitmap, image_id.encode())
    return Image(bitmap, image_id, width, height, format)


def pixel_id(width: int, height: int, rgb) -> str:
    """An image's id: the SHA-256 of its size and RGB pixels (any buffer; SHA-256 so that no one can make two
    collide)."""
    h = hashlib.sha256(width.to_bytes(4, "little") + height.to_bytes(4, "little"))
    h.update(rgb)
    return h.hexdigest()


class Vision:
    def __init__(
        self,
        model,
        mmproj_path: str,
        n_threads: int,
        use_gpu: bool = False,
        max_bytes: int = images.MAX_BYTES,
        max_pixels: int = images.MAX_PIXELS,
    ):
        silence_mtmd_logs()
        params = M.mtmd_context_params_default()
        params.use_gpu = use_gpu
        params.n_threads = n_threads
        params.print_timings = False
        with capture() as said:
            self.ctx = M.mtmd_init_from_file(mmproj_path.encode(), model, params)
        if not self.ctx:
            why = "; ".join(line.strip() for line in said) or "not a projector GGUF?"
            raise ProjectorError(f"llama.cpp could not load the projector {mmproj_path}: {why}")
        try:
            if not M.mtmd_support_vision(self.ctx):
                raise ProjectorError(f"{mmproj_path} has no vision encoder (an audio-only projector?)")
            if M.mtmd_decode_use_mrope(self.ctx) and M.mtmd_decode_use_non_causal(self.ctx, None):
                raise ProjectorError(
                    f"{mmproj_path} needs M-RoPE positions and non-causal attention: not supported yet"
                )
        except ProjectorError:
            self.close()
            raise
        self.n_embd = L.llama_model_n_embd_inp(model)
        # An image's rows attend to each other (Gemma 3's projector): decoded whole with the causal mask off
        self.non_causal = bool(M.mtmd_decode_use_non_causal(self.ctx, None))
        self.image_rows = 0  # the most embeddings one image's chunk takes (image_sizing measures it)
        self.mrope = bool(M.mtmd_decode_use_mrope(self.ctx))  # four position components an embedding
        self.path = mmproj_path
        self.max_bytes, self.max_pixels = max_bytes, max_pixels
        self._opt = M.mtmd_helper_init_opt_default()
        self._opt.video_params.ffmpeg_bin_dir = _NO_FFMPEG

    def image(self, data: bytes) -> Image:
        """The image decoded, or an ImageError naming what is wrong with the bytes."""
        info = images.check(data, self.max_bytes, self.max_pixels)
        buf = (ctypes.c_uint8 * len(data)).from_buffer_copy(data)
        bitmap = M.mtmd_helper_bitmap_init_from_buf(self.ctx, buf, len(data), False, self._opt)
        if not bitmap:
            raise MalformedImage(f"the {info.format.upper()} image could not be decoded (corrupted?)")
        return _identified(bitmap, info.format)

    def image_sizing(self) -> tuple[int, ImageGrid | None]:
        """How many prompt tokens (KV cells) an image takes, its projector's begin/end text included: (that count,
        None) for a projector that takes every image at one size; (the begin/end text's, its grid) for one that
        sizes each image (SIZED), the grid's count checked against mtmd's on made images of several sizes.
        ProjectorError if the count follows the image's size in a way not known here (not supported)."""
        meta = read_metadata(self.path)
        kind = meta.get("clip.vision.projector_type", meta.get("clip.projector_type", (0, "")))[1]
        grid = None
        if kind in SIZED:
            patch, merge = meta["clip.vision.patch_size"][1], meta.get("clip.vision.spatial_merge_size", (0, 2))[1]
            assert isinstance(patch, int) and isinstance(merge, int)  # GGUF's integer types read as ints
            align = patch * merge
            fewest, most = SIZED[kind]
            grid = ImageGrid(align, fewest * align * align, most * align * align)
        sizes = [*PROBE_SIZES, (1, 1)]
        if grid is not None:  # a side rounded half up, and an image scaled down into the most pixels
            side = math.isqrt(grid.max_pixels) + grid.align
            sizes += [(grid.align * 5 // 2, grid.align * 6), (side, side + grid.align)]
        counts = {}
        for width, height in sizes:
            n = self._probe(width, height)
            counts[width, height] = n - (grid_tokens(grid, width, height) if grid is not None else 0)
        if len(set(counts.values())) > 1:
            said = ", ".join(f"{w}x{h}: {n}" for (w, h), n in counts.items())
            what = "do not follow the grid counted for it" if grid is not None else "depend on their size"
            raise ProjectorError(f"the {kind} projector's images take tokens that {what} ({said}): not supported")
        return counts[PROBE_SIZES[0]], grid

    def _probe(self, width: int, height: int) -> int:
        """The KV cells a made (black) image of that size takes, mtmd's count."""
        rgb = (ctypes.c_uint8 * (width * height * 3))()
        image = _identified(M.mtmd_bitmap_init(width, height, rgb), "rgb")
        try:
            with self.tokenize([image], add_special=False) as chunks:
                self.image_rows = max([self.image_rows, *(c.n_tokens for c in chunks if c.is_image)])
                return chunks.n_tokens
        finally:
            image.close()

    def positions(self, chunk: Chunk) -> np.ndarray | None:
        """An image chunk's M-RoPE positions from its first one (0): int32 rows (time, row, column, unused), one
        column per embedding, in the order a llama_batch of embeddings takes them; None without M-RoPE (its
        embeddings take one position each, in order)."""
        if not self.mrope:
            return None
        out = (M.mtmd_decoder_pos * chunk.n_tokens)()
        M.mtmd_helper_image_get_decoder_pos(M.mtmd_input_chunk_get_tokens_image(chunk.ptr), 0, out)
        txyz = np.ctypeslib.as_array(ctypes.cast(out, ctypes.POINTER(ctypes.c_uint32)), (chunk.n_tokens, 4))
        return np.ascontiguousarray(txyz[:, [0, 2, 1, 3]].T).astype(np.int32)  # t, x, y, z -> t, y, x, z

    def batch_error(self, n_ubatch: int) -> str:
        """Why llama.cpp's batches of ``n_ubatch`` cannot take this projector's images ("": they can): the rows of a
        non-causal image must be one ubatch (llama_decode asserts it). After image_sizing."""
        if not self.non_causal or self.image_rows <= n_ubatch:
            return ""
        return (
            f"an image's {self.image_rows} rows see each other, so they are decoded in one batch, over this server's "
            f"{n_ubatch}: start it with --batch-size {self.image_rows} or more (a batch is at most 512)"
        )

    def tokenize(self, parts: Sequence[str | Image], add_special: bool = True, parse_special: bool = True) -> Chunks:
        """The prompt's chunks: each str part tokenized as text, each Image as its chunk."""
        texts, refs = [], []
        for p in parts:
            if isinstance(p, Image):
                refs.append(M.mtmd_input_part(None, p.bitmap))
            else:
                b = p.encode()
                texts.append(M.mtmd_input_text(b, len(b), add_special, parse_special))
                refs.append(M.mtmd_input_part(ctypes.pointer(texts[-1]), None))
        array = (ctypes.POINTER(M.mtmd_input_part) * len(refs))(*(ctypes.pointer(r) for r in refs))
        out = M.mtmd_input_chunks_init()
        rc = M.mtmd_tokenize_from_parts(self.ctx, out, array, len(refs), add_special)
        if rc != 0:
            M.mtmd_input_chunks_free(out)
            raise RuntimeError(f"mtmd could not tokenize the prompt (code {rc})")
        return Chunks(out)

    def encode(self, chunk: Chunk) -> np.ndarray:
        """An image chunk's embeddings: float32, one row of the text model's width per token (a copy)."""
        if not chunk.is_image:
            raise ValueError("only an image chunk is encoded")
        rc = M.mtmd_encode_chunk(self.ctx, chunk.ptr)
        if rc != 0:
            raise RuntimeError(f"mtmd could not encode the image (code {rc})")
        out = M.mtmd_get_output_embd(self.ctx)
        return np.ctypeslib.as_array(out, (chunk.n_tokens, self.n_embd)).copy()

    def close(self) -> None:
        if self.ctx:
            M.mtmd_free(self.ctx)
            self.ctx = None
