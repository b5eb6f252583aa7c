"""A request's images made ready beside the decode loop, and spliced into its prompt.

Each image of a Submit is checked again (cllm.core.images: the engine trusts no bytes it did not check), decoded,
tokenized by mtmd (an image chunk, with the text some projectors put around it) and encoded by the projector, all
in one worker thread: ctypes lets go of the GIL while mtmd runs, so the decode loop goes on meanwhile (a real
projector's encode takes seconds on a CPU). The request joins the scheduler once its images are ready; the thread
writes a byte to a pipe the idle engine waits on, so that it wakes for them.

In the sequence's prompt an image's positions hold placeholder ids (see placeholders): the prefix cache compares
prompts token by token, so a next turn about the same image matches its cells and another image never does, in the
streams, in host RAM and in --cache-dir's files alike, and the scheduler decodes the image's rows there.
"""

from __future__ import annotations

import hashlib
import os
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass

import numpy as np

from cllm.core.protocol import ImageInput, Submit
from engine_proc.sequence import ImageSpan
from engine_proc.vision.projector import Vision

# What one image becomes: its chunks in order, text tokens or an encoded image chunk.
Pieces = list["np.ndarray | Encoded"]
TOKEN_LIMIT = 1 << 31  # placeholders lie in [n_vocab, 2**31): int32 ids no tokenizer gives


@dataclass(frozen=True, slots=True)
class Encoded:
    """An image chunk made ready: its id, its rows (one a KV cell), the positions it takes and their M-RoPE
    components (Vision.positions; None: one position a row)."""

    image_id: str
    rows: np.ndarray
    n_pos: int
    pos: np.ndarray | None


def placeholders(image_id: str, n: int, n_vocab: int) -> np.ndarray:
    """An image's ``n`` positions as token ids: one per position, from the image's id (a hash of its pixels), out of
    the vocabulary's range, so no text matches them and two images share a position's id by chance at 1 in ~2**31
    (the scheduler reuses an image's cells only when all of its positions match: Sequence.image_edge)."""
    room = TOKEN_LIMIT - n_vocab
    ids = [
        int.from_bytes(hashlib.blake2b(f"{image_id}:{k}".encode(), digest_size=8).digest(), "little") % room
        for k in range(n)
    ]
    return np.array(ids, np.int64).astype(np.int32) + np.int32(n_vocab)


def splice(prompt: list[int], images: list[ImageInput], pieces: list[Pieces], n_vocab: int, non_causal: bool = False):
    """The prompt with each image's pieces before prompt[at]: (its token ids, placeholders included; its images,
    ``non_causal`` as the projector asks)."""
    parts: list[np.ndarray] = []
    spans: list[ImageSpan] = []
    n = prev = 0
    for image, its in zip(images, pieces):
        parts.append(np.array(prompt[prev : image.at], np.int32))
        n += image.at - prev
        prev = image.at
        for piece in its:
            if isinstance(piece, Encoded):
                k = len(piece.rows)
                parts.append(placeholders(piece.image_id, k, n_vocab))
                spans.append(ImageSpan(n, n + k, piece.rows, non_causal, piece.n_pos, piece.pos))
                n += k
            else:
                parts.append(piece)
                n += len(piece)
    parts.append(np.array(prompt[prev:], np.int32))
    return np.concatenate(parts), spans


class Encoder:
    """Image requests whose images are being made ready, in one worker thread."""

    def __init__(self, vision: Vision):
        self.vision = vision
        self._pool = ThreadPoolExecutor(1, thread_name_prefix="cllm-images")
        self.pending: dict[int, tuple[Submit, Future[list[Pieces]]]] = {}
        self.wake_r, self._wake_w = os.pipe()  # a byte for each request whose images are ready
        os.set_blocking(self.wake_r, False)
        os.set_blocking(self._wake_w, False)

    def add(self, req: Submit) -> None:
        future = self._pool.submit(self._prepare, req.images)
        future.add_done_callback(self._wake)
        self.pending[req.id] = (req, future)

    def _wake(self, _: Future | None) -> None:
        try:
            os.write(self._wake_w, b".")
        except BlockingIOError:  # bytes enough wait unread: the engine wakes for them
            pass

    def ready(self) -> bool:
        """Whether a request's images are ready (or failed): the engine has work."""
        return any(f.done() for _, f in self.pending.values())

    def armed(self) -> int:
        """The pipe for the idle engine to wait on, emptied of old wake-ups: readable once a request's images are
        ready (at once if one is)."""
        try:
            os.read(self.wake_r, 4096)
        except BlockingIOError:
            pass
        if self.ready():  # done since the engine last looked
            self._wake(None)
        return self.wake_r

    def take(self) -> list[tuple[Submit, list[Pieces] | BaseException]]:
        """The requests whose images are ready, with their pieces, or the error that ends them."""
        out: list[tuple[Submit, list[Pieces] | BaseException]] = []
        for id_, (req, future) in list(self.pending.items()):
            if future.done():
                del self.pending[id_]
                error = future.exception()
                out.append((req, error if error is not None else future.result()))
        return out

    def abort(self, ids: set[int]) -> None:
        for id_ in ids & self.pending.keys():
            self.pending.pop(id_)[1].cancel()  # one already running finishes, unheard

    def _prepare(self, images: list[ImageInput]) -> list[Pieces]:
        """In the worker: each image checked, decoded, tokenized and encoded; an ImageError says what is wrong."""
        out = []
        for item in images:
            image = self.vision.image(item.data)
            try:
                chunks = self.vision.tokenize([image], add_special=False)
            finally:
                image.close()
            with chunks:
                out.append([c.tokens.copy() if c.tokens is not None else self._encoded(c) for c in chunks])
        return out

    def _encoded(self, chunk) -> Encoded:
        assert chunk.image_id is not None
        return Encoded(chunk.image_id, self.vision.encode(chunk), chunk.n_pos, self.vision.positions(chunk))

    def close(self) -> None:
        self._pool.shutdown(wait=True, cancel_futures=True)
        os.close(self.wake_r)
        os.close(self._wake_w)
