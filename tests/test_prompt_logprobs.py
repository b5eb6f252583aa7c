"""/v1/completions with echo and prompt logprobs (how lm-evaluation-harness scores), with the openai SDK."""

from __future__ import annotations

import pytest

from tests.conftest import wait_idle

MODEL = "SmolLM2-135M-Instruct.Q4_1"
PROMPT = "The capital of France is Paris. The capital of Italy is"


def test_prompt_logprobs_equal_those_of_the_same_tokens_generated(oai, http):
    gen = oai.completions.create(
        model=MODEL, prompt=PROMPT, max_tokens=8, temperature=0, logprobs=3, extra_body={"ignore_eos": True}
    )
    generated = gen.choices[0].logprobs
    text = PROMPT + gen.choices[0].text
    # The prompt and what was generated, as token ids: retokenizing gives back the same pieces.
    pieces = http.post("/tokenize", json={"content": text, "add_special": True, "with_pieces": True}).json()["tokens"]
    ids = [p["id"] for p in pieces]
    n_prompt = len(ids) - len(generated.tokens)
    assert [p["piece"] for p in pieces[n_prompt:]] == generated.tokens

    scored = oai.completions.create(model=MODEL, prompt=ids, max_tokens=0, echo=True, logprobs=3)
    choice = scored.choices[0]
    lp = choice.logprobs
    assert choice.text == http.post("/detokenize", json={"tokens": ids}).json()["content"]
    assert choice.finish_reason == "length" and scored.usage.completion_tokens == 0
    assert len(lp.tokens) == len(lp.token_logprobs) == len(lp.top_logprobs) == len(ids)
    assert lp.token_logprobs[0] is None and lp.top_logprobs[0] is None
    assert all(x is not None and x <= 0 for x in lp.token_logprobs[1:])
    assert lp.tokens[n_prompt:] == generated.tokens
    # A prefill chunk computes these rows together, generation one at a time: the last bits may differ.
    assert lp.token_logprobs[n_prompt:] == pytest.approx(generated.token_logprobs, abs=2e-2)
    for mine, theirs in zip(lp.top_logprobs[n_prompt:], generated.top_logprobs):
        assert max(mine, key=mine.get) == max(theirs, key=theirs.get)  # greedy: the token generated
        assert len(mine) == 3


def test_scored_prompt_is_prefilled_whole_even_when_cached(oai):
    """A prompt the cache holds (just generated from) is still scored token by token."""
    long_prompt = PROMPT + " Rome. " + "The capital of Spain is Madrid. " * 20  # a few scored chunks
    oai.completions.create(model=MODEL, prompt=long_prompt, max_tokens=4, temperature=0)
    first = (
        oai.completions.create(model=MODEL, prompt=long_prompt, max_tokens=0, echo=True, logprobs=1).choices[0].logprobs
    )
    again = (
        oai.completions.create(model=MODEL, prompt=long_prompt, max_tokens=0, echo=True, logprobs=1).choices[0].logprobs
    )
    n = len(first.tokens)
    assert n > 128 and len(first.token_logprobs) == n and first.token_logprobs[0] is None
    assert again.token_logprobs[1:] == pytest.approx(first.token_logprobs[1:], abs=1e-3)


def test_echo_with_generation(oai):
    reply = oai.completions.create(model=MODEL, prompt=PROMPT, max_tokens=5, temperature=0, echo=True, logprobs=0, n=2)
    alone = oai.completions.create(model=MODEL, prompt=PROMPT, max_tokens=5, temperature=0)
    for choice in reply.choices:
        assert choice.text.endswith(PROMPT + alone.choices[0].text)
        lp = choice.logprobs
        assert len(lp.tokens) == reply.usage.prompt_tokens + 5 and lp.token_logprobs[0] is None
        assert lp.text_offset[0] == 0 and lp.text_offset == sorted(lp.text_offset)
    streamed = "".join(
        c.choices[0].text
        for c in oai.completions.create(model=MODEL, prompt=PROMPT, max_tokens=5, temperature=0, echo=True, stream=True)
        if c.choices
    )
    assert streamed.endswith(PROMPT + alone.choices[0].text)


def test_bad_echo_requests_are_400s(http):
    def bad(field: str, **body) -> None:
        r = http.post("/v1/completions", json={"prompt": PROMPT, **body})
        assert r.status_code == 400, r.text
        assert r.json()["error"]["param"] == field, r.text

    bad("max_tokens", max_tokens=0)
    bad("stream", echo=True, logprobs=1, stream=True)
    bad("max_tokens", max_tokens=-1, echo=True)
    wait_idle(http)
