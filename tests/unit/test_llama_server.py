"""llama-server's door without the model: its /infill prompt, token for token as llama-server builds it, and its
request bodies (aliases, fields accepted and ignored, new ones dropped, near misses of known ones refused)."""

from __future__ import annotations

import msgspec
import pytest

from frontend_proc.doors.llama_server.infill import CHUNK_SEPARATOR, FimTokens, infill_prompt, missing_fim
from frontend_proc.doors.llama_server.schemas import IGNORED, CompletionBody, InfillBody
from frontend_proc.http import lenient

FIM = FimTokens(pre=1, suf=2, mid=3, rep=4, sep=5)
BOS = 9


def enc(text: str) -> list[int]:
    """A stand-in tokenizer: one token per character."""
    return [1000 + ord(c) for c in text]


def test_infill_prompt_with_repository_tokens():
    prompt = infill_prompt(
        enc, FIM, BOS, enc("def f("), enc("):\n"), [("a.py", "x = 1")], enc("x"), n_batch=64, n_ctx=512
    )
    extra = [FIM.rep, *enc("myproject\n"), FIM.sep, *enc("a.py\n"), *enc("x = 1"), FIM.sep, *enc("filename\n")]
    assert prompt == [*extra, BOS, FIM.pre, *enc("def f("), *enc("x"), FIM.suf, *enc("):\n"), FIM.mid]


def test_infill_prompt_without_repository_tokens_or_bos():
    fim = FIM._replace(rep=-1, sep=-1)
    prompt = infill_prompt(enc, fim, None, enc("a"), enc("b"), [("ignored.py", "ctx")], [], n_batch=64, n_ctx=512)
    assert prompt == [*enc(CHUNK_SEPARATOR), *enc("ctx"), FIM.pre, *enc("a"), FIM.suf, *enc("b"), FIM.mid]


def test_infill_prompt_keeps_the_prefix_end_the_suffix_start_and_the_last_context():
    prefix, suffix, typed = list(range(100, 200)), list(range(200, 300)), enc("ty")
    fim = FIM._replace(rep=-1)
    prompt = infill_prompt(enc, fim, None, prefix, suffix, [("f", "z" * 100)], typed, n_batch=32, n_ctx=40)
    n_extra = 40 - 32 + 2  # n_ctx - n_batch - 2 * n_predict, n_predict -1
    extra = [fim.sep, *enc("f\n"), *enc("z" * 100), fim.sep, *enc("filename\n")][-n_extra:]
    body = [fim.pre, *prefix[-24:], *typed, fim.suf, *suffix[: 8 - 2 - len(typed)], fim.mid]  # 3/4 and 1/4 of the batch
    assert prompt == [*extra, *body]


def test_missing_fim_says_what_llama_server_says():
    assert missing_fim(FIM) == ""
    assert (
        missing_fim(FimTokens(-1, -1, -1, -1, -1))
        == "prefix token is missing. suffix token is missing. middle token is missing. "
    )
    assert missing_fim(FIM._replace(mid=-1)) == "middle token is missing. "


def test_completion_body_aliases_and_defaults():
    body = msgspec.json.decode(b'{"prompt": "x"}', type=CompletionBody)
    assert (body.predict, body.probs, body.count, body.stops, body.temperature, body.top_p, body.min_p) == (
        -1,
        0,
        1,
        [],
        0.8,
        0.95,
        0.05,
    )
    body = msgspec.json.decode(
        b'{"prompt": [1, "a"], "max_tokens": 5, "logprobs": 3, "n": 2, "stop": ["", "\\n"]}', type=CompletionBody
    )
    assert (body.predict, body.probs, body.count, body.stops) == (5, 3, 2, ["\n"])
    assert msgspec.json.decode(b'{"n_predict": 0, "max_tokens": 5}', type=CompletionBody).predict == 0


def test_llama_cpp_fields_cLLM_does_not_apply_are_accepted_new_ones_dropped_and_near_misses_refused():
    """As the door decodes a body (lenient.decode, near misses on); tests/test_native_routes.py checks it over HTTP."""

    def decode(body: dict, type_: type = CompletionBody):
        return lenient.decode(body, type_, near_misses=True)

    fields = {name: 1 for name in IGNORED}
    assert decode({"prompt": "x", **fields, "samplers": ["top_k"], "dry_sequence_breakers": ["\n"]}).prompt == "x"
    # a field no door knows is what a newer client adds: dropped (also one that is close to none: min_tokens)
    for new in ("brand_new_option", "min_tokens", "max_new_tokens", "repetition_penalty", "multimodal_data"):
        assert decode({"prompt": "x", new: 3, "n_predict": 2}).predict == 2
    for typo, meant in (
        ("n_prdict", "n_predict"),
        ("temprature", "temperature"),
        ("grammars", "grammar"),
        ("typical", "typical_p"),
    ):
        with pytest.raises(msgspec.ValidationError, match=f"unknown field `{typo}`: a misspelling of `{meant}`"):
            decode({"prompt": "x", typo: 3})
    with pytest.raises(msgspec.ValidationError, match="input_suffx.*input_suffix"):
        decode({"input_prefix": "a", "input_suffx": "b"}, InfillBody)
    assert (
        lenient.decode({"prompt": "x", "n_prdict": 3}, CompletionBody).predict == -1
    )  # the other doors' rule: dropped
    with pytest.raises(msgspec.ValidationError, match="top_p"):
        decode({"prompt": "x", "top_p": 2})


def test_infill_body_needs_prefix_and_suffix():
    with pytest.raises(msgspec.ValidationError, match="input_prefix"):
        msgspec.json.decode(b'{"input_suffix": ""}', type=InfillBody)
    body = msgspec.json.decode(
        b'{"input_prefix": [5, "a"], "input_suffix": "b", "input_extra": [{"text": "t"}], "dry_base": 2}',
        type=InfillBody,
    )
    assert body.input_extra[0].filename == "tmp" and body.input_prefix == [5, "a"]
    with pytest.raises(msgspec.ValidationError, match="text"):
        msgspec.json.decode(
            b'{"input_prefix": "", "input_suffix": "", "input_extra": [{"filename": "a"}]}', type=InfillBody
        )
