"""Qwen2-VL-style models (issue 48): M-RoPE positions, and images whose token count follows their size, on a made
pair (perf/synth_qwen2vl.py: a tiny `qwen2vl` text model and a `qwen2vl_merger` projector, random weights: the
path is tested, never what the model says about an image).

An image of w x h pixels takes (w/16)*(h/16) KV cells here, rounded as llama.cpp rounds, but only max(w, h)/16
positions, and text after it goes on from there. The served engine's greedy text equals mtmd's own eval path
(mtmd_helper_eval_chunks through the bindings) for two image sizes of different counts, its prompt tokens equal
mtmd's and llama-server's, a second turn reuses the image's cells from the prefix cache and still says what a
fresh prefill says, and an image too big for a sequence is refused with its count, before it is encoded.
"""

from __future__ import annotations

import base64
import ctypes
import random
from collections.abc import Iterator

import httpx
import llama_cpp as L
import llama_cpp.mtmd_cpp as M
import numpy as np
import pytest

from cllm.core.image_grid import grid_tokens
from cllm.core.protocol import ImageGrid
from engine_proc.vision.projector import Vision
from perf import image_files, synth_qwen2vl
from tests.conftest import Server, client_of, start_server, wait_until
from tests.llama_server import llama_server_on
from tests.test_metrics import scrape, value

MARKER = "<__media__>"
QUESTION = "<|im_start|>user\n" + MARKER + "\nWhat is in this picture?<|im_end|>\n<|im_start|>assistant\n"
N_PREDICT = 12
# A second turn's: another reply than the one generated, so that the first turn's cells past its prompt are cut
REPLY = "A picture.<|im_end|>\n<|im_start|>user\nAnd its colours?<|im_end|>\n<|im_start|>assistant\n"
# Two sizes that take different counts: 4 x 3 tokens in 4 positions, 3 x 6 tokens (40 / 16 = 2.5 rounds up) in 6.
WIDE = image_files.png(image_files.picture(64, 48, seed=5))
TALL = image_files.png(image_files.picture(40, 96, seed=6))
OTHER_WIDE = image_files.png(image_files.picture(64, 48, seed=7))
ALIGN = synth_qwen2vl.ALIGN
GRID = ImageGrid(ALIGN, 8 * ALIGN * ALIGN, 4096 * ALIGN * ALIGN)  # clip.cpp's 8 to 4096 tokens for the family


def b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


@pytest.fixture(scope="module")
def pair(tmp_path_factory) -> tuple[str, str]:
    """The made text model and projector: their files."""
    return synth_qwen2vl.write(str(tmp_path_factory.mktemp("qwen2vl")))


class Reference:
    """mtmd's own path in this process: its tokenizer, and mtmd_helper_eval_chunks to prefill a prompt."""

    def __init__(self, model_path: str, mmproj: str):
        L.llama_backend_init()
        self.model = L.llama_model_load_from_file(model_path.encode(), L.llama_model_default_params())
        self.vocab = L.llama_model_get_vocab(self.model)
        self.vision = Vision(self.model, mmproj, n_threads=1)

    def count(self, width: int, height: int) -> tuple[int, int]:
        """(KV cells, positions) of a made image of that size alone, as mtmd tokenizes it."""
        rgb = (ctypes.c_uint8 * (width * height * 3))()
        bitmap = M.mtmd_bitmap_init(width, height, rgb)
        text = M.mtmd_input_text(MARKER.encode(), len(MARKER), False, True)
        out = M.mtmd_input_chunks_init()
        try:
            assert M.mtmd_tokenize(self.vision.ctx, out, ctypes.byref(text), (ctypes.c_void_p * 1)(bitmap), 1) == 0
            (image,) = [M.mtmd_input_chunks_get(out, i) for i in range(M.mtmd_input_chunks_size(out))][1:2]
            return M.mtmd_input_chunk_get_n_tokens(image), M.mtmd_input_chunk_get_n_pos(image)
        finally:
            M.mtmd_input_chunks_free(out)
            M.mtmd_bitmap_free(bitmap)

    def greedy(self, prompt: str, png: bytes, n: int) -> tuple[int, str]:
        """(the prompt's tokens as llama-server counts them, the greedy text of n tokens) through mtmd's eval."""
        p = L.llama_context_default_params()
        p.n_ctx, p.n_batch, p.n_ubatch, p.n_threads, p.n_threads_batch = 2048, 512, 512, 1, 1
        ctx = L.llama_init_from_model(self.model, p)
        image = self.vision.image(png)
        before, after = prompt.split(MARKER)
        chunks = self.vision.tokenize([before, image, after])
        one = L.llama_batch_init(1, 0, 1)
        try:
            n_past = L.llama_pos(0)
            assert (
                M.mtmd_helper_eval_chunks(self.vision.ctx, ctx, chunks._ptr, 0, 0, 512, True, ctypes.byref(n_past)) == 0
            )
            pos, out = n_past.value, b""
            n_vocab = L.llama_vocab_n_tokens(self.vocab)
            for _ in range(n):
                t = int(np.ctypeslib.as_array(L.llama_get_logits_ith(ctx, -1), (n_vocab,)).argmax())
                if L.llama_vocab_is_eog(self.vocab, t):
                    break
                buf = ctypes.create_string_buffer(64)
                k = L.llama_token_to_piece(self.vocab, t, buf, len(buf), 0, False)
                out += buf.raw[:k]
                one.token[0], one.pos[0], one.n_seq_id[0], one.logits[0] = t, pos, 1, True
                one.seq_id[0][0], one.n_tokens = 0, 1
                assert L.llama_decode(ctx, one) == 0
                pos += 1
            return chunks.n_tokens, out.decode(errors="replace")
        finally:
            L.llama_batch_free(one)
            chunks.close()
            image.close()
            L.llama_free(ctx)

    def close(self) -> None:
        self.vision.close()
        L.llama_model_free(self.model)


@pytest.fixture(scope="module")
def reference(pair) -> Iterator[Reference]:
    ref = Reference(*pair)
    yield ref
    ref.close()


@pytest.fixture(scope="module")
def served(pair) -> Iterator[Server]:
    model, mmproj = pair
    # 2 sequences of 1024 cells, 128 tokens a step (a large image's rows go over several); one thread: none spins
    # at a barrier on a busy machine
    with start_server(
        "--model",
        model,
        "--mmproj",
        mmproj,
        "--parallel",
        "2",
        "--ctx-size",
        "2048",
        "--threads",
        "1",
        "--batch-size",
        "128",
    ) as srv:
        yield srv


http = client_of("served")


@pytest.fixture(scope="module")
def theirs(pair, tmp_path_factory) -> Iterator[httpx.Client]:
    """llama-server on the same pair, its media marker pinned for /completion's prompt."""
    args = ("--mmproj", pair[1], "--parallel", "1", "--ctx-size", "2048")
    with llama_server_on(pair[0], tmp_path_factory, *args, env={"LLAMA_MEDIA_MARKER": MARKER}) as c:
        yield c


def completion(http: httpx.Client, prompt: str, png: bytes, n: int = N_PREDICT) -> dict:
    body = {"prompt": {"prompt_string": prompt, "multimodal_data": [b64(png)]}, "n_predict": n, "temperature": 0}
    r = http.post("/completion", json=body)
    assert r.status_code == 200, r.text
    return r.json()


# ---- counts -------------------------------------------------------------------------------------------------------


def test_the_grid_counts_an_image_as_mtmd_does(reference):
    """The frontend's count from an image's size (cllm/core/image_grid.py) is mtmd's, rounding and both bounds
    included, and an image takes max(columns, rows) positions."""
    rng = random.Random(3)
    sizes = [(1, 1), (40, 96), (64, 48), (24, 8), (1, 600), (2000, 1500)]
    sizes += [(rng.randint(1, 300), rng.randint(1, 300)) for _ in range(40)]
    for width, height in sizes:
        cells, positions = reference.count(width, height)
        assert cells == grid_tokens(GRID, width, height), (width, height)
        if (width, height) == (40, 96):
            assert (cells, positions) == (3 * 6, 6)
    assert reference.count(64, 48) == (12, 4)


def test_the_engine_reports_the_grid(http, pair):
    info = http.get("/model/info").json()["data"]
    assert info["mmproj"] == pair[1]
    assert info["image_grid"] == {"align": GRID.align, "min_pixels": GRID.min_pixels, "max_pixels": GRID.max_pixels}
    assert info["image_tokens"] == 2  # <|vision_start|> and <|vision_end|> around every image


# ---- the served engine against mtmd and llama-server ---------------------------------------------------------------


@pytest.mark.parametrize("png", [WIDE, TALL], ids=["64x48", "40x96"])
def test_greedy_text_and_prompt_tokens_are_mtmds(http, reference, png):
    counted, text = reference.greedy(QUESTION, png, N_PREDICT)
    ours = completion(http, QUESTION, png)
    assert ours["tokens_evaluated"] == counted
    assert ours["content"] == text and len(text) > N_PREDICT  # greedy: mtmd's text, not an empty one


def test_an_image_decoded_over_several_steps_is_mtmds(http, reference):
    """20 x 15 tokens: 300 rows over three steps of 128, each piece at the image's own M-RoPE positions."""
    photo = image_files.png(image_files.picture(320, 240, seed=8))
    counted, text = reference.greedy(QUESTION, photo, N_PREDICT)
    ours = completion(http, QUESTION, photo)
    assert ours["tokens_evaluated"] == counted > 300
    assert ours["content"] == text


def test_prompt_tokens_and_text_are_llama_servers(http, theirs):
    for png in (WIDE, TALL):
        ours, their = completion(http, QUESTION, png), completion(theirs, QUESTION, png)
        assert (ours["tokens_evaluated"], ours["content"]) == (their["tokens_evaluated"], their["content"])
        content = [
            {"type": "image_url", "image_url": {"url": "data:image/png;base64," + b64(png)}},
            {"type": "text", "text": "What is this?"},
        ]
        body = {"messages": [{"role": "user", "content": content}], "max_tokens": 1, "temperature": 0}
        counts = [s.post("/v1/chat/completions", json=body).json()["usage"]["prompt_tokens"] for s in (http, theirs)]
        assert counts[0] == counts[1]


def test_a_second_turn_reuses_the_image_and_says_what_a_fresh_prefill_says(http, reference):
    first = completion(http, QUESTION, WIDE, 8)
    turn = QUESTION + REPLY  # not the reply generated: its cached cells must be cut, at their positions
    counted, text = reference.greedy(turn, WIDE, N_PREDICT)
    second = completion(http, turn, WIDE)
    assert second["tokens_evaluated"] == counted
    assert second["timings"]["prompt_n"] <= counted - first["tokens_evaluated"] + 2  # the first turn's cells reused
    assert second["content"] == text  # at the positions a fresh prefill gives them
    other = completion(http, turn, OTHER_WIDE)  # the same size: the same count, but none of the image's cells
    assert other["tokens_evaluated"] == counted and other["timings"]["prompt_n"] >= counted - 6


def test_an_image_too_big_for_a_sequence_is_refused_with_its_count(http):
    big = image_files.png(image_files.picture(1000, 1000, seed=9))  # 63 x 63 tokens: over a sequence's 1024 cells
    body = {
        "messages": [
            {
                "role": "user",
                "content": [
                    {"type": "image_url", "image_url": {"url": "data:image/png;base64," + b64(big)}},
                    {"type": "text", "text": "What is this?"},
                ],
            }
        ],
        "max_tokens": 1,
    }
    r = http.post("/v1/chat/completions", json=body)
    assert r.status_code == 400 and f"its images take {63 * 63 + 2}" in r.text, r.text
    assert completion(http, QUESTION, WIDE, 1)["tokens_evaluated"] > 12  # and it goes on serving


def test_a_conversation_goes_on_after_a_restart_from_the_files(pair, reference, tmp_path):
    """--cache-dir keeps an M-RoPE image's cells with their positions: the next turn after a restart reads the first
    turn's from the file and says what a fresh prefill says."""
    model, mmproj = pair
    args = ("--model", model, "--mmproj", mmproj, "--parallel", "1", "--ctx-size", "1024", "--threads", "1")
    args += ("--cache-dir", str(tmp_path / "kv"))
    system = "<|im_start|>system\n" + "You describe pictures carefully and briefly. " * 12 + "<|im_end|>\n"
    with start_server(*args) as srv, srv.client() as http:
        first = completion(http, system + QUESTION, TALL, 8)
    turn = system + QUESTION + REPLY
    counted, text = reference.greedy(turn, TALL, N_PREDICT)
    with start_server(*args) as srv, srv.client() as http:
        second = completion(http, turn, TALL)
    assert second["timings"]["prompt_n"] <= counted - first["tokens_evaluated"] + 2  # the first turn from the file
    assert second["content"] == text


def test_every_door_counts_an_image_by_its_size(served):
    """The chat layer's count (what Anthropic's count_tokens and every door's usage give): the taller image takes
    6 tokens more than the wider one (18 against 12), in Anthropic's count and in OpenAI's usage alike."""
    import anthropic
    import openai

    def blocks(png: bytes) -> list:
        source = {"type": "base64", "media_type": "image/png", "data": b64(png)}
        return [{"type": "image", "source": source}, {"type": "text", "text": "What is this?"}]

    with anthropic.Anthropic(base_url=served.url, api_key="x", max_retries=0) as claude:
        counts = [
            claude.messages.count_tokens(model="m", messages=[{"role": "user", "content": blocks(png)}]).input_tokens
            for png in (WIDE, TALL)
        ]
    assert counts[1] - counts[0] == 18 - 12
    with openai.OpenAI(base_url=served.url + "/v1", api_key="x", max_retries=0) as oai:
        for png, counted in zip((WIDE, TALL), counts):
            content = [
                {"type": "image_url", "image_url": {"url": "data:image/png;base64," + b64(png)}},
                {"type": "text", "text": "What is this?"},
            ]
            r = oai.chat.completions.create(model="m", messages=[{"role": "user", "content": content}], max_tokens=1)
            assert r.usage.prompt_tokens == counted


def test_steady_steps_park_image_sequences_at_their_positions(pair, reference):
    """--steady-steps on: 8 image requests of different lengths decode together; each one that finishes stays parked
    in the batch, its last cell dropped at its M-RoPE position and decoded there again, and every request still says
    what mtmd's eval says."""
    from concurrent.futures import ThreadPoolExecutor

    model, mmproj = pair
    args = ("--model", model, "--mmproj", mmproj, "--parallel", "8", "--ctx-size", "2048", "--threads", "1")
    images = [WIDE, TALL] * 4
    lengths = [4, 6, 8, 10, 12, 14, 16, 18]  # a wave needs 8 decoding sequences (Scheduler.wave)
    with start_server(*args, "--steady-steps", "on") as srv, srv.client() as http:
        with ThreadPoolExecutor(len(lengths)) as pool:
            out = list(pool.map(lambda i: completion(http, QUESTION, images[i], lengths[i]), range(len(lengths))))
    for i, got in enumerate(out):
        assert got["content"] == reference.greedy(QUESTION, images[i], lengths[i])[1], i


def test_a_conversation_comes_back_from_host_ram(pair, reference):
    """One stream: a text request in between pushes the image conversation's cells (over the 128 host RAM keeps) out
    to host RAM, where its next turn finds them (restored, then cut at the first prompt's M-RoPE position) and says
    what a fresh prefill says."""
    model, mmproj = pair
    args = ("--model", model, "--mmproj", mmproj, "--parallel", "1", "--ctx-size", "1024", "--threads", "1")
    system = "<|im_start|>system\n" + "You describe pictures carefully and briefly. " * 20 + "<|im_end|>\n"
    turn = system + QUESTION + REPLY
    counted, text = reference.greedy(turn, WIDE, N_PREDICT)
    with start_server(*args) as srv, srv.client() as http:
        first = completion(http, system + QUESTION, WIDE, 8)
        r = http.post("/completion", json={"prompt": "Apples and rivers. " * 40, "n_predict": 2})
        assert r.status_code == 200 and r.json()["timings"]["prompt_n"] > 100  # it took the stream
        second = completion(http, turn, WIDE)
        restored = lambda: value(scrape(http), "cllm_prefix_cache_restored_total") >= 1  # noqa: E731
        assert wait_until(restored, 10)  # served from host RAM (the engine's figures come a moment later)
    assert second["timings"]["prompt_n"] <= counted - first["tokens_evaluated"] + 2  # the first turn's cells
    assert second["content"] == text


@pytest.mark.parametrize(
    "arch, kind, size",
    [("qwen2vl", "qwen2.5vl_merger", (320, 240)), ("qwen3vl", "qwen3vl_merger", (40, 96))],
    ids=["qwen2.5-vl", "qwen3-vl"],
)
def test_qwen25_and_qwen3_vl_are_served_as_mtmd_evaluates_them(tmp_path, arch, kind, size):
    """Qwen2.5-VL's projector (window attention in the tower: a 320 x 240 image is 20 x 15 tokens in windows of
    7 x 7) on the qwen2vl text model, and Qwen3-VL's pair (interleaved M-RoPE, q/k norms; a tower with learned
    positions and fused qkv): the image counts and the greedy text are mtmd's eval's."""
    model = synth_qwen2vl.write_text(str(tmp_path / f"{arch}.gguf"), synth_qwen2vl.Text(), arch=arch)
    mmproj = synth_qwen2vl.write_projector(str(tmp_path / "mmproj.gguf"), 64, kind=kind)
    photo = image_files.png(image_files.picture(*size, seed=8))
    ref = Reference(model, mmproj)
    try:
        counted, text = ref.greedy(QUESTION, photo, N_PREDICT)
    finally:
        ref.close()
    args = ("--model", model, "--mmproj", mmproj, "--parallel", "1", "--ctx-size", "1024", "--threads", "1")
    with start_server(*args) as srv, srv.client() as http:
        assert http.get("/model/info").json()["data"]["image_grid"]["align"] == ALIGN
        ours = completion(http, QUESTION, photo)
    assert ours["tokens_evaluated"] == counted == grid_tokens(GRID, *size) + 2 + 16  # the image, begin/end, text
    assert ours["content"] == text


def test_exact_mode_reuses_whole_blocks_past_an_image(pair, reference):
    """--prefix-cache-exact: prompt chunks end at 128-cell blocks, which after an M-RoPE image lie at positions 8
    fewer than their cells; the second turn reuses the first's whole block, the image in it, and says what a fresh
    prefill says."""
    model, mmproj = pair
    args = ("--model", model, "--mmproj", mmproj, "--parallel", "1", "--ctx-size", "1024", "--threads", "1")
    question = QUESTION.replace("What is in this picture?", "Describe it, then its colours. " * 25)
    turn = question + REPLY
    counted, text = reference.greedy(turn, WIDE, N_PREDICT)
    with start_server(*args, "--prefix-cache-exact") as srv, srv.client() as http:
        first = completion(http, question, WIDE, 8)
        assert 128 < first["tokens_evaluated"] < 256 and first["content"] == reference.greedy(question, WIDE, 8)[1]
        second = completion(http, turn, WIDE)
    assert second["tokens_evaluated"] == counted
    assert second["timings"]["prompt_n"] == counted - 128  # the first block, the image in it, reused
    assert second["content"] == text
