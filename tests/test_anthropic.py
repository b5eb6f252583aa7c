"""Anthropic's Messages API, with the real `anthropic` SDK as the client, against `cllm serve`."""

from __future__ import annotations

import anthropic
import httpx
import openai
import pytest

from tests import near_tie, test_tools
from tests.conftest import API_KEY
from tests.near_tie import CAPITAL

MODEL = "SmolLM2-135M-Instruct.Q4_1"
QUESTION = [{"role": "user", "content": "What is the capital of France?"}]
HELPFUL = "You are a helpful assistant."  # with it, SmolLM2 answers QUESTION briefly
SYSTEM = "You are a helpful assistant who answers in one sentence."


@pytest.fixture(scope="module")
def claude(server):
    with anthropic.Anthropic(base_url=server.url, api_key="unused", timeout=300, max_retries=0) as client:
        yield client


def greedy(claude, **kw):
    kw.setdefault("messages", QUESTION)
    kw.setdefault("max_tokens", 40)
    kw.setdefault("system", HELPFUL)
    # temperature: sent in the body, as the SDK no longer takes sampling parameters.
    return claude.messages.create(model=MODEL, extra_body={"temperature": 0}, **kw)


def prompt_tokens(usage) -> int:
    """The whole prompt: Anthropic's input_tokens leave out what the cache served."""
    return usage.input_tokens + usage.cache_read_input_tokens + usage.cache_creation_input_tokens


def test_plain_message(claude, http):
    # A question after one answered in a word: "Paris." and the end, each clear of a tie (QUESTION alone starts on
    # one, "The" -1.65 against "La" -1.78).
    said = near_tie.greedy(http, {"messages": [{"role": "system", "content": HELPFUL}, *CAPITAL], "max_tokens": 40})
    message = greedy(claude, messages=CAPITAL)
    assert message.type == "message" and message.role == "assistant" and message.id.startswith("msg_")
    assert message.model == MODEL
    (block,) = message.content
    assert block.type == "text" and "Paris" in block.text == said.text and said.ended
    assert message.stop_reason == "end_turn" and message.stop_sequence is None
    assert prompt_tokens(message.usage) > 5 and 0 < message.usage.output_tokens < 40


def test_max_tokens_stop_reason(claude):
    message = greedy(claude, max_tokens=3)
    assert message.stop_reason == "max_tokens" and message.usage.output_tokens == 3


def test_system_prompt_reaches_the_template(claude, server):
    """The system prompt (a string or text blocks) is rendered as the chat route renders it: same token count."""
    message = greedy(claude, system=SYSTEM)
    blocks = greedy(claude, system=[{"type": "text", "text": SYSTEM}])
    assert blocks.content[0].text == message.content[0].text
    with openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0) as oai:
        chat = oai.chat.completions.create(
            model=MODEL, messages=[{"role": "system", "content": SYSTEM}, *QUESTION], max_tokens=1
        )
    assert prompt_tokens(message.usage) == chat.usage.prompt_tokens
    assert (
        claude.messages.count_tokens(model=MODEL, system=SYSTEM, messages=QUESTION).input_tokens
        == chat.usage.prompt_tokens
    )
    # the template's default system prompt
    assert claude.messages.count_tokens(model=MODEL, messages=QUESTION).input_tokens != chat.usage.prompt_tokens


def test_stop_sequence(claude):
    text = greedy(claude).content[0].text
    word = text.split()[2]
    message = greedy(claude, stop_sequences=["zzz", word])
    assert message.stop_reason == "stop_sequence" and message.stop_sequence == word
    assert message.content[0].text == text[: text.index(word)]


def test_stream_assembled_by_the_sdk(claude):
    whole = greedy(claude, messages=CAPITAL)  # ends clear of a tie (test_plain_message)
    with claude.messages.stream(
        model=MODEL, system=HELPFUL, messages=CAPITAL, max_tokens=40, extra_body={"temperature": 0}
    ) as stream:
        events = [event.type for event in stream]
        final = stream.get_final_message()
    assert final.content[0].text == whole.content[0].text
    assert final.stop_reason == "end_turn" and final.usage.output_tokens == whole.usage.output_tokens
    assert events[0] == "message_start" and events[-1] == "message_stop"
    raw = [
        e for e in events if e in ("content_block_start", "content_block_delta", "content_block_stop", "message_delta")
    ]
    assert raw[0] == "content_block_start" and raw[-2:] == ["content_block_stop", "message_delta"]


def test_a_repeated_prompt_is_read_from_the_cache(claude):
    """The prefix cache's hit: cache_read_input_tokens, and input_tokens only the rest (whole and streamed)."""
    system = "You answer questions about geography. " * 8  # a prompt no other test sends
    first = greedy(claude, system=system, max_tokens=2)
    again = greedy(claude, system=system, max_tokens=2)
    total = prompt_tokens(first.usage)
    assert again.usage.cache_creation_input_tokens == 0 and prompt_tokens(again.usage) == total
    assert (
        again.usage.cache_read_input_tokens > total // 2
        and again.usage.input_tokens == total - again.usage.cache_read_input_tokens
    )
    with claude.messages.stream(
        model=MODEL, system=system, messages=QUESTION, max_tokens=2, extra_body={"temperature": 0}
    ) as stream:
        final = stream.get_final_message()  # message_delta's usage, cumulative, completes message_start's
    assert final.usage.cache_read_input_tokens > total // 2 and prompt_tokens(final.usage) == total


def test_raw_stream_events(server):
    """The wire: named events, a ping after message_start, text deltas in one block."""
    body = {"model": MODEL, "max_tokens": 5, "stream": True, "messages": QUESTION}
    with httpx.stream("POST", server.url + "/v1/messages", json=body, timeout=60) as r:
        names = [line[7:] for line in r.iter_lines() if line.startswith("event: ")]
    # the one ping Anthropic opens with; a slow first token adds keep-alive comments (tests/test_stream_events.py)
    assert names[:3] == ["message_start", "ping", "content_block_start"]
    assert names[3:-3] == ["content_block_delta"] * (len(names) - 6)
    assert names[-3:] == ["content_block_stop", "message_delta", "message_stop"]


def test_count_tokens(claude):
    count = claude.messages.count_tokens(model=MODEL, system=HELPFUL, messages=QUESTION)
    assert count.input_tokens == prompt_tokens(greedy(claude, max_tokens=1).usage)


def test_bad_requests_raise_the_sdk_errors(claude):
    with pytest.raises(anthropic.BadRequestError) as e:
        claude.messages.create(model=MODEL, messages=QUESTION, max_tokens=10, extra_body={"temperature": 1.5})
    assert e.value.body["type"] == "error" and e.value.body["error"]["type"] == "invalid_request_error"
    assert "temperature" in e.value.body["error"]["message"]
    image = {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": "iVBORw0KGgo="}}
    with pytest.raises(anthropic.BadRequestError, match="the PNG is truncated"):  # a PNG's signature alone
        claude.messages.create(model=MODEL, max_tokens=10, messages=[{"role": "user", "content": [image]}])
    with pytest.raises(anthropic.BadRequestError, match="max_tokens"):
        claude.messages.create(model=MODEL, max_tokens=10**7, messages=QUESTION)
    # A field a newer client adds is ignored, not refused (the malformed ones above still are).
    assert (
        claude.messages.create(
            model=MODEL, max_tokens=1, messages=QUESTION, extra_body={"bogus": 1}
        ).usage.output_tokens
        == 1
    )


def test_history_with_thinking_blocks_is_accepted(claude):
    """A conversation sent back as the SDK keeps it: the earlier thinking blocks are not sent to the model."""
    turn = [
        *QUESTION,
        {
            "role": "assistant",
            "content": [{"type": "thinking", "thinking": "Easy.", "signature": ""}, {"type": "text", "text": "Paris."}],
        },
        {"role": "user", "content": [{"type": "text", "text": "And of Italy?"}]},
    ]
    plain = [*QUESTION, {"role": "assistant", "content": "Paris."}, {"role": "user", "content": "And of Italy?"}]
    assert (
        claude.messages.count_tokens(model=MODEL, messages=turn).input_tokens
        == claude.messages.count_tokens(model=MODEL, messages=plain).input_tokens
    )


def test_api_key_as_x_api_key_or_bearer(keyed):
    with anthropic.Anthropic(base_url=keyed.url, api_key=API_KEY, max_retries=0) as good:
        assert good.messages.count_tokens(model=MODEL, messages=QUESTION).input_tokens > 0
    with anthropic.Anthropic(base_url=keyed.url, auth_token=API_KEY, max_retries=0) as bearer:
        assert bearer.messages.count_tokens(model=MODEL, messages=QUESTION).input_tokens > 0
    with anthropic.Anthropic(base_url=keyed.url, api_key="wrong", max_retries=0) as bad:
        with pytest.raises(anthropic.AuthenticationError) as e:
            bad.messages.create(model=MODEL, max_tokens=5, messages=QUESTION)
    assert e.value.body["error"]["type"] == "authentication_error"
    # The SDK sends its api_key as a Bearer token (anthropic 2.x): the x-api-key header itself, as other clients send
    with httpx.Client(base_url=keyed.url, timeout=60) as raw:
        body = {"model": MODEL, "messages": QUESTION}
        for key, status in ((API_KEY, 200), ("wrong", 401)):
            assert raw.post("/v1/messages/count_tokens", json=body, headers={"x-api-key": key}).status_code == status


_FUNCTION = test_tools.WEATHER["function"]
WEATHER_TOOL = {
    "name": _FUNCTION["name"],
    "description": _FUNCTION["description"],
    "input_schema": _FUNCTION["parameters"],
}
WEATHER_QUESTION = [{"role": "user", "content": "What is the weather in Paris?"}]
ANY_ONE = {"type": "any", "disable_parallel_tool_use": True}  # one call, then the end
FORCED_CALL = dict(
    messages=WEATHER_QUESTION, max_tokens=60, tools=[WEATHER_TOOL], tool_choice={"type": "tool", "name": "get_weather"}
)


def valid_weather(args: dict) -> bool:
    """WEATHER_TOOL's input_schema, checked: both keys, a string city, a unit from the enum."""
    return set(args) == {"city", "unit"} and isinstance(args["city"], str) and args["unit"] in ("celsius", "fahrenheit")


def test_forced_tool_input_matches_the_schema(claude):
    message = greedy(claude, **FORCED_CALL)
    assert message.stop_reason == "tool_use"
    (use,) = [b for b in message.content if b.type == "tool_use"]
    assert use.name == "get_weather" and use.id
    assert valid_weather(use.input)


def test_tool_use_streamed_as_input_json_deltas(claude):
    with claude.messages.stream(
        model=MODEL,
        system=HELPFUL,
        messages=WEATHER_QUESTION,
        max_tokens=60,
        tools=[WEATHER_TOOL],
        tool_choice=ANY_ONE,
        extra_body={"temperature": 0},
    ) as stream:
        deltas = [e.delta.type for e in stream if e.type == "content_block_delta"]
        final = stream.get_final_message()
    assert "input_json_delta" in deltas and final.stop_reason == "tool_use"
    whole = greedy(claude, messages=WEATHER_QUESTION, max_tokens=60, tools=[WEATHER_TOOL], tool_choice=ANY_ONE)
    assert [b.model_dump() for b in final.content if b.type == "tool_use"][0]["input"] == whole.content[-1].input
    assert valid_weather(final.content[-1].input)


def test_two_turn_tool_loop(claude):
    first = greedy(claude, **FORCED_CALL)
    use = first.content[-1]
    turn = [
        *WEATHER_QUESTION,
        {"role": "assistant", "content": [b.model_dump(exclude_none=True) for b in first.content]},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": use.id, "content": "Sunny, 24 degrees."}]},
    ]
    second = greedy(claude, messages=turn, max_tokens=40, tools=[WEATHER_TOOL], tool_choice={"type": "none"})
    assert second.stop_reason in ("end_turn", "max_tokens") and second.content[0].type == "text"
    # The call and its result reach the prompt (the reply here repeats the result).
    alone = claude.messages.count_tokens(
        model=MODEL, system=HELPFUL, messages=WEATHER_QUESTION, tools=[WEATHER_TOOL], tool_choice={"type": "none"}
    )
    assert prompt_tokens(second.usage) > alone.input_tokens + 20


def test_bad_tools_are_400s(claude):
    with pytest.raises(anthropic.BadRequestError, match="not one of the tools"):
        greedy(claude, tools=[WEATHER_TOOL], tool_choice={"type": "tool", "name": "nope"})
    with pytest.raises(anthropic.BadRequestError, match="no tools"):
        greedy(claude, tool_choice={"type": "any"})
