"""The OpenAI-compatible API, with the real `openai` SDK as the client, against `cllm serve`."""

from __future__ import annotations

import json
import re

import openai
import pytest

from tests.conftest import health
from tests.near_tie import greedy

MODEL = "SmolLM2-135M-Instruct.Q4_1"
PERSON_SCHEMA = {
    "type": "object",
    "properties": {
        "name": {"type": "string"},
        "age": {"type": "integer"},
        "languages": {"type": "array", "items": {"type": "string"}, "maxItems": 3},
    },
    "required": ["name", "age", "languages"],
}
# Multi-turn: SmolLM2 answers this one briefly and ends with <|im_end|>.
CONVERSATION = [
    {"role": "system", "content": "You are a helpful assistant."},
    {"role": "user", "content": "My name is Alice."},
    {"role": "assistant", "content": "Nice to meet you, Alice!"},
    {"role": "user", "content": "What is my name?"},
]


@pytest.fixture(scope="module")
def oai(server):
    with openai.OpenAI(base_url=server.url + "/v1", api_key="unused", timeout=300, max_retries=0) as client:
        yield client


def complete(oai, **kw):
    return oai.completions.create(model=MODEL, **kw)


def chat(oai, messages=CONVERSATION, **kw):
    return oai.chat.completions.create(model=MODEL, messages=messages, **kw)


def chat_stream_text(oai, **kw) -> tuple[list[str], dict[int, str], list]:
    """(content pieces, finish_reason per choice, chunks) of a streamed chat completion."""
    pieces, finish, chunks = [], {}, []
    for chunk in oai.chat.completions.create(model=MODEL, stream=True, **kw):
        chunks.append(chunk)
        for c in chunk.choices:
            if c.delta.content:
                pieces.append(c.delta.content)
            if c.finish_reason:
                finish[c.index] = c.finish_reason
    return pieces, finish, chunks


def test_models(oai):
    models = oai.models.list().data
    assert [m.id for m in models] == [MODEL]
    assert models[0].object == "model" and models[0].owned_by == "cllm"
    assert oai.models.retrieve(MODEL).id == MODEL
    with pytest.raises(openai.NotFoundError) as e:
        oai.models.retrieve("gpt-4")
    assert e.value.body["code"] == "model_not_found"


def test_completion(oai, http):
    r = complete(oai, prompt="The capital of France is", max_tokens=12, temperature=0)
    assert r.object == "text_completion" and r.model == MODEL and r.id.startswith("cmpl-")
    [choice] = r.choices
    assert "Paris" in choice.text
    assert choice.finish_reason == "length" and choice.logprobs is None
    prompt_tokens = http.post("/encode", json={"text": "The capital of France is"}).json()["data"]["length"]
    assert (r.usage.prompt_tokens, r.usage.completion_tokens, r.usage.total_tokens) == (
        prompt_tokens,
        12,
        prompt_tokens + 12,
    )
    # OpenAI's default max_tokens for completions is 16.
    assert (
        complete(oai, prompt="Once upon a time", temperature=0, extra_body={"ignore_eos": True}).usage.completion_tokens
        == 16
    )


def test_completion_prompt_forms(oai, http):
    tokens = http.post("/encode", json={"text": "The capital of France is"}).json()["data"]["tokens"]
    text = complete(oai, prompt="The capital of France is", max_tokens=8, temperature=0).choices[0].text
    assert complete(oai, prompt=tokens, max_tokens=8, temperature=0).choices[0].text == text
    batch = complete(oai, prompt=["The capital of France is", tokens, "Water boils at"], max_tokens=8, temperature=0)
    assert [c.index for c in batch.choices] == [0, 1, 2]
    assert batch.choices[0].text == batch.choices[1].text == text != batch.choices[2].text
    assert batch.usage.completion_tokens == 24


# CONVERSATION's name asked again after it was answered: the reply, "Alice." and its end, is clear of a tie (asked
# once, the first token is: "Hello" -1.69 against "I" -1.99).
REMEMBERED = [
    *CONVERSATION,
    {"role": "assistant", "content": "Alice."},
    {"role": "user", "content": "And what is my name?"},
]


def test_chat_multi_turn(oai, http):
    said = greedy(http, {"messages": REMEMBERED, "max_tokens": 200})
    r = chat(oai, messages=REMEMBERED, temperature=0, max_tokens=200)
    assert r.object == "chat.completion" and r.id.startswith("chatcmpl-")
    [choice] = r.choices
    assert choice.message.role == "assistant"
    assert said.ended and choice.finish_reason == "stop" and 0 < r.usage.completion_tokens < 200
    assert "Alice" in choice.message.content == said.text and "<|im_end|>" not in choice.message.content
    # The prompt is the conversation in the model's own template (SmolLM2: ChatML).
    rendered = (
        "".join(f"<|im_start|>{m['role']}\n{m['content']}<|im_end|>\n" for m in REMEMBERED) + "<|im_start|>assistant\n"
    )
    assert r.usage.prompt_tokens == http.post("/encode", json={"text": rendered}).json()["data"]["length"]


def test_chat_content_parts_and_developer_role(oai):
    plain = chat(
        oai,
        messages=[{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi there"}],
        temperature=0,
        max_tokens=10,
    )
    parts = chat(
        oai,
        messages=[
            {"role": "developer", "content": "Be brief."},
            {"role": "user", "content": [{"type": "text", "text": "Hi there"}]},
        ],
        temperature=0,
        max_tokens=10,
    )
    assert parts.choices[0].message.content == plain.choices[0].message.content
    assert parts.usage.prompt_tokens == plain.usage.prompt_tokens


def test_chat_stream_equals_non_stream(oai):
    whole = chat(oai, temperature=0, max_tokens=200)
    pieces, finish, chunks = chat_stream_text(oai, messages=CONVERSATION, temperature=0, max_tokens=200)
    assert "".join(pieces) == whole.choices[0].message.content
    assert finish == {0: whole.choices[0].finish_reason}
    assert chunks[0].choices[0].delta.role == "assistant"
    assert {c.id for c in chunks} == {chunks[0].id} and all(c.object == "chat.completion.chunk" for c in chunks)
    assert all(c.usage is None for c in chunks)


def test_completion_stream_equals_non_stream(oai):
    whole = complete(oai, prompt="Once upon a time", max_tokens=30, temperature=0)
    chunks = list(complete(oai, prompt="Once upon a time", max_tokens=30, temperature=0, stream=True))
    assert "".join(c.choices[0].text for c in chunks) == whole.choices[0].text
    assert chunks[-1].choices[0].finish_reason == "length"


def test_stream_usage_chunk_and_done(server, http):
    body = {
        "model": MODEL,
        "messages": CONVERSATION[:2],
        "max_tokens": 5,
        "temperature": 0,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    with http.stream("POST", "/v1/chat/completions", json=body) as r:
        assert r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream")
        lines = [line for line in r.iter_lines() if line]
    assert all(line.startswith("data: ") for line in lines)
    assert lines[-1] == "data: [DONE]"
    events = [json.loads(line[len("data: ") :]) for line in lines[:-1]]
    usage = events[-1]
    assert usage["choices"] == [] and usage["usage"]["completion_tokens"] == 5
    assert usage["usage"]["total_tokens"] == usage["usage"]["prompt_tokens"] + 5
    assert all(e["usage"] is None for e in events[:-1])


@pytest.mark.parametrize("stream", [False, True])
def test_stop_strings(oai, stream):
    prompt = "The three primary colors are"
    full = complete(oai, prompt=prompt, max_tokens=40, temperature=0, extra_body={"ignore_eos": True})
    text = full.choices[0].text
    stop = text[len(text) // 2 : len(text) // 2 + 4]
    assert stop.strip() and stop in text
    kw = dict(prompt=prompt, max_tokens=40, temperature=0, stop=["NOT-IN-TEXT", stop])
    if stream:
        chunks = list(complete(oai, stream=True, **kw))
        got = "".join(c.choices[0].text for c in chunks)
        assert not any(stop in c.choices[0].text for c in chunks)
        finish = chunks[-1].choices[0].finish_reason
    else:
        r = complete(oai, **kw)
        got, finish = r.choices[0].text, r.choices[0].finish_reason
        assert r.usage.completion_tokens < 40
    assert got == text[: text.index(stop)]
    assert finish == "stop"


def test_stop_string_on_chat(oai):
    whole = chat(oai, temperature=0, max_tokens=200).choices[0].message.content
    word = whole.split()[2]
    r = chat(oai, temperature=0, max_tokens=200, stop=word)
    assert r.choices[0].message.content == whole[: whole.index(word)]
    assert r.choices[0].finish_reason == "stop"


def test_seed_reproduces(oai):
    kw = dict(prompt="Write a poem about the sea", max_tokens=12, temperature=1.0, extra_body={"top_k": 0})
    a = complete(oai, seed=1234, **kw).choices[0].text
    assert complete(oai, seed=1234, **kw).choices[0].text == a
    others = {complete(oai, seed=s, **kw).choices[0].text for s in (1, 2)}
    assert len(others | {a}) > 1


def test_n_choices(oai):
    kw = dict(messages=[{"role": "user", "content": "Tell me a joke"}], temperature=1.0, max_tokens=10, n=2, seed=7)
    r = chat(oai, **kw)
    assert [c.index for c in r.choices] == [0, 1]
    texts = [c.message.content for c in r.choices]
    assert texts[0] != texts[1]  # seed, seed+1: independent draws
    assert [c.message.content for c in chat(oai, **kw).choices] == texts  # ...that a seed reproduces
    pieces_by_choice: dict[int, str] = {0: "", 1: ""}
    for chunk in oai.chat.completions.create(model=MODEL, stream=True, **kw):
        for c in chunk.choices:
            pieces_by_choice[c.index] += c.delta.content or ""
    assert [pieces_by_choice[0], pieces_by_choice[1]] == texts


def test_n_usage_counts_every_choice(oai):
    r = complete(
        oai, prompt="Once upon a time", max_tokens=7, n=3, temperature=0.8, seed=1, extra_body={"ignore_eos": True}
    )
    assert len(r.choices) == 3 and r.usage.completion_tokens == 21


def test_chat_logprobs(oai):
    r = chat(oai, temperature=0, max_tokens=12, logprobs=True, top_logprobs=3)
    content = r.choices[0].logprobs.content
    assert len(content) == r.usage.completion_tokens
    assert "".join(t.token for t in content) == r.choices[0].message.content
    for t in content:
        assert bytes(t.bytes).decode() == t.token
        assert t.logprob <= 0 and len(t.top_logprobs) == 3
        lps = [x.logprob for x in t.top_logprobs]
        assert lps == sorted(lps, reverse=True)
        assert t.top_logprobs[0].token == t.token and t.top_logprobs[0].logprob == pytest.approx(t.logprob)  # greedy
    streamed = []
    for chunk in oai.chat.completions.create(
        model=MODEL, messages=CONVERSATION, temperature=0, max_tokens=12, logprobs=True, top_logprobs=3, stream=True
    ):
        for c in chunk.choices:
            streamed += c.logprobs.content if c.logprobs else []
    assert [(t.token, t.logprob) for t in streamed] == [(t.token, t.logprob) for t in content]
    assert chat(oai, temperature=0, max_tokens=3, logprobs=True).choices[0].logprobs.content[0].top_logprobs == []


def test_completion_logprobs(oai):
    r = complete(oai, prompt="The capital of France is", max_tokens=6, temperature=0, logprobs=2)
    lp = r.choices[0].logprobs
    assert "".join(lp.tokens) == r.choices[0].text
    assert len(lp.tokens) == len(lp.token_logprobs) == len(lp.top_logprobs) == len(lp.text_offset) == 6
    assert lp.text_offset == [sum(map(len, lp.tokens[:i])) for i in range(6)]
    for token, logprob, top in zip(lp.tokens, lp.token_logprobs, lp.top_logprobs):
        assert len(top) == 2 and max(top.values()) == pytest.approx(logprob) and top[token] == pytest.approx(logprob)


def json_reply(oai, content: str, response_format: dict, **kw):
    """The reply to one user message under ``response_format``, ended by the model itself, parsed."""
    r = chat(oai, messages=[{"role": "user", "content": content}], response_format=response_format, **kw)
    assert r.choices[0].finish_reason == "stop"
    return json.loads(r.choices[0].message.content)


def test_json_schema_output_validates(oai):
    person_format = {"type": "json_schema", "json_schema": {"name": "person", "schema": PERSON_SCHEMA}}
    person = json_reply(oai, "Describe a programmer as JSON.", person_format, temperature=0, max_tokens=150)
    assert set(person) == {"name", "age", "languages"}
    assert isinstance(person["name"], str) and type(person["age"]) is int
    assert all(isinstance(x, str) for x in person["languages"])


def json_schema(schema: dict) -> dict:
    return {"type": "json_schema", "json_schema": {"name": "x", "schema": schema}}


def test_json_schema_counts_up_to_the_limit_are_enforced(oai):
    # 3 + 4 + 1000 + 1000 of the 2048 allowed; llama.cpp itself refuses a single count much above 1000.
    schema = {
        "type": "object",
        "properties": {
            "code": {"type": "string", "pattern": "^[A-Z]{3}-[0-9]{4}$"},
            "notes": {"type": "string", "maxLength": 1000},
            "tags": {"type": "array", "items": {"type": "string"}, "maxItems": 1000},
        },
        "required": ["code"],
    }
    code = json_reply(oai, "Give a product code.", json_schema(schema), temperature=0, max_tokens=40)["code"]
    assert re.fullmatch(r"[A-Z]{3}-[0-9]{4}", code)


def test_json_object_output_parses(oai):
    fmt = {"type": "json_object"}
    assert isinstance(json_reply(oai, "Describe a person.", fmt, temperature=0.7, seed=3, max_tokens=150), dict)


def test_vanishing_temperature_is_greedy(oai, http):
    # Divided by a subnormal float32, logits overflow and every probability is NaN:
    # such a temperature is taken as 0, grammar or not.
    restarts = health(http)["restarts"]["engine"]
    kw = dict(messages=[{"role": "user", "content": "Describe a person."}], max_tokens=20, seed=1)
    fmt = {"type": "json_object"}
    assert (
        chat(oai, temperature=1e-40, **kw).choices[0].message.content
        == chat(oai, temperature=0, **kw).choices[0].message.content
    )
    tiny = chat(oai, temperature=1e-40, response_format=fmt, **kw).choices[0].message.content
    assert tiny == chat(oai, temperature=0, response_format=fmt, **kw).choices[0].message.content
    assert health(http)["restarts"]["engine"] == restarts


def test_grammar_dead_end_is_a_bad_request(oai):
    # A pattern no character matches: after the opening quote the grammar allows no token,
    # which the engine can only find out while generating.
    never = {
        "type": "json_schema",
        "json_schema": {"name": "never", "schema": {"type": "string", "pattern": "^[^\\x00-\\U0010FFFF]$"}},
    }
    kw = dict(messages=CONVERSATION[:2], temperature=0, max_tokens=10, response_format=never)
    with pytest.raises(openai.BadRequestError) as e:
        chat(oai, **kw)
    assert e.value.body["param"] == "response_format"
    with pytest.raises(openai.APIError, match="grammar"):
        list(oai.chat.completions.create(model=MODEL, stream=True, **kw))


def test_logit_bias_and_penalties_steer_the_output(oai, http):
    [token] = http.post("/encode", json={"text": " banana"}).json()["data"]["tokens"]
    kw = dict(prompt="Once upon a time", max_tokens=6, temperature=0, extra_body={"ignore_eos": True})
    assert complete(oai, logit_bias={str(token): 100}, **kw).choices[0].text == " banana" * 6
    # A list is where greedy decoding repeats itself, so the penalties show quickly.
    kw = dict(prompt="Fruits: apple, banana, apple, banana, apple,", max_tokens=12, temperature=0)
    plain = complete(oai, **kw).choices[0].text
    assert complete(oai, frequency_penalty=2.0, **kw).choices[0].text != plain
    assert complete(oai, presence_penalty=2.0, **kw).choices[0].text != plain


def test_sampling_parameters_are_accepted(oai):
    r = chat(
        oai,
        temperature=0.5,
        top_p=0.8,
        max_completion_tokens=10,
        seed=3,
        user="u1",
        extra_body={"top_k": 5, "min_p": 0.05, "repetition_penalty": 1.3, "ignore_eos": True},
    )
    assert r.usage.completion_tokens == 10 and r.choices[0].finish_reason == "length"


@pytest.mark.parametrize(
    "kw,param",
    [
        (dict(temperature=5), "temperature"),
        (dict(extra_body={"repetition_penalty": 1e-323}), "repetition_penalty"),
        (dict(n=0), "n"),
        (dict(top_logprobs=21, logprobs=True), "top_logprobs"),
        (dict(top_logprobs=2), "top_logprobs"),
        (dict(stop=["a", "b", "c", "d", "e"]), "stop"),
        (dict(messages=[{"role": "wizard", "content": "hi"}]), "messages[0].role"),
        (dict(messages=[{"role": "user"}]), "messages[0].content"),
        (dict(messages=[]), "messages"),
        (dict(logit_bias={"999999": 5}), "logit_bias"),
        (
            dict(response_format={"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "wat"}}}),
            "response_format",
        ),
        (dict(response_format={"type": "json_object"}, extra_body={"ignore_eos": True}), "ignore_eos"),
        # Counts the converter writes out copy by copy: a few bytes asking for a grammar of gigabytes.
        # overflowed the C stack
        (dict(response_format=json_schema({"type": "string", "maxLength": 20000})), "response_format"),
        (dict(response_format=json_schema({"type": "array", "maxItems": 10**9})), "response_format"),
        (dict(response_format=json_schema({"type": "string", "minLength": 10**30})), "response_format"),
        (dict(response_format=json_schema({"type": "string", "pattern": "^(ab){+999_999_999}$"})), "response_format"),
        (
            dict(
                response_format=json_schema(
                    {"type": "array", "items": {"type": "string", "maxLength": 1500}, "maxItems": 1000}
                )
            ),
            "response_format",
        ),
        (dict(max_tokens=100000), "max_tokens"),
        (dict(messages=[{"role": "user", "content": "word " * 600}]), "messages"),
    ],
)
def test_invalid_chat_requests_raise_bad_request(oai, kw, param):
    kw = {"messages": CONVERSATION[:2], "max_tokens": 3, **kw}
    with pytest.raises(openai.BadRequestError) as e:
        oai.chat.completions.create(model=MODEL, **kw)
    assert e.value.status_code == 400
    assert e.value.body["param"] == param
    assert e.value.body["type"] == "invalid_request_error" and e.value.body["message"]


def test_invalid_completion_requests_raise_bad_request(oai):
    for kw, param in [
        (dict(prompt=[]), "prompt"),
        (dict(prompt=[10**7]), "prompt"),
        (dict(prompt="x", max_tokens=0), "max_tokens"),
        (dict(prompt="x", logprobs=6), "logprobs"),
        (dict(prompt="x", best_of=3), "best_of"),
    ]:
        with pytest.raises(openai.BadRequestError) as e:
            complete(oai, **kw)
        assert e.value.body["param"] == param


def test_v1_errors_have_openai_shape(http):
    r = http.post("/v1/chat/completions", content=b"{nope", headers={"content-type": "application/json"})
    assert r.status_code == 400
    assert set(r.json()["error"]) == {"message", "type", "param", "code"}
    r = http.get("/v1/nothing")
    assert r.status_code == 404
    assert r.json() == {
        "error": {
            "message": "not found: GET /v1/nothing",
            "type": "invalid_request_error",
            "param": None,
            "code": "not_found",
        }
    }
    assert http.get("/v1/chat/completions").status_code == 405
    # cLLM's own shape
    assert http.get("/nothing").json() == {"success": False, "error": "not found", "message": "GET /nothing"}


def test_server_still_serves_after_bad_requests(oai):
    assert complete(oai, prompt="Hello", max_tokens=3, temperature=0).usage.completion_tokens == 3
