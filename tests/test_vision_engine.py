"""Images in the engine (issue 48), on the real llama.cpp: the embedded SmolLM2 with a made projector
(perf/synth_mmproj.py, random weights: the path is tested, not what the model says about an image).

Loading: `--mmproj` makes the engine load the projector and count the positions one image takes; a projector
that cannot serve stops the engine with llama.cpp's reason. The step: an image request decodes as mtmd's own eval
path does, beside text requests; a malformed image ends its request alone.
"""

from __future__ import annotations

import ctypes
import select
import subprocess
import sys
import time

import llama_cpp as L
import llama_cpp.mtmd_cpp as M
import msgspec
import numpy as np
import pytest

from cllm.core.config import ServeConfig
from cllm.core.images import MAX_REQUEST_BYTES
from cllm.core.launch import REQUEST_RING_BYTES, request_ring_bytes
from cllm.core.model_file import resolve_model
from cllm.core.protocol import ImageInput, SamplingParams, SeqOutput, Submit
from engine_proc.engine import LLMEngine
from engine_proc.run.model_runner import ModelLoadError
from perf import image_files as F
from perf import synth_mmproj
from perf.vision_parity import prefill
from tests.conftest import ROOT

N_IMAGE = synth_mmproj.Tower().n_patches  # positions an image takes with the made projector (it adds no text)
USER = "<|im_start|>user\n"
ASK = "\nWhat is in this picture?<|im_end|>\n<|im_start|>assistant\n"
GREEDY = SamplingParams(max_tokens=12, temperature=0.0)
SEEN = SamplingParams(max_tokens=12, temperature=0.0, logprobs=2)  # GREEDY with each token's logprobs
THREADS = 1  # no barrier for threads to spin at when other programs hold the CPUs (docs/internals.md: Threads)


def test_the_engine_loads_the_projector_and_counts_an_images_positions(mmproj):
    engine = LLMEngine(resolve_model(None), ServeConfig(parallel=2, ctx_size=1024, mmproj=mmproj))
    try:
        assert (engine.info.mmproj, engine.info.image_tokens) == (mmproj, N_IMAGE)
        image = engine.vision.image(F.png(F.picture(200, 100)))
        try:
            with engine.vision.tokenize([image], add_special=False) as chunks:
                assert chunks.n_pos == engine.info.image_tokens  # a real image takes what the probe counted
        finally:
            image.close()
    finally:
        engine.close()


def test_a_text_models_engine_loads_nothing_of_vision():
    """engine_proc/vision/ is optional: a text model's engine, made and stepped in a fresh interpreter, imports
    none of it (tests/unit/test_engine_layers.py reads the same from the source's imports)."""
    code = (
        "import sys\n"
        "from cllm.core.config import ServeConfig\n"
        "from cllm.core.model_file import resolve_model\n"
        "from cllm.core.protocol import SamplingParams, Submit\n"
        "from engine_proc.engine import LLMEngine\n"
        "engine = LLMEngine(resolve_model(None), ServeConfig(parallel=1, ctx_size=512, threads=1))\n"
        "engine.add(Submit(1, [1, 2, 3], SamplingParams(max_tokens=2, temperature=0.0)))\n"
        "while engine.has_work():\n"
        "    list(engine.step())\n"
        "engine.close()\n"
        "print(engine.generated_tokens, sorted(m for m in sys.modules if m.startswith('engine_proc.vision')))\n"
    )
    run = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stderr
    assert run.stdout.splitlines()[-1] == "2 []"


def test_a_projector_that_cannot_serve_stops_the_engine(tmp_path):
    wide = synth_mmproj.write(str(tmp_path / "wide.gguf"), 640)
    with pytest.raises(ModelLoadError, match="n_embd = 640"):
        LLMEngine(resolve_model(None), ServeConfig(parallel=2, ctx_size=1024, mmproj=wide))


def test_the_request_ring_has_room_for_images_only_with_a_projector(mmproj):
    assert request_ring_bytes(ServeConfig()) == REQUEST_RING_BYTES
    assert request_ring_bytes(ServeConfig(mmproj=mmproj)) > REQUEST_RING_BYTES + MAX_REQUEST_BYTES


@pytest.fixture(scope="module")
def engine(mmproj):
    eng = LLMEngine(resolve_model(None), ServeConfig(parallel=4, ctx_size=2048, threads=THREADS, mmproj=mmproj))
    try:
        yield eng
    finally:
        eng.close()


def run(engine: LLMEngine, reqs: list[Submit], timeout: float = 120) -> dict[int, list[SeqOutput]]:
    """Submit the requests and step until each has finished; every output of each."""
    outs: dict[int, list[SeqOutput]] = {r.id: [] for r in reqs}
    for r in reqs:
        if (refused := engine.add(r)) is not None:
            outs[r.id].append(refused)
    deadline = time.monotonic() + timeout
    while not all(o and o[-1].finish for o in outs.values()):
        assert time.monotonic() < deadline, "the engine did not finish the requests"
        if engine.has_work():
            for result in engine.step():
                for o in result.outputs:
                    outs[o.id].append(o)
        else:  # images being encoded: the idle engine waits for them as engine_proc/main.py does
            select.select(engine.wake_fds(), [], [], 1.0)
    return outs


def tokens(outs: list[SeqOutput]) -> list[int]:
    return [o.token for o in outs if o.token is not None]


def prompt(vision, data: bytes) -> tuple[list[int], int, list]:
    """USER, the image, ASK as mtmd tokenizes them: (the text tokens, where the image goes, the chunks to close)."""
    image = vision.image(data)
    try:
        chunks = vision.tokenize([USER, image, ASK])
    finally:
        image.close()
    (before, img, after) = chunks
    assert img.is_image and not before.is_image and not after.is_image
    return before.tokens.tolist() + after.tokens.tolist(), len(before.tokens), chunks


def reference(engine: LLMEngine, chunks, n: int, causal: bool = False) -> list[int]:
    """The greedy tokens after the chunks through mtmd's own path (mtmd_helper_eval_chunks) in a context of its own;
    ``causal``: through Vision + EmbdBatch's decode, the causal mask left on whatever the projector asks."""
    model, vision = engine.runner.model, engine.vision
    assert vision is not None
    vocab = L.llama_model_get_vocab(model)
    p = L.llama_context_default_params()
    p.n_ctx, p.n_batch, p.n_ubatch = 512, 512, 512
    p.n_threads = p.n_threads_batch = THREADS
    ctx = L.llama_init_from_model(model, p)
    batch = L.llama_batch_init(1, 0, 1)
    try:
        n_past = L.llama_pos()
        # The helper asks no logits of an image's last row: then Vision + EmbdBatch's decode (bit for bit the
        # helper's logits: tests/test_vision.py)
        if causal or chunks[-1].is_image:
            n_past.value = prefill(vision, ctx, chunks)
        else:
            assert M.mtmd_helper_eval_chunks(vision.ctx, ctx, chunks._ptr, 0, 0, 512, True, ctypes.byref(n_past)) == 0
        out: list[int] = []
        for _ in range(n):
            logits = np.ctypeslib.as_array(L.llama_get_logits_ith(ctx, -1), (L.llama_vocab_n_tokens(vocab),))
            t = int(np.argmax(logits))
            if L.llama_vocab_is_eog(vocab, t):
                break
            out.append(t)
            batch.token[0], batch.pos[0], batch.n_seq_id[0], batch.logits[0] = t, n_past.value, 1, True
            batch.seq_id[0][0] = 0
            batch.n_tokens = 1
            assert L.llama_decode(ctx, batch) == 0
            n_past.value += 1
        return out
    finally:
        L.llama_batch_free(batch)
        L.llama_free(ctx)


def test_an_image_request_decodes_as_mtmds_own_path(engine):
    data = F.png(F.picture(96, 64, seed=5))
    text, at, chunks = prompt(engine.vision, data)
    with chunks:
        want = reference(engine, chunks, GREEDY.max_tokens)
    outs = run(engine, [Submit(1, text, GREEDY, images=[ImageInput(at, data)])])[1]
    assert outs[-1].finish in ("stop", "length") and tokens(outs) == want and len(want) >= 4
    assert outs[0].cached_tokens == 0
    # another image, same text: another reply (the made projector's random weights still show the image)
    other = run(engine, [Submit(2, text, GREEDY, images=[ImageInput(at, F.png(F.picture(96, 64, seed=6)))])])[2]
    assert tokens(other) != want


def test_a_malformed_image_ends_only_its_own_request(engine, tok):
    good = F.png(F.picture(64, 48, seed=7))
    text, at, chunks = prompt(engine.vision, good)
    chunks.close()
    plain = tok.encode(USER + "Say something." + ASK)
    alone = {
        "text": tokens(run(engine, [Submit(10, plain, GREEDY)])[10]),
        "image": tokens(run(engine, [Submit(11, text, GREEDY, images=[ImageInput(at, good)])])[11]),
    }
    bad = [
        F.png_raw(64, 48, b"\x00garbage, not a zlib stream"),  # passes the header checks, stb_image cannot decode it
        b"not an image at all",
        good[: len(good) // 2],  # cut short
    ]
    reqs = [Submit(20, plain, GREEDY), Submit(21, text, GREEDY, images=[ImageInput(at, good)])]
    reqs += [Submit(30 + i, text, GREEDY, images=[ImageInput(at, b)]) for i, b in enumerate(bad)]
    outs = run(engine, reqs)
    for i, why in enumerate(("could not be decoded", "not an image", "truncated")):
        assert [(o.token, o.finish) for o in outs[30 + i]] == [(None, "error")] and why in outs[30 + i][0].error
    assert tokens(outs[20]) == alone["text"] and tokens(outs[21]) == alone["image"]
    # refused outright: prompt logprobs (they would score an image's placeholders), images out of the prompt
    scored = SamplingParams(max_tokens=2, temperature=0.0, prompt_logprobs=1)
    for req, why in (
        (Submit(40, text, scored, images=[ImageInput(at, good)]), "prompt logprobs"),
        (Submit(41, text, GREEDY, images=[ImageInput(len(text) + 1, good)]), "out of the prompt"),
        (Submit(42, text, GREEDY, images=[ImageInput(at, good), ImageInput(at - 1, good)]), "out of the prompt"),
    ):
        out = engine.add(req)
        assert out is not None and (out.id, out.token, out.finish) == (req.id, None, "error") and why in out.error
    assert tokens(run(engine, [Submit(43, text, GREEDY, images=[ImageInput(at, good)])])[43]) == alone["image"]


def test_the_next_turn_about_an_image_reuses_its_cells_and_another_image_does_not(engine):
    a, b = F.png(F.picture(80, 60, seed=8)), F.png(F.picture(80, 60, seed=9))
    text, at, chunks = prompt(engine.vision, a)
    chunks.close()
    first = run(engine, [Submit(50, text, GREEDY, images=[ImageInput(at, a)])])[50]
    history = text + tokens(first)
    turn = [*history, *text[at:]]  # the reply, then another user turn
    cached = []
    for i, image in enumerate((a, b, a)):
        outs = run(engine, [Submit(60 + i, turn, GREEDY, images=[ImageInput(at, image)])])[60 + i]
        cached.append(outs[0].cached_tokens)
    # the same image: its positions and the reply after them came from the cache; another image: only the text
    # before it (its first position's placeholder differs)
    assert cached[0] >= at + N_IMAGE + len(tokens(first)) and cached[2] >= cached[0]
    assert cached[1] == at


def in_stream(engine: LLMEngine, reqs: list[Submit]) -> dict[int, list[SeqOutput]]:
    """The requests one at a time, nothing between them: each turn finds the cells of the one before still in its
    stream, made by the same decodes as those a restore brings back (a prefill from scratch, made by other ones,
    gives other last bits)."""
    return {r.id: run(engine, [r])[r.id] for r in reqs}


def said(outs: list[SeqOutput]) -> list[tuple]:
    """A reply's tokens, each with its logprobs, and how it ended."""
    return [(o.token, o.logprobs and msgspec.structs.astuple(o.logprobs), o.finish) for o in outs]


def test_an_images_cells_are_reused_from_host_ram_and_after_a_restart(mmproj, tok, tmp_path):
    """Two streams: two long text requests push the image conversation's entry out to host RAM, where its next turn
    finds it; the engine closes (its entries go to --cache-dir's files) and a new one serves the turn after from
    them. The placeholders of the image's positions go with the tokens, and each reply is, logprobs and all, the one
    an engine that kept the cells in their stream gives."""
    config = ServeConfig(parallel=2, ctx_size=2048, threads=THREADS, mmproj=mmproj, cache_dir=str(tmp_path / "kv"))
    system = tok.encode("<|im_start|>system\n" + "You describe pictures carefully and briefly. " * 20 + "<|im_end|>\n")
    data = F.png(F.picture(80, 60, seed=11))
    eng = LLMEngine(resolve_model(None), config)
    try:
        text, at, chunks = prompt(eng.vision, data)
        chunks.close()
        text, at = system + text, len(system) + at
        opening = Submit(1, text, GREEDY, images=[ImageInput(at, data)])
        first = tokens(run(eng, [opening])[1])
        others = [tok.encode(f"<|im_start|>user\n{w} " * 10) for w in ("apples", "rivers")]
        run(eng, [Submit(2 + i, p, GREEDY) for i, p in enumerate(others)])
        assert eng.scheduler.cache.host.entries  # the image conversation's entry went to host RAM
        turn = [*text, *first, *text[at:]]
        asked = Submit(5, turn, SEEN, images=[ImageInput(at, data)])
        outs = run(eng, [asked])[5]
        assert outs[0].cached_tokens >= at + N_IMAGE + len(first)
    finally:
        eng.close()
    eng = LLMEngine(resolve_model(None), config)
    try:
        assert eng.scheduler.cache.disk.entries  # found at the start
        turn2 = [*turn, *tokens(outs), *text[at:]]
        asked2 = Submit(6, turn2, SEEN, images=[ImageInput(at, data)])
        outs2 = run(eng, [asked2])[6]
        assert outs2[0].cached_tokens >= at + N_IMAGE + len(first)
        other = run(eng, [Submit(7, turn2, GREEDY, images=[ImageInput(at, F.png(F.picture(80, 60, seed=12)))])])[7]
        assert other[0].cached_tokens == at
    finally:
        eng.close()
    eng = LLMEngine(resolve_model(None), msgspec.structs.replace(config, cache_dir=None))
    try:
        kept = in_stream(eng, [opening, asked, asked2])
    finally:
        eng.close()
    assert said(outs) == said(kept[5]) and said(outs2) == said(kept[6])


def test_a_prompt_that_ends_with_an_image_samples_from_its_last_row(engine):
    data = F.png(F.picture(64, 48, seed=13))
    image = engine.vision.image(data)
    try:
        chunks = engine.vision.tokenize([USER, image])
    finally:
        image.close()
    with chunks:
        (text, img) = chunks
        assert img.is_image
        want = reference(engine, chunks, GREEDY.max_tokens)
        prompt = text.tokens.tolist()
    outs = run(engine, [Submit(70, prompt, GREEDY, images=[ImageInput(len(prompt), data)])])[70]
    assert tokens(outs) == want and outs[-1].finish in ("stop", "length")
