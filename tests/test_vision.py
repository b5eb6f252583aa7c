"""engine_proc/vision/projector.py on llama.cpp: the embedded SmolLM2 with a made projector (perf/synth_mmproj.py).

The projector's weights are random, so these tests check the path (loading, chunk and position counts, image
ids, refusing bad bytes, encoding, decoding to a next token), not what the model says about an image.
"""

from __future__ import annotations

import ctypes
import os

import llama_cpp as L
import llama_cpp.mtmd_cpp as M
import numpy as np
import pytest

from cllm.core.images import ImageTooLarge, MalformedImage, UnsupportedImage
from cllm.core.model_file import resolve_model
from engine_proc.vision.projector import ProjectorError, Vision
from perf import image_files as F
from perf import synth_mmproj
from perf.vision_parity import prefill

USER = "<|im_start|>user\n"
ASK = "\nWhat is in this picture?<|im_end|>\n<|im_start|>assistant\n"
N_IMAGE = synth_mmproj.Tower().n_patches  # embeddings (and positions) an image takes with the made projector
# One thread: no barrier for threads to spin at when other programs hold the CPUs (docs/internals.md, Threads).
THREADS = 1


@pytest.fixture(scope="module")
def model():
    L.llama_backend_init()
    m = L.llama_model_load_from_file(resolve_model(None).encode(), L.llama_model_default_params())
    assert m
    yield m
    L.llama_model_free(m)


@pytest.fixture(scope="module")
def vision(model, mmproj):
    v = Vision(model, mmproj, n_threads=THREADS)
    yield v
    v.close()


@pytest.fixture
def ctx(model):
    p = L.llama_context_default_params()
    p.n_ctx, p.n_batch, p.n_ubatch, p.n_seq_max = 512, 256, 256, 2
    p.n_threads = p.n_threads_batch = THREADS
    c = L.llama_init_from_model(model, p)
    assert c
    yield c
    L.llama_free(c)


def test_projector_matches_the_text_model(model, vision, mmproj):
    assert vision.n_embd == L.llama_model_n_embd(model) == 576
    assert M.mtmd_support_vision(vision.ctx)
    assert 100_000 < os.path.getsize(mmproj) < 2_000_000


def test_projector_of_another_width_is_refused(model, tmp_path):
    other = synth_mmproj.write(str(tmp_path / "wide.gguf"), 640)
    with pytest.raises(ProjectorError, match="n_embd = 640"):
        Vision(model, other, n_threads=THREADS)
    with pytest.raises(ProjectorError, match="could not load"):
        Vision(model, resolve_model(None), n_threads=THREADS)  # a text model is no projector


def test_chunks_and_positions(model, vision):
    image = vision.image(F.png(F.picture(64, 48)))
    try:
        assert (image.width, image.height, image.format) == (64, 48, "png")
        with vision.tokenize([USER, image, ASK]) as chunks:
            assert [c.is_image for c in chunks] == [False, True, False]
            text0, img, text1 = chunks
            assert img.n_tokens == img.n_pos == N_IMAGE
            assert img.image_id == image.id
            vocab = L.llama_model_get_vocab(model)
            for chunk, text in ((text0, USER), (text1, ASK)):
                assert chunk.n_tokens == chunk.n_pos == len(chunk.tokens)
                assert chunk.tokens.tolist() == _tokenize(vocab, text)
            assert chunks.n_pos == text0.n_pos + N_IMAGE + text1.n_pos
        with vision.tokenize([USER, image, "and", image, ASK]) as two:
            assert sum(c.n_pos for c in two if c.is_image) == 2 * N_IMAGE
        # a client's text that spells mtmd's media marker stays text: images come only from image parts
        marker = M.mtmd_default_marker().decode()
        with vision.tokenize([USER + marker + ASK]) as typed:
            assert [c.is_image for c in typed] == [False]
    finally:
        image.close()


def test_parts_tokenize_as_llama_servers_markers_do(vision):
    """llama-server tokenizes a prompt string with mtmd's marker where the image goes (mtmd_tokenize, special
    tokens added and parsed); Vision.tokenize's parts give the same chunks, so the same prompt-token count."""
    image = vision.image(F.png(F.picture(seed=7)))
    marker = M.mtmd_default_marker().decode()
    text = f"{USER}{marker}{ASK}".encode()
    served = M.mtmd_input_chunks_init()
    try:
        inp = M.mtmd_input_text(text, len(text), True, True)
        bitmaps = (M.mtmd_bitmap_p_ctypes * 1)(image.bitmap)
        assert M.mtmd_tokenize(vision.ctx, served, ctypes.byref(inp), bitmaps, 1) == 0
        with vision.tokenize([USER, image, ASK]) as ours:
            theirs = [M.mtmd_input_chunks_get(served, i) for i in range(M.mtmd_input_chunks_size(served))]
            assert len(theirs) == len(ours) == 3
            for mine, chunk in zip(ours, theirs):
                assert mine.n_tokens == M.mtmd_input_chunk_get_n_tokens(chunk)
                assert mine.n_pos == M.mtmd_input_chunk_get_n_pos(chunk)
                if mine.is_image:
                    assert M.mtmd_input_chunk_get_id(chunk).decode() == mine.image_id
                else:
                    n = ctypes.c_size_t()
                    tokens = M.mtmd_input_chunk_get_tokens_text(chunk, ctypes.byref(n))
                    assert list(tokens[: n.value]) == mine.tokens.tolist()
    finally:
        M.mtmd_input_chunks_free(served)
        image.close()


def test_image_id_is_the_pixels(vision):
    rgb = F.picture(64, 48, seed=1)
    ids = []
    for data in (F.png(rgb, level=1), F.png(rgb, level=9), F.bmp(rgb)):
        image = vision.image(data)
        ids.append(image.id)
        image.close()
    assert F.png(rgb, level=1) != F.png(rgb, level=9)
    assert len(set(ids)) == 1  # other bytes, same pixels: the same image
    changed = rgb.copy()
    changed[-1, -1, 2] ^= 1  # the last byte: every pixel counts
    other = vision.image(F.png(changed))
    assert other.id != ids[0]
    other.close()


def test_gif_decodes_to_the_same_pixels_as_a_png(vision):
    rng = np.random.default_rng(6)
    palette = rng.integers(0, 256, (256, 3), dtype=np.uint8)
    indices = rng.integers(0, 256, (48, 64), dtype=np.uint8)
    gif, png = vision.image(F.gif(indices, palette)), vision.image(F.png(palette[indices]))
    try:
        assert (gif.width, gif.height, gif.format, png.format) == (64, 48, "gif", "png")
        assert gif.id == png.id
    finally:
        gif.close()
        png.close()


def test_jpeg_decodes(vision):
    rgb = F.picture(64, 48, seed=2)
    image = vision.image(F.jpeg(rgb))
    try:
        assert (image.width, image.height, image.format) == (64, 48, "jpeg")
        pixels = np.frombuffer(ctypes.string_at(M.mtmd_bitmap_get_data(image.bitmap), 64 * 48 * 3), np.uint8)
        # flat blocks, quantized by 1: within a few steps of the colours written (YCbCr rounding)
        assert np.abs(pixels.reshape(48, 64, 3).astype(int) - rgb).max() <= 3
        with vision.tokenize([USER, image, ASK]) as chunks:
            assert chunks[1].n_tokens == N_IMAGE
    finally:
        image.close()


def test_bad_bytes_refused_and_the_next_image_decodes(vision):
    good = F.png(F.picture())
    with pytest.raises(UnsupportedImage, match="not an image"):
        vision.image(b"this is not an image at all")
    with pytest.raises(UnsupportedImage, match="WebP"):
        vision.image(b"RIFF\x24\x00\x00\x00WEBPVP8 " + bytes(24))
    with pytest.raises(MalformedImage, match="truncated"):
        vision.image(good[:-30])
    with pytest.raises(ImageTooLarge, match="pixels"):
        vision.image(F.png_raw(60_000, 60_000, b"\x78\x9c\x03\x00\x00\x00\x00\x01"))
    # well-formed chunks around data that does not inflate: passes the checks, the decoder refuses it
    with pytest.raises(MalformedImage, match="could not be decoded"):
        vision.image(F.png_raw(64, 48, b"\x00garbage, not a zlib stream"))
    image = vision.image(good)
    assert image.width == 64
    image.close()


def test_undecodable_bytes_never_reach_ffmpeg(vision, tmp_path, monkeypatch):
    """mtmd's helper tries bytes stb_image cannot read as video, with ffmpeg: never with a client's bytes."""
    ran = tmp_path / "ran"
    for name in ("ffmpeg", "ffprobe"):
        tool = tmp_path / name
        tool.write_text(f"#!/bin/sh\necho {name} >> {ran}\nexit 1\n")
        tool.chmod(0o755)
    monkeypatch.setenv("PATH", f"{tmp_path}{os.pathsep}{os.environ['PATH']}")
    with pytest.raises(MalformedImage, match="could not be decoded"):
        vision.image(F.png_raw(64, 48, b"\x00garbage, not a zlib stream"))
    assert not ran.exists()


def test_prompt_with_an_image_decodes_to_a_next_token(model, vision, ctx):
    """Text chunks through llama_decode, the image through encode + EmbdBatch, into sequence 0; the same prompt
    through mtmd's own helper into sequence 1: the same next-token logits. Another image: other logits."""
    n_vocab = L.llama_vocab_n_tokens(L.llama_model_get_vocab(model))
    a, b = vision.image(F.png(F.picture(seed=3))), vision.image(F.png(F.picture(seed=4)))
    try:
        with vision.tokenize([USER, a, ASK]) as chunks:
            ours = _run(vision, ctx, chunks, seq=0)
            assert 0 <= int(np.argmax(ours)) < n_vocab and np.isfinite(ours).all()
            new_n_past = L.llama_pos()
            rc = M.mtmd_helper_eval_chunks(vision.ctx, ctx, chunks._ptr, 0, 1, 256, True, ctypes.byref(new_n_past))
            assert rc == 0 and new_n_past.value == chunks.n_pos
            helper = _logits(ctx, n_vocab)
        np.testing.assert_array_equal(ours, helper)  # the same ubatches on one thread: bit for bit
        L.llama_memory_seq_rm(L.llama_get_memory(ctx), 0, -1, -1)
        with vision.tokenize([USER, b, ASK]) as chunks:
            other = _run(vision, ctx, chunks, seq=0)
        assert np.abs(other - ours).max() > 0.01
    finally:
        a.close()
        b.close()


def _tokenize(vocab, text: str) -> list[int]:
    data = text.encode()
    out = (L.llama_token * (len(data) + 8))()
    n = L.llama_tokenize(vocab, data, len(data), out, len(out), False, True)
    return list(out[:n])


def _run(vision: Vision, ctx, chunks, seq: int) -> np.ndarray:
    """Decode the chunks into sequence ``seq`` from position 0; the last position's logits."""
    prefill(vision, ctx, chunks, seq)
    return _logits(ctx, L.llama_vocab_n_tokens(L.llama_model_get_vocab(L.llama_get_model(ctx))))


def _logits(ctx, n_vocab: int) -> np.ndarray:
    return np.ctypeslib.as_array(L.llama_get_logits_ith(ctx, -1), (n_vocab,)).copy()
