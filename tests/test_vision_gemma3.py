"""Gemma 3's images (issue 48): an image's rows attend to each other, not only to those before them.

On a made Gemma 3 (perf/synth_gemma3.py: a tiny gemma3 text model and a gemma3 projector, random weights: the path
is tested, never what the model says). mtmd asks for non-causal attention while such an image decodes
(mtmd_decode_use_non_causal); the engine decodes the image whole, in a llama_decode of its own, with the causal mask
off for that call alone. Checked against mtmd's own eval path (mtmd_helper_eval_chunks: the same greedy tokens),
which the same decode with the causal mask left on does not give (so the comparison sees that break); beside text
requests, whose tokens stay what they are alone; with a prefill block smaller than the image (exact mode), where the
image must not be cut; a second turn reuses the image's cells, from a stream, host RAM and --cache-dir's files
(another image's, never). Served, cllm and llama-server (`--mmproj`) on the same
files count the same prompt tokens and say the same greedy text.
"""

from __future__ import annotations

import base64
from collections.abc import Iterator

import httpx
import pytest

from cllm.core.config import ServeConfig
from cllm.core.protocol import ImageInput, SamplingParams, Submit
from engine_proc.engine import LLMEngine
from engine_proc.run.model_runner import ModelLoadError
from perf import image_files as F
from perf import synth_gemma3
from tests.conftest import start_server
from tests.llama_server import llama_server_on
from tests.test_vision_engine import in_stream, reference, run, said, tokens

USER = "<start_of_turn>user\n"
ASK = "What is in this picture?<end_of_turn>\n<start_of_turn>model\n"
GREEDY = SamplingParams(max_tokens=12, temperature=0.0)
SEEN = SamplingParams(max_tokens=12, temperature=0.0, logprobs=2)  # GREEDY with each token's logprobs
THREADS = 1
N_POS = synth_gemma3.N_IMAGE + 2  # an image's rows between <start_of_image> and <end_of_image>


@pytest.fixture(scope="module")
def gemma3(tmp_path_factory) -> tuple[str, str]:
    """The made text model and projector: (model, mmproj)."""
    return synth_gemma3.write(str(tmp_path_factory.mktemp("gemma3")))


def engine_on(gemma3, **config) -> LLMEngine:
    model, mmproj = gemma3
    return LLMEngine(
        model, ServeConfig(**{"parallel": 4, "ctx_size": 2048, "threads": THREADS, **config}, mmproj=mmproj)
    )


@pytest.fixture(scope="module")
def engine(gemma3) -> Iterator[LLMEngine]:
    eng = engine_on(gemma3)
    try:
        yield eng
    finally:
        eng.close()


def text_tokens(vision, text: str, first: bool = True) -> list[int]:
    with vision.tokenize([text], add_special=first) as chunks:  # the made model's tokenizer, <bos> first
        return chunks[0].tokens.tolist()


def prompt(vision, data: bytes) -> tuple[list[int], int, list]:
    """USER, the image, ASK: (the prompt's text tokens and where the image goes, as the frontend sends them;
    mtmd's chunks of it, to close)."""
    image = vision.image(data)
    try:
        chunks = vision.tokenize([USER, image, ASK])
    finally:
        image.close()
    # mtmd puts <start_of_image> and <end_of_image> around the image's rows (the engine adds them too)
    assert [c.is_image for c in chunks] == [False, True, False]
    before, after = text_tokens(vision, USER), text_tokens(vision, ASK, first=False)
    return before + after, len(before), chunks


def test_the_engine_takes_a_projector_whose_image_rows_see_each_other(engine):
    assert engine.vision is not None and engine.vision.non_causal
    assert (engine.info.image_tokens, engine.vision.image_rows) == (N_POS, synth_gemma3.N_IMAGE)


def test_an_image_decodes_as_mtmds_own_path_and_not_as_a_causal_decode(engine):
    data = F.png(F.picture(96, 64, seed=5))
    text, at, chunks = prompt(engine.vision, data)
    with chunks:
        want = reference(engine, chunks, GREEDY.max_tokens)
        causal = reference(engine, chunks, GREEDY.max_tokens, causal=True)
    assert len(want) == GREEDY.max_tokens and causal != want  # the comparison can tell the mask was left on
    outs = run(engine, [Submit(1, text, GREEDY, images=[ImageInput(at, data)])])[1]
    assert tokens(outs) == want


def test_two_images_in_a_prompt_each_decode_whole_as_mtmds_own_path(engine):
    """Each image is its own non-causal decode: the first's rows do not see the second's."""
    a, b = F.png(F.picture(64, 64, seed=15)), F.png(F.picture(64, 64, seed=16))
    images = [engine.vision.image(data) for data in (a, b)]
    try:
        chunks = engine.vision.tokenize([USER, images[0], "and", images[1], ASK])
    finally:
        for image in images:
            image.close()
    with chunks:
        want = reference(engine, chunks, GREEDY.max_tokens)
    before, middle = text_tokens(engine.vision, USER), text_tokens(engine.vision, "and", first=False)
    text = before + middle + text_tokens(engine.vision, ASK, first=False)
    places = [ImageInput(len(before), a), ImageInput(len(before) + len(middle), b)]
    assert tokens(run(engine, [Submit(3, text, GREEDY, images=places)])[3]) == want


def test_beside_text_requests_each_decodes_as_it_does_alone(engine):
    """The causal mask is off only for the image's own llama_decode: text decoded in the steps around it (prompts
    and decodes of other sequences, and of its own) keeps its causal attention."""
    data = F.png(F.picture(80, 60, seed=6))
    text, at, chunks = prompt(engine.vision, data)
    with chunks:
        want = reference(engine, chunks, GREEDY.max_tokens)
    plain = [
        text_tokens(engine.vision, f"{USER}Say something about {w}.<end_of_turn>\n<start_of_turn>model\n")
        for w in "abc"
    ]
    alone = [tokens(run(engine, [Submit(10 + i, p, GREEDY)])[10 + i]) for i, p in enumerate(plain)]
    reqs = [Submit(20 + i, p, GREEDY) for i, p in enumerate(plain)]
    reqs.insert(1, Submit(29, text, GREEDY, images=[ImageInput(at, data)]))
    outs = run(engine, reqs)
    assert tokens(outs[29]) == want
    assert [tokens(outs[20 + i]) for i in range(3)] == alone


def test_with_a_draft_model_an_image_decodes_as_mtmds_path_beside_drafting_text(gemma3):
    """A draft model loaded (the made model drafts for itself, the same vocabulary): an image's placeholders are no
    tokens, so its sequence never drafts and decodes as mtmd's path does, while text sequences in the same steps
    draft and have their drafts verified."""
    model, _ = gemma3
    engine = engine_on(gemma3, model_draft=model, spec_draft_n_max=4)
    try:
        assert engine.drafter is not None and engine.drafter.model is not None
        data = F.png(F.picture(80, 60, seed=11))
        text, at, chunks = prompt(engine.vision, data)
        with chunks:
            want = reference(engine, chunks, GREEDY.max_tokens)
        plain = [
            text_tokens(engine.vision, f"{USER}Count from {w}.<end_of_turn>\n<start_of_turn>model\n") for w in "ab"
        ]
        reqs = [Submit(70 + i, p, GREEDY) for i, p in enumerate(plain)]
        reqs.insert(1, Submit(79, text, GREEDY, images=[ImageInput(at, data)]))
        outs = run(engine, reqs)
        assert tokens(outs[79]) == want and len(want) >= 4
        assert all(outs[70 + i][-1].finish in ("stop", "length") for i in range(2))
        assert engine.drafter.drafted > 0 and engine.drafter.accepted > 0
    finally:
        engine.close()


def test_an_image_is_decoded_whole_where_a_prefill_block_would_cut_it(gemma3):
    """Exact mode cuts a prompt at block boundaries (16 positions with --batch-size 16): an image that crosses one
    is still decoded in one piece, as its rows must see each other."""
    engine = engine_on(gemma3, parallel=2, batch_size=16, prefix_cache_exact=True)
    try:
        data = F.png(F.picture(64, 64, seed=7))
        text, at, chunks = prompt(engine.vision, data)
        with chunks:
            want = reference(engine, chunks, GREEDY.max_tokens)
        assert at % 16 + synth_gemma3.N_IMAGE > 16  # the image's rows cross a block boundary
        assert tokens(run(engine, [Submit(1, text, GREEDY, images=[ImageInput(at, data)])])[1]) == want
    finally:
        engine.close()


def test_a_batch_smaller_than_an_image_is_refused_at_load(gemma3):
    with pytest.raises(ModelLoadError, match="--batch-size"):
        engine_on(gemma3, parallel=2, batch_size=8).close()


def test_the_next_turn_reuses_the_images_cells(engine):
    data = F.png(F.picture(80, 60, seed=8))
    text, at, chunks = prompt(engine.vision, data)
    chunks.close()
    first = tokens(run(engine, [Submit(40, text, GREEDY, images=[ImageInput(at, data)])])[40])
    turn = [*text, *first, *text[at:]]
    outs = run(engine, [Submit(41, turn, GREEDY, images=[ImageInput(at, data)])])[41]
    assert outs[0].cached_tokens >= len(text) + N_POS + len(first) - 1


def test_the_images_cells_are_reused_from_host_ram_and_after_a_restart(gemma3, tmp_path):
    """Two streams: long text requests push the image conversation out to host RAM, where its next turn finds it;
    after a restart --cache-dir's files serve the turn after; another image's turn reuses only the text before it.
    Each reply is, logprobs and all, the one an engine that kept the cells in their stream gives (in_stream)."""
    config = {"parallel": 2, "cache_dir": str(tmp_path / "kv")}
    data = F.png(F.picture(80, 60, seed=11))
    eng = engine_on(gemma3, **config)
    try:
        # a long instruction first (Gemma 3 puts a system prompt in the first user turn): worth keeping in host RAM
        before = text_tokens(eng.vision, USER + "You describe pictures carefully and briefly. " * 20)
        text, at = before + text_tokens(eng.vision, ASK, first=False), len(before)
        opening = Submit(1, text, GREEDY, images=[ImageInput(at, data)])
        first = tokens(run(eng, [opening])[1])
        others = [text_tokens(eng.vision, f"{USER}{w} " * 20) for w in ("apples", "rivers")]
        run(eng, [Submit(2 + i, p, GREEDY) for i, p in enumerate(others)])
        assert eng.scheduler.cache.host.entries  # the image conversation's entry went to host RAM
        turn = [*text, *first, *text[at:]]
        asked = Submit(5, turn, SEEN, images=[ImageInput(at, data)])
        outs = run(eng, [asked])[5]
        assert outs[0].cached_tokens >= len(text) + N_POS + len(first) - 1
    finally:
        eng.close()
    eng = engine_on(gemma3, **config)
    try:
        assert eng.scheduler.cache.disk.entries  # found at the start
        turn2 = [*turn, *tokens(outs), *text[at:]]
        asked2 = Submit(6, turn2, SEEN, images=[ImageInput(at, data)])
        outs2 = run(eng, [asked2])[6]
        assert outs2[0].cached_tokens >= len(turn) + N_POS + len(tokens(outs)) - 1
        other = run(eng, [Submit(7, turn2, GREEDY, images=[ImageInput(at, F.png(F.picture(80, 60, seed=12)))])])[7]
        assert other[0].cached_tokens == at + 1  # the text before the image and its <start_of_image>
    finally:
        eng.close()
    eng = engine_on(gemma3, parallel=2)
    try:
        kept = in_stream(eng, [opening, asked, asked2])
    finally:
        eng.close()
    assert said(outs) == said(kept[5]) and said(outs2) == said(kept[6])


# ---- served, beside llama-server on the same files ----------------------------------------------------------------


def test_cllm_and_llama_server_count_and_say_the_same(gemma3, tmp_path_factory):
    model, mmproj = gemma3
    png = F.png(F.picture(96, 64, seed=9))
    content = [
        {"type": "image_url", "image_url": {"url": "data:image/png;base64," + base64.b64encode(png).decode()}},
        {"type": "text", "text": "What is in this picture?"},
    ]
    body = {"messages": [{"role": "user", "content": content}], "max_tokens": 12, "temperature": 0}
    answers = []
    with llama_server_on(model, tmp_path_factory, "--mmproj", mmproj, "--parallel", "1", "--ctx-size", "2048") as c:
        answers.append(c.post("/v1/chat/completions", json=body))
    args = ("--model", model, "--mmproj", mmproj, "--parallel", "2", "--ctx-size", "2048", "--threads", "1")
    with start_server(*args) as srv, httpx.Client(base_url=srv.url, timeout=300) as c:
        answers.append(c.post("/v1/chat/completions", json=body))
    theirs, ours = (r.json() for r in answers)
    assert all(r.status_code == 200 for r in answers), [r.text for r in answers]
    assert ours["usage"]["prompt_tokens"] == theirs["usage"]["prompt_tokens"]
    assert ours["choices"][0]["message"]["content"] == theirs["choices"][0]["message"]["content"]
    assert ours["usage"]["completion_tokens"] == theirs["usage"]["completion_tokens"] == 12
