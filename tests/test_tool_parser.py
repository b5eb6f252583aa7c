"""The tool-call parser on outputs written by real models, fed whole and in pieces.

A parser has nothing to do with the engine, so these feed it text directly:
outputs as Qwen2.5 (Hermes tags), Llama 3.1, Mistral and the generic form
write them, cut into pieces of every size, must give the same text and calls.
"""

from __future__ import annotations

import json

import pytest

from frontend_proc.tool_parser import ToolCallDelta, ToolCallParser
from frontend_proc.tools import GENERIC, HERMES, LLAMA3, MISTRAL

QWEN_TWO_CALLS = (
    "I'll check both cities.\n"
    '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris", "unit": "celsius"}}\n</tool_call>\n'
    '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Berlin", "unit": "celsius"}}\n</tool_call>'
)
LLAMA31_CALL = '{"name": "get_weather", "parameters": {"city": "Paris", "tags": ["a}", "b\\"]"]}}'
MISTRAL_CALLS = (
    '[TOOL_CALLS][{"name": "get_weather", "arguments": {"city": "Paris"}, "id": "a1b2c3d4e"}, '
    '{"name": "add", "arguments": {"a": 1, "b": 2}, "id": "f5g6h7i8j"}]'
)
GENERIC_CALL = '<tool_call>{"arguments": {"q": "cllm"}, "name": "search"}</tool_call>'


def parse(fmt, text: str, step: int) -> tuple[str, list[dict], list]:
    """(content, calls reassembled from the deltas, the parser's own calls), feeding `step` characters at a time."""
    parser = ToolCallParser(fmt)
    events = []
    for i in range(0, len(text), step):
        events += parser.feed(text[i : i + step])
    events += parser.finish()
    calls: list[dict] = []
    for e in events:
        if isinstance(e, ToolCallDelta):
            if e.id is not None:
                assert e.index == len(calls) and e.arguments == ""  # a call opens with its id and name only
                calls.append({"id": e.id, "name": e.name, "arguments": ""})
            else:
                calls[e.index]["arguments"] += e.arguments
    return "".join(e for e in events if isinstance(e, str)), calls, parser.calls


STEPS = [1, 2, 3, 7, 1000]


@pytest.mark.parametrize("step", STEPS)
def test_hermes_text_then_two_calls(step):
    content, calls, whole = parse(HERMES, QWEN_TWO_CALLS, step)
    assert content == "I'll check both cities.\n"
    assert [(c["name"], json.loads(c["arguments"])) for c in calls] == [
        ("get_weather", {"city": "Paris", "unit": "celsius"}),
        ("get_weather", {"city": "Berlin", "unit": "celsius"}),
    ]
    assert [(c.id, c.name, c.arguments) for c in whole] == [(c["id"], c["name"], c["arguments"]) for c in calls]
    assert len({c["id"] for c in calls}) == 2


@pytest.mark.parametrize("step", STEPS)
def test_llama3_call_with_braces_and_quotes_in_strings(step):
    content, calls, _ = parse(LLAMA3, "  " + LLAMA31_CALL, step)
    assert content == ""
    assert calls[0]["name"] == "get_weather"
    assert json.loads(calls[0]["arguments"]) == {"city": "Paris", "tags": ["a}", 'b"]']}


@pytest.mark.parametrize("step", STEPS)
def test_llama3_plain_answer_is_text(step):
    text = "The weather in Paris is mild. {not a call}"
    assert parse(LLAMA3, text, step)[:2] == (text, [])


@pytest.mark.parametrize("step", STEPS)
def test_mistral_array_of_calls(step):
    content, calls, _ = parse(MISTRAL, MISTRAL_CALLS, step)
    assert content == ""
    assert [(c["name"], json.loads(c["arguments"])) for c in calls] == [("get_weather", {"city": "Paris"}), ("add", {"a": 1, "b": 2})]


@pytest.mark.parametrize("step", STEPS)
def test_generic_arguments_before_name(step):
    """Without a grammar a model may put the arguments first: they are passed on once the name is known."""
    content, calls, _ = parse(GENERIC, GENERIC_CALL + " Done.", step)
    assert content == " Done."
    assert [(c["name"], json.loads(c["arguments"])) for c in calls] == [("search", {"q": "cllm"})]


def test_arguments_written_as_a_json_string():
    _, calls, _ = parse(HERMES, '<tool_call>{"name": "f", "arguments": "{\\"x\\": 1}"}</tool_call>', 1)
    assert json.loads(calls[0]["arguments"]) == {"x": 1}


@pytest.mark.parametrize("step", STEPS)
def test_text_that_only_looks_like_a_call_is_given_back(step):
    for text in ["a <tool_ b", "<tool_call>not json</tool_call> after", '<tool_call>{"arguments": {}}</tool_call>', "ends with <tool_c"]:
        content, calls, _ = parse(HERMES, text, step)
        assert (content, calls) == (text, [])


def test_call_cut_short_keeps_what_was_streamed():
    """max_tokens ending a call: the arguments so far are the call's (the finish_reason says `length`)."""
    content, calls, whole = parse(GENERIC, '<tool_call>{"name": "a", "arguments": {"q": "x', 1)
    assert content == "" and calls[0]["arguments"] == whole[0].arguments == '{"q": "x'


def test_text_is_held_back_only_while_it_may_open_a_call():
    parser = ToolCallParser(HERMES)
    assert parser.feed("Hello <tool") == ["Hello "]
    assert parser.feed("box>") == ["<toolbox>"]
