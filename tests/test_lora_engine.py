"""LoRA adapters in the engine, in-process on the embedded model with the made adapter (perf/synth_lora.py): the
first token's logprobs are llama.cpp's own under the adapter at each scale; the adapter changes greedy text at scale
0.5 and 1 and not at 0; sequences under different adapter sets decoding in
one step each get their own set's text; the prefix cache never serves cells made under one set to another."""

from __future__ import annotations

import ctypes
from collections.abc import Iterator

import llama_cpp as L
import numpy as np
import pytest

from cllm.core.config import ServeConfig
from cllm.core.model_file import resolve_model
from cllm.core.protocol import LoraLoad, SamplingParams, Submit
from engine_proc.engine import LLMEngine
from perf import synth_lora
from tests.near_tie import NEAR_TIE

PROMPT = "<|im_start|>user\nWhat is the capital of France?<|im_end|>\n<|im_start|>assistant\n"
OTHER = "<|im_start|>user\nName three primary colors.<|im_end|>\n<|im_start|>assistant\n"
# A token's rows computed in other batch shapes (a prompt's last token alone after its cached cells, or beside other
# sequences) give other logits on some CPUs (an AMD EPYC with AVX2), flash attention off too: greedy text may part at
# a near tie (NEAR_TIE), and every token before that is as likely in both to CLOSE nats. A wrong adapter set moves
# them by far more: at scales 0.25 to 1 it changes the first token of these prompts, or its logprob by 0.3-1.2 nats.
CLOSE = 0.2

# A generated token: its id, its logprob, and the two likeliest ids and logprobs on its row that it could be (the
# requests ignore end-of-generation, so an end token, likeliest or not, is never one).
Row = tuple[int, float, list[int], list[float]]


def same_text(a: list[Row], b: list[Row]) -> None:
    """Two greedy runs of one prompt under one adapter set: the same tokens, as likely, up to a near tie if any."""
    for i, (x, y) in enumerate(zip(a, b)):
        if x[0] != y[0]:
            for row in (x, y):
                assert set(row[2]) == {x[0], y[0]} and row[3][0] - row[3][1] < NEAR_TIE, (i, x, y)
            return
        assert abs(x[1] - y[1]) < CLOSE, (i, x, y)
    assert len(a) == len(b)


def ids(rows: list[Row]) -> tuple[int, ...]:
    return tuple(r[0] for r in rows)


@pytest.fixture(scope="session")
def adapter() -> str:
    return synth_lora.cached()


@pytest.fixture(scope="module")
def eng(adapter) -> Iterator[LLMEngine]:
    e = LLMEngine(resolve_model(None), ServeConfig(parallel=4, ctx_size=2048, lora=[adapter], flash_attn="off"))
    try:
        yield e
    finally:
        e.close()


class Feed:
    def __init__(self, engine: LLMEngine, tok):
        self.engine, self.tok = engine, tok
        self.next_id = 1000

    def add(self, text: str, lora: list[tuple[int, float]], n: int = 24) -> int:
        self.next_id += 1
        params = SamplingParams(max_tokens=n, temperature=0, ignore_eos=True, lora=lora, logprobs=4)
        assert self.engine.add(Submit(self.next_id, self.tok.encode(text), params)) is None
        return self.next_id

    def run(self) -> tuple[dict[int, list[Row]], dict[int, int]]:
        """Step until idle: each request's tokens, and the prompt tokens the cache served it."""
        tokens: dict[int, list[Row]] = {}
        cached: dict[int, int] = {}
        while self.engine.has_work():
            for out in (o for r in self.engine.step() for o in r.outputs):
                assert out.finish != "error", out.error
                if out.id not in cached:
                    cached[out.id] = out.cached_tokens
                if out.token is not None:
                    lp = out.logprobs
                    assert lp is not None
                    top = [
                        (t, p) for t, p in zip(lp.top_ids, lp.top_logprobs) if t not in self.engine.runner.eog_tokens
                    ]
                    best, logprobs = [t for t, _ in top[:2]], [p for _, p in top[:2]]
                    tokens.setdefault(out.id, []).append((out.token, lp.logprob, best, logprobs))
        return tokens, cached

    def alone(self, text: str, lora: list[tuple[int, float]]) -> list[Row]:
        rid = self.add(text, lora)
        return self.run()[0][rid]


@pytest.fixture(scope="module")
def feed(eng, tok) -> Feed:
    return Feed(eng, tok)


def test_scales_change_greedy_text(feed: Feed):
    base = feed.alone(PROMPT, [])
    same_text(feed.alone(PROMPT, [(0, 0.0)]), base)  # scale 0 is no adapter
    half, whole = feed.alone(PROMPT, [(0, 0.5)]), feed.alone(PROMPT, [(0, 1.0)])
    assert len({ids(base), ids(half), ids(whole)}) == 3, "the adapter must change greedy text visibly"


def test_sets_in_one_step_each_get_their_own(feed: Feed):
    """Four sequences, two prompts under three sets, admitted together: each one's text is what it gets alone."""
    want = {(p, s): feed.alone(p, [(0, s)] if s else []) for p, s in ((PROMPT, 0.0), (PROMPT, 1.0), (OTHER, 0.5))}
    want[(OTHER, 0.0)] = feed.alone(OTHER, [])
    sent = {feed.add(p, [(0, s)] if s else []): (p, s) for p, s in want}
    got, _ = feed.run()
    for rid, key in sent.items():
        same_text(got[rid], want[key])


def test_cache_never_crosses_adapter_sets(feed: Feed):
    """A prompt cached under no adapter is not served to the same prompt under the adapter, nor under another scale
    of it; under the same set it is, with the same text. Sets of their own (scales no other test uses): no entry of
    theirs shares even the template's first token. (With Sequence.key ignoring the mark, the second request reuses
    the first's cells: it fails.)"""
    text = "<|im_start|>system\nYou answer briefly.<|im_end|>\n" + PROMPT
    feed.alone(text, [])
    rid = feed.add(text, [(0, 0.75)])
    tokens, cached = feed.run()
    assert cached[rid] == 0
    rid2 = feed.add(text, [(0, 0.25)])
    assert feed.run()[1][rid2] == 0
    rid3 = feed.add(text, [(0, 0.75)])
    again, cached = feed.run()
    assert cached[rid3] == len(feed.tok.encode(text)) - 1  # the same set's cells are reused
    same_text(again[rid3], tokens[rid])


def test_unknown_adapter_and_unload(eng: LLMEngine, feed: Feed, adapter: str):
    out = eng.add(Submit(1, feed.tok.encode(PROMPT), SamplingParams(max_tokens=4, lora=[(7, 1.0)])))
    assert out is not None and out.finish == "error" and "7" in out.error
    done, ended = eng.load_lora(LoraLoad(2, 1, adapter))
    assert done.error == "" and ended == []
    rid = feed.add(PROMPT, [(1, 1.0)], n=200)
    eng.step()
    done, ended = eng.load_lora(LoraLoad(3, 1, unload=True))
    assert done.error == "" and [o.id for o in ended] == [rid]
    assert not eng.has_work()
    done, _ = eng.load_lora(LoraLoad(4, 2, "/nonexistent.gguf"))
    assert "could not load" in done.error


def llama_cpp_top(adapter: str, prompt: list[int], scale: float, k: int = 3) -> list[tuple[int, float]]:
    """llama.cpp's own k likeliest first tokens and their logprobs, the prompt decoded alone in a context of its own
    under the adapter at ``scale`` (flash attention off, as the engine here)."""
    m = L.llama_model_load_from_file(resolve_model(None).encode(), L.llama_model_default_params())
    lora = L.llama_adapter_lora_init(m, adapter.encode())
    p = L.llama_context_default_params()
    p.n_ctx = p.n_batch = p.n_ubatch = 512
    p.flash_attn_type = L.LLAMA_FLASH_ATTN_TYPE_DISABLED
    ctx = L.llama_init_from_model(m, p)
    try:
        L.llama_set_adapters_lora(ctx, (L.llama_adapter_lora_p_ctypes * 1)(lora), 1, (ctypes.c_float * 1)(scale))
        ids = (L.llama_token * len(prompt))(*prompt)
        assert L.llama_decode(ctx, L.llama_batch_get_one(ids, len(prompt))) == 0
        n_vocab = L.llama_vocab_n_tokens(L.llama_model_get_vocab(m))
        logits = np.ctypeslib.as_array(L.llama_get_logits_ith(ctx, -1), (n_vocab,)).astype(np.float64)
        logprobs = logits - logits.max() - np.log(np.exp(logits - logits.max()).sum())
        top = np.argsort(-logprobs)[:k]
        return [(int(i), float(logprobs[i])) for i in top]
    finally:
        L.llama_free(ctx)
        L.llama_model_free(m)


@pytest.mark.parametrize("scale", [0.0, 0.5, 1.0])
def test_first_token_is_llama_cpps_own(eng: LLMEngine, feed: Feed, adapter: str, scale: float):
    prompt = feed.tok.encode(OTHER)
    feed.next_id += 1
    params = SamplingParams(max_tokens=1, temperature=0, logprobs=3, lora=[(0, scale)])
    assert eng.add(Submit(feed.next_id, prompt, params)) is None
    out = next(o for r in eng.step() for o in r.outputs if o.id == feed.next_id)
    while eng.has_work():
        list(eng.step())
    want = llama_cpp_top(adapter, prompt, scale)
    assert out.logprobs is not None and out.logprobs.top_ids == [i for i, _ in want]
    assert np.allclose(out.logprobs.top_logprobs, [lp for _, lp in want], atol=1e-3), (out.logprobs, want)
