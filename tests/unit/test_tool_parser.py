"""The tool-call parser on outputs written by real models, fed whole and in pieces.

A parser has nothing to do with the engine, so these feed it text directly:
outputs as Qwen2.5 (Hermes tags), Llama 3.1, Mistral, gpt-oss (harmony) and
the generic form write them, cut into pieces of every size, must give the same
text and calls.
"""

from __future__ import annotations

import json

import pytest

from frontend_proc.chat.reasoning import REASONING, HarmonySplitter
from frontend_proc.chat.reply import CALL, CONTENT, Reply
from frontend_proc.chat.tool_parser import ToolCallDelta, ToolCallParser, call_parser
from frontend_proc.chat.tools import GENERIC, HARMONY, HERMES, LLAMA3, MISTRAL, ToolPlan

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
    parser = call_parser(fmt)
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
    assert [(c["name"], json.loads(c["arguments"])) for c in calls] == [
        ("get_weather", {"city": "Paris"}),
        ("add", {"a": 1, "b": 2}),
    ]


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
    for text in [
        "a <tool_ b",
        "<tool_call>not json</tool_call> after",
        '<tool_call>{"arguments": {}}</tool_call>',
        "ends with <tool_c",
    ]:
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


# gpt-oss, in harmony (its markers shown): the prompt ends with "<|start|>assistant"; <|call|> ends generation,
# so the text mostly stops at a call's end. (reply, reasoning, answer, calls as (name, arguments)).
HARMONY_CALLS = [
    # Thinking, then a call, the recipient in the channel's header.
    (
        "<|channel|>analysis<|message|>The user wants Tokyo's weather. Call get_weather.<|end|>"
        "<|start|>assistant<|channel|>commentary to=functions.get_weather "
        '<|constrain|>json<|message|>{"location":"Tokyo"}',
        "The user wants Tokyo's weather. Call get_weather.",
        "",
        [("get_weather", {"location": "Tokyo"})],
    ),
    # The recipient in the role's header, the reply's first words; <|call|> shown.
    (
        ' to=functions.get_weather<|channel|>commentary json<|message|>{"location": "Paris", "unit": "c"}<|call|>',
        "",
        "",
        [("get_weather", {"location": "Paris", "unit": "c"})],
    ),
    # Several calls in a row, one after a preamble; a call without arguments.
    (
        "<|channel|>analysis<|message|>Two lookups.<|end|><|start|>assistant<|channel|>commentary<|message|>Checking "
        "both.<|end|>"
        "<|start|>assistant to=functions.get_weather<|channel|>commentary "
        '<|constrain|>json<|message|>{"location":"Oslo"}<|call|>'
        '<|start|>assistant<|channel|>commentary to=functions.get_time <|constrain|>json<|message|>{"tz": "CET"}<|end|>'
        "<|start|>assistant<|channel|>commentary to=functions.ping<|message|><|call|>",
        "Two lookups.",
        "Checking both.",
        [("get_weather", {"location": "Oslo"}), ("get_time", {"tz": "CET"}), ("ping", {})],
    ),
    # A built-in tool's message (not a function) is no call and never text; the final answer is the answer.
    (
        "<|channel|>analysis<|message|>Compute it.<|end|><|start|>assistant<|channel|>analysis to=python "
        "code<|message|>print(6*7)<|end|>"
        "<|start|>assistant<|channel|>final<|message|>It is 42.",
        "Compute it.",
        "It is 42.",
        [],
    ),
    # gpt-oss-20b's stray commentary prefix names the assistant: no call.
    (
        "<|channel|>commentary "
        "to=assistant<|channel|>analysis<|message|>Hm.<|end|><|start|>assistant<|channel|>final<|message|>Hi.",
        "Hm.",
        "Hi.",
        [],
    ),
]


def _harmony_reply(text: str, cuts: list[int], calls: bool = True) -> tuple[str, str, list]:
    """(reasoning, answer, calls as the parts stream them) of a reply fed cut at `cuts`, through the splitter."""
    plan = ToolPlan(HARMONY, None, None, None, None, parse=calls)
    reply = Reply(HarmonySplitter(calls=calls), plan)
    parts = [p for a, b in zip([0, *cuts], [*cuts, len(text)]) for p in reply.feed(text[a:b])] + reply.feed(None)
    streamed: list[list] = []
    for kind, part in parts:
        if kind == CALL and part.id is not None:
            streamed.append([part.name, ""])
        elif kind == CALL:
            streamed[part.index][1] += part.arguments
    assert [(c.name, c.arguments) for c in reply.calls] == [tuple(c) for c in streamed]
    text_of = lambda k: "".join(p for kind, p in parts if kind == k)  # noqa: E731
    return text_of(REASONING), text_of(CONTENT), [(name, json.loads(args)) for name, args in streamed]


@pytest.mark.parametrize("reply,reasoning,answer,calls", HARMONY_CALLS)
def test_harmony_calls_apart_from_reasoning_and_answer_in_every_cut(reply, reasoning, answer, calls):
    """Through the splitter then the parser, as every route reads them; markers split across pieces included."""
    expected = (reasoning, answer, calls)
    assert _harmony_reply(reply, []) == expected
    for cut in range(1, len(reply)):
        assert _harmony_reply(reply, [cut]) == expected, cut
    for size in (1, 2, 3, 5):
        assert _harmony_reply(reply, list(range(size, len(reply), size))) == expected, size


def test_harmony_calls_without_tools_are_dropped():
    """A request that reads no calls (no tools, tool_choice none) gets neither the call nor its text."""
    reasoning, answer, calls = _harmony_reply(HARMONY_CALLS[0][0], [], calls=False)
    assert (reasoning, answer, calls) == (HARMONY_CALLS[0][1], "", [])


@pytest.mark.parametrize("step", STEPS)
def test_harmony_calls_in_text_left_as_written(step):
    """--reasoning-format none: the parser alone reads the calls; the other messages stay text, as written."""
    content, calls, whole = parse(HARMONY, HARMONY_CALLS[2][0], step)
    assert content == (
        "<|channel|>analysis<|message|>Two lookups.<|end|><|start|>assistant<|channel|>commentary<|message|>Checking "
        "both.<|end|>"
    )
    assert [(c["name"], json.loads(c["arguments"])) for c in calls] == HARMONY_CALLS[2][3]
    assert [(c.id, c.name, c.arguments) for c in whole] == [(c["id"], c["name"], c["arguments"]) for c in calls]


def test_harmony_call_cut_short_in_its_header_is_neither_call_nor_text():
    """max_tokens ending a call before its arguments: nothing to report (the finish_reason says `length`)."""
    text = "<|channel|>analysis<|message|>Call it.<|end|><|start|>assistant<|channel|>commentary to=functions.get_wea"
    assert _harmony_reply(text, [20]) == ("Call it.", "", [])
    assert parse(HARMONY, text, 3)[:2] == ("<|channel|>analysis<|message|>Call it.<|end|>", [])


@pytest.mark.parametrize("step", STEPS)
def test_harmony_text_like_a_header_is_given_back(step):
    for text in ["Use <|start|> to start.", "set to=functions.x later", "<|channel|>" + "x" * 300]:
        assert parse(HARMONY, text, step)[:2] == (text, [])
