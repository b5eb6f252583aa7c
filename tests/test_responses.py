"""OpenAI's Responses API, with the real `openai` SDK's client.responses, against `cllm serve`.

Its tests compare greedy texts (streamed with whole, a chained request with
the same one resent), so the module has a server of its own. On the shared
one its prompts reuse cells that earlier modules' requests left in the prefix
cache, and under flash attention a cell's last bits depend on the chunk that
computed it (docs/internals.md, "What is exact"), which depends on what else
those requests met in the engine's steps. Beside a busy program, three tests
here once met other greedy texts. Here the cache holds only what this
module's own requests, one at a time, left.
"""

from __future__ import annotations

import json

import openai
import pytest

from tests import test_tools
from tests.conftest import SHARED, generated, start_server, wait_idle
from tests.near_tie import CAPITAL
from tests.near_tie import greedy as greedy_said

MODEL = "SmolLM2-135M-Instruct.Q4_1"
HELPFUL = "You are a helpful assistant."  # with it, SmolLM2 answers briefly
PERSON_SCHEMA = {
    "type": "object",
    "properties": {"name": {"type": "string"}, "age": {"type": "integer"}},
    "required": ["name", "age"],
}


@pytest.fixture(scope="module")
def server():
    """Settings as the shared server's."""
    with start_server(*SHARED) as srv:
        yield srv


@pytest.fixture(scope="module")
def http(server):
    with server.client() as c:
        yield c


@pytest.fixture(scope="module")
def oai(server):
    with openai.OpenAI(base_url=server.url + "/v1", api_key="unused", timeout=300, max_retries=0) as client:
        yield client


def greedy(oai, **kw):
    kw.setdefault("instructions", HELPFUL)
    kw.setdefault("max_output_tokens", 40)
    return oai.responses.create(model=MODEL, temperature=0, **kw)


def test_plain(oai, http):
    # A question after one answered in a word: "Paris." and the end, each clear of a tie (the question alone starts
    # on one, "The" -1.65 against "La" -1.78).
    said = greedy_said(http, {"messages": [{"role": "system", "content": HELPFUL}, *CAPITAL], "max_tokens": 40})
    r = greedy(oai, input=CAPITAL)
    assert r.object == "response" and r.status == "completed" and r.id.startswith("resp_")
    assert "Paris" in r.output_text == said.text and said.ended
    (message,) = r.output
    assert message.type == "message" and message.role == "assistant" and message.content[0].type == "output_text"
    assert message.content[0].text == r.output_text
    assert r.usage.input_tokens > 5 and 0 < r.usage.output_tokens < 40
    assert r.usage.total_tokens == r.usage.input_tokens + r.usage.output_tokens
    assert r.usage.output_tokens_details.reasoning_tokens == 0  # no reasoning parser split any off


def test_input_items_and_incomplete(oai):
    items = [{"role": "user", "content": [{"type": "input_text", "text": "What is the capital of France?"}]}]
    r = greedy(oai, input=items, max_output_tokens=3)
    assert r.status == "incomplete" and r.incomplete_details.reason == "max_output_tokens"
    assert r.usage.output_tokens == 3


def test_streamed_events_in_order_and_same_text(oai):
    whole = greedy(oai, input="What is the capital of France?")
    events = list(
        oai.responses.create(
            model=MODEL,
            instructions=HELPFUL,
            input="What is the capital of France?",
            max_output_tokens=40,
            temperature=0,
            stream=True,
        )
    )
    types = [e.type for e in events]
    assert [e.sequence_number for e in events] == list(range(len(events)))
    assert types[:5] == [
        "response.created",
        "response.in_progress",
        "response.output_item.added",
        "response.content_part.added",
        "response.output_text.delta",
    ]
    n = types.count("response.output_text.delta")
    assert types[4 : 4 + n] == ["response.output_text.delta"] * n
    assert types[4 + n :] == [
        "response.output_text.done",
        "response.content_part.done",
        "response.output_item.done",
        "response.completed",
    ]
    assert "".join(e.delta for e in events if e.type == "response.output_text.delta") == whole.output_text
    assert events[-1].response.output_text == whole.output_text and events[-1].response.status == "completed"
    with oai.responses.stream(
        model=MODEL, instructions=HELPFUL, input="What is the capital of France?", max_output_tokens=40, temperature=0
    ) as s:
        assert s.get_final_response().output_text == whole.output_text


# Long enough for the prefix cache, which reuses whole blocks of a prompt.
RULES = (
    HELPFUL + " " + " ".join(f"Rule {i}: answer politely, briefly and truthfully, in plain English." for i in range(20))
)


def test_previous_response_id_continues_the_conversation(oai, http):
    made = generated(http)
    first = greedy(oai, input="My name is Alice.", instructions=RULES)
    made = wait_idle(http, since=made)["engine"]["generated_tokens"]
    resent = greedy(
        oai,
        instructions=RULES,
        input=[
            {"role": "user", "content": "My name is Alice."},
            {"role": "assistant", "content": first.output_text},
            {"role": "user", "content": "What is my name?"},
        ],
    )
    idle = wait_idle(http, since=made)
    hits_before, made = idle["prefix_cache"]["hit_tokens"], idle["engine"]["generated_tokens"]
    second = greedy(oai, input="What is my name?", instructions=RULES, previous_response_id=first.id)
    # The same prompt as resending the conversation: the cache holds the resent one and serves all of it, with the
    # logits its prefill gave (tests/test_repeated_prompt.py checks the text on a held thread count; this shared
    # server's engine may change its count beside a busy program, and with it the last bits of a long decode).
    assert second.usage.input_tokens == resent.usage.input_tokens > first.usage.input_tokens
    assert second.previous_response_id == first.id
    hits = wait_idle(http, since=made)["prefix_cache"]["hit_tokens"]
    cached = second.usage.input_tokens_details.cached_tokens  # the engine's count for this request
    assert hits - hits_before == cached == second.usage.input_tokens


def test_retrieve_delete_and_unknown_ids(oai, http):
    r = greedy(oai, input="Hi", max_output_tokens=5)
    assert oai.responses.retrieve(r.id).output_text == r.output_text
    assert "cllm_responses_stored " in http.get("/metrics").text
    oai.responses.delete(r.id)
    with pytest.raises(openai.NotFoundError):
        oai.responses.retrieve(r.id)
    with pytest.raises(openai.NotFoundError):
        greedy(oai, input="Hi", previous_response_id=r.id)
    unstored = greedy(oai, input="Hi", max_output_tokens=5, store=False)
    with pytest.raises(openai.NotFoundError):
        oai.responses.retrieve(unstored.id)


def test_json_schema_output(oai):
    r = greedy(
        oai,
        input="Describe a programmer.",
        max_output_tokens=60,
        text={"format": {"type": "json_schema", "name": "person", "schema": PERSON_SCHEMA}},
    )
    person = json.loads(r.output_text)
    assert isinstance(person["name"], str) and isinstance(person["age"], int)


def test_bad_requests(oai):
    image = {"role": "user", "content": [{"type": "input_image", "image_url": "data:image/png;base64,AAAA"}]}
    with pytest.raises(openai.BadRequestError, match="not an image") as e:  # 3 bytes
        greedy(oai, input=[image])
    assert e.value.body["param"] == "input[0].content[0].image_url"
    with pytest.raises(openai.BadRequestError, match="not supported"):
        greedy(oai, input=[{"type": "web_search_call", "id": "x"}])
    with pytest.raises(openai.BadRequestError, match="unsupported JSON schema") as e:
        greedy(
            oai,
            input="Hi",
            text={"format": {"type": "json_schema", "name": "x", "schema": {"type": "string", "maxLength": 100000}}},
        )
    assert e.value.body["param"] == "text.format"


WEATHER = {"type": "function", **test_tools.WEATHER["function"]}  # the Responses API's flat shape
# A question the model answers with one call of WEATHER.
ONE_CALL = dict(
    input="What is the weather in Paris?",
    max_output_tokens=60,
    tools=[WEATHER],
    tool_choice="required",
    parallel_tool_calls=False,
)


def test_function_call_and_its_output_round_trip(oai):
    r = greedy(oai, **ONE_CALL)
    (call,) = [o for o in r.output if o.type == "function_call"]
    assert call.name == "get_weather" and call.call_id and r.status == "completed"
    args = json.loads(call.arguments)
    assert set(args) == {"city", "unit"} and args["unit"] in ("celsius", "fahrenheit")
    # The call's output, sent back as an item, continues the conversation (by id, and by resending it all).
    result = {"type": "function_call_output", "call_id": call.call_id, "output": "Sunny, 24 degrees."}
    chained = greedy(
        oai, input=[result], previous_response_id=r.id, max_output_tokens=30, tools=[WEATHER], tool_choice="none"
    )
    resent = greedy(
        oai,
        input=[{"role": "user", "content": "What is the weather in Paris?"}, call.model_dump(), result],
        max_output_tokens=30,
        tools=[WEATHER],
        tool_choice="none",
    )
    assert chained.output_text and chained.output_text == resent.output_text
    assert chained.usage.input_tokens == resent.usage.input_tokens


def test_function_call_streamed(oai):
    whole = greedy(oai, **ONE_CALL)
    events = list(greedy(oai, **ONE_CALL, stream=True))
    types = [e.type for e in events]
    assert "response.function_call_arguments.delta" in types
    (done,) = [e for e in events if e.type == "response.function_call_arguments.done"]
    assert done.arguments == "".join(e.delta for e in events if e.type == "response.function_call_arguments.delta")
    assert done.arguments == [o for o in whole.output if o.type == "function_call"][0].arguments
    assert types[-1] == "response.completed" and events[-1].response.output[-1].type == "function_call"
