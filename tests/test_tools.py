"""Tool calling and structured output with the real `openai` SDK and LangChain, against `cllm serve`.

The embedded SmolLM2's template does not render tools, so these exercise the
generic form (tools described in the system turn, Hermes-style tags) and the
grammar that makes every call valid; the native formats' parsing is covered
by test_tool_parser.py. A template in gpt-oss's harmony format has the model
write its calls in harmony's syntax, read back on every route.
"""

from __future__ import annotations

import json
import re
from typing import Any

import anthropic
import msgspec
import openai
import pytest
from langchain_core.tools import tool
from langchain_openai import ChatOpenAI
from pydantic import BaseModel

from cllm.core.model_file import embedded_model_path
from frontend_proc.chat.tools import GENERIC, HARMONY, HERMES, trigger_pattern
from frontend_proc.chat.turn import render, tool_plan
from frontend_proc.core.template import ChatTemplate
from frontend_proc.core.tokenizer import Tokenizer
from frontend_proc.doors.openai.chat_completions import chat_request
from frontend_proc.doors.openai.schemas import ChatCompletionRequest
from perf import tool_call_latency
from tests.conftest import start_server, wait_idle
from tests.near_tie import greedy

MODEL = "SmolLM2-135M-Instruct.Q4_1"
WEATHER: dict[str, Any] = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "The current weather in a city",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string"}, "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]}},
            "required": ["city", "unit"],
        },
    },
}
ADD = {"type": "function", "function": tool_call_latency.ADD}  # the benchmark's tool: add two integers


@pytest.fixture(scope="module")
def llm(server):
    return ChatOpenAI(
        base_url=server.url + "/v1", api_key="unused", model=MODEL, temperature=0, max_retries=0, timeout=300
    )


def chat(oai, content: str | list, **kw):
    messages = [{"role": "user", "content": content}] if isinstance(content, str) else content
    return oai.chat.completions.create(model=MODEL, messages=messages, temperature=0, **kw)


def check_add(call) -> dict:
    assert call.type == "function" and call.function.name == "add" and call.id.startswith("call_")
    args = json.loads(call.function.arguments)
    assert set(args) == {"a", "b"} and all(type(v) is int for v in args.values())
    return args


def test_required_gives_one_valid_call(oai):
    reply = chat(
        oai, "What is the weather in Paris?", tools=[WEATHER, ADD], tool_choice="required", parallel_tool_calls=False
    )
    choice = reply.choices[0]
    assert choice.finish_reason == "tool_calls" and choice.message.content is None
    (call,) = choice.message.tool_calls
    args = json.loads(call.function.arguments)
    if call.function.name == "get_weather":
        assert set(args) == {"city", "unit"} and type(args["city"]) is str and args["unit"] in ("celsius", "fahrenheit")
    else:
        check_add(call)


def test_named_tool_is_the_one_called(oai):
    """The question is about weather; the named tool is called all the same, with arguments of its schema (each call:
    parallel calls are allowed, and how many the model writes is its choice)."""
    reply = chat(
        oai,
        "What is the weather in Paris?",
        tools=[WEATHER, ADD],
        tool_choice={"type": "function", "function": {"name": "add"}},
    )
    calls = reply.choices[0].message.tool_calls
    assert calls
    for call in calls:
        check_add(call)
    assert reply.choices[0].finish_reason == "tool_calls"


CITY_CODES = ["FR-PARIS", "UK-LONDON", "DE-BERLIN"]


def weather_history() -> list:
    """Two earlier turns whose calls name cities plainly, which SmolLM2 then imitates: `{"city": "Paris"}`."""
    messages: list = []
    for i, city in enumerate(["London", "Berlin"]):
        call = {
            "id": f"call_{i}",
            "type": "function",
            "function": {"name": "get_weather", "arguments": json.dumps({"city": city})},
        }
        messages += [
            {"role": "user", "content": f"Weather in {city}?"},
            {"role": "assistant", "content": None, "tool_calls": [call]},
            {"role": "tool", "tool_call_id": f"call_{i}", "content": "15 C"},
            {"role": "assistant", "content": f"15 C in {city}."},
        ]
    return [*messages, {"role": "user", "content": "Weather in Paris?"}]


def test_auto_call_is_held_to_the_schema(oai, http):
    """auto: the model starts a call on its own, and the lazy grammar holds it to the schema from there.

    The schema takes only city codes. Without tools, the same history makes the
    model write the call as text with `Paris` in it; with tool_choice auto the
    call it makes names a code. Both rest on the model's greedy choice up to
    there, each token checked clear of a near tie (>= 3.7 nats on the shared server).
    """
    codes = json.loads(json.dumps(WEATHER))
    codes["function"]["parameters"] = {
        "type": "object",
        "properties": {"city": {"enum": CITY_CODES}},
        "required": ["city"],
    }
    greedy(http, {"messages": weather_history(), "tools": [codes], "tool_choice": "none"}, until='"city": "Paris"')
    free = chat(oai, weather_history(), tools=[codes], tool_choice="none")
    assert '"city": "Paris"' in free.choices[0].message.content  # what the model writes unconstrained
    greedy(http, {"messages": weather_history(), "tools": [codes], "parallel_tool_calls": False}, until="<tool_call>")
    reply = chat(oai, weather_history(), tools=[codes], parallel_tool_calls=False)
    (call,) = reply.choices[0].message.tool_calls
    assert call.function.name == "get_weather" and json.loads(call.function.arguments)["city"] in CITY_CODES
    assert reply.choices[0].finish_reason == "tool_calls"


def test_auto_answers_in_text_when_it_calls_nothing(oai, http):
    """Its greedy reply cut at 7 tokens, "The capital of France is Paris.", each clear of a near tie: the reply's end
    is left out, since where it ends is a row near_tie cannot show (a request with tools may not ignore its end)."""
    question = [{"role": "user", "content": "What is the capital of France?"}]
    said = greedy(http, {"messages": question, "tools": [WEATHER], "max_tokens": 7}).text
    reply = chat(oai, question, tools=[WEATHER], max_tokens=7)
    choice = reply.choices[0]
    assert choice.message.tool_calls is None and choice.message.content == said and "Paris" in said


def test_streamed_call_is_reassembled_by_the_sdk(oai):
    kw = dict(model=MODEL, messages=[{"role": "user", "content": "What is 2 plus 3?"}], temperature=0)
    kw.update(tools=[ADD], tool_choice="required", parallel_tool_calls=False)
    with oai.chat.completions.stream(**kw) as stream:
        chunks = [event.chunk for event in stream if event.type == "chunk"]
        final = stream.get_final_completion()
    (call,) = final.choices[0].message.tool_calls
    assert final.choices[0].finish_reason == "tool_calls"
    whole = oai.chat.completions.create(**kw).choices[0].message.tool_calls[0]
    assert check_add(call) == json.loads(whole.function.arguments)
    # As OpenAI streams a call: id, type and name first, then the arguments in fragments.
    deltas = [tc for ch in chunks for c in ch.choices for tc in c.delta.tool_calls or ()]
    assert deltas[0].id == call.id and deltas[0].function.name == "add" and deltas[0].type == "function"
    assert deltas[0].function.arguments == "" and len(deltas) > 2
    assert all(d.index == 0 and d.id is None and d.function.name is None for d in deltas[1:])
    assert "".join(d.function.arguments for d in deltas[1:]) == call.function.arguments


def test_agent_loop(oai, http):
    """Call, run the tool, send the result back (the SDK's message object as it came), get the answer: it starts
    with the result, each of its tokens clear of a near tie (after "What is 12 plus 30?" the "4" led by 0.57 nats,
    and where the answer ends after "42" was a tie: it ended there, or went on " is a special number ...")."""
    messages: list = [{"role": "user", "content": "What is 20 plus 22?"}]
    first = chat(oai, messages, tools=[ADD], tool_choice="required", parallel_tool_calls=False).choices[0].message
    (call,) = first.tool_calls
    args = check_add(call)
    result = str(args["a"] + args["b"])
    messages += [first, {"role": "tool", "tool_call_id": call.id, "content": result}]
    answer = chat(oai, messages, tools=[ADD], max_tokens=60).choices[0]
    sent = [messages[0], first.model_dump(exclude_none=True), messages[2]]
    greedy(http, {"messages": sent, "tools": [ADD], "max_tokens": 60}, until=result)
    assert answer.message.content.startswith(result), answer


class GetWeather(BaseModel):
    city: str
    days: int


class Person(BaseModel):
    name: str
    age: int


def test_sdk_parse_with_pydantic(oai):
    messages = [{"role": "user", "content": "Weather in Paris for the next 3 days?"}]
    reply = oai.chat.completions.parse(
        model=MODEL,
        messages=messages,
        tools=[openai.pydantic_function_tool(GetWeather)],
        tool_choice="required",
        parallel_tool_calls=False,
        temperature=0,
    )
    assert isinstance(reply.choices[0].message.tool_calls[0].function.parsed_arguments, GetWeather)
    messages = [{"role": "user", "content": "Describe a programmer named Ada, aged 36."}]
    person = oai.chat.completions.parse(model=MODEL, messages=messages, response_format=Person, temperature=0)
    assert isinstance(person.choices[0].message.parsed, Person)


@tool
def multiply(a: int, b: int) -> int:
    """Multiply two integers."""
    return a * b


def test_langchain_bind_tools(llm):
    for choice in ("multiply", "any"):
        reply = llm.bind_tools([multiply], tool_choice=choice, parallel_tool_calls=False).invoke("What is 6 times 7?")
        (call,) = reply.tool_calls
        assert (
            call["name"] == "multiply"
            and set(call["args"]) == {"a", "b"}
            and all(type(v) is int for v in call["args"].values())
        )
        assert multiply.invoke(call["args"]) == call["args"]["a"] * call["args"]["b"]
    chunks = list(
        llm.bind_tools([multiply], tool_choice="multiply", parallel_tool_calls=False).stream("What is 6 times 7?")
    )
    streamed = sum(chunks[1:], chunks[0])
    assert [c["name"] for c in streamed.tool_calls] == ["multiply"] and set(streamed.tool_calls[0]["args"]) == {
        "a",
        "b",
    }


@pytest.mark.parametrize("method", ["json_schema", "function_calling"])
def test_langchain_structured_output(llm, method):
    person = llm.with_structured_output(Person, method=method).invoke("Describe a programmer named Ada, aged 36.")
    assert isinstance(person, Person)


def bad(http, field: str, **body) -> None:
    body = {"messages": [{"role": "user", "content": "hi"}], **body}
    r = http.post("/v1/chat/completions", json=body)
    assert r.status_code == 400, r.text
    assert r.json()["error"]["param"] == field, r.text


def test_bad_tool_input_is_a_400_naming_the_field(http):
    no_name = {"type": "function", "function": {"parameters": {"type": "object"}}}
    bad(http, "tools[0].function.name", tools=[no_name])
    bad(http, "tools[0].function.name", tools=[{"type": "function", "function": {"name": "has space"}}])
    bad(http, "tool_choice", tools=[ADD], tool_choice={"type": "function", "function": {"name": "nope"}})
    bad(http, "tool_choice", tool_choice="required")
    # counts are loosened, patterns not
    huge = {"type": "object", "properties": {"xs": {"type": "string", "pattern": "^[0-9]{1,100000}$"}}}
    bad(
        http,
        "tools[1].function.parameters",
        tools=[ADD, {"type": "function", "function": {"name": "f", "parameters": huge}}],
    )
    bad(
        http,
        "tools[0].function.parameters",
        tools=[{"type": "function", "function": {"name": "f", "parameters": {"$ref": "https://example.com/s.json"}}}],
    )
    bad(http, "response_format", tools=[ADD], tool_choice="required", response_format={"type": "json_object"})
    bad(http, "messages[0].content", messages=[{"role": "assistant", "content": None}])
    bad(http, "messages[0].tool_call_id", messages=[{"role": "tool", "content": "42"}])
    bad(
        http,
        "messages[0].tool_calls",
        messages=[
            {
                "role": "user",
                "content": "x",
                "tool_calls": [{"id": "c", "type": "function", "function": {"name": "add", "arguments": "{}"}}],
            }
        ],
    )
    assert (
        http.post(
            "/v1/chat/completions", json={"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
        ).status_code
        == 200
    )
    wait_idle(http)


def test_tokenize_and_detokenize_in_llama_servers_shapes(http):
    text = "Hello <|im_end|> héllo"
    tokens = http.post("/tokenize", json={"content": text}).json()["tokens"]
    assert tokens == http.post("/encode", json={"text": text}).json()["data"]["tokens"]
    assert http.post("/detokenize", json={"tokens": tokens}).json() == {"content": text}
    pieces = http.post("/tokenize", json={"content": text, "with_pieces": True}).json()["tokens"]
    assert [p["id"] for p in pieces] == tokens
    assert "".join(p["piece"] for p in pieces) == text
    r = http.post("/detokenize", json={"tokens": [0, 1 << 20]})
    # llama-server's error shape
    assert r.status_code == 400 and "outside the vocabulary" in r.json()["error"]["message"]


# A template in the style of Qwen2.5's: it renders tools, calls and results itself.
HERMES_TEMPLATE = """{%- if tools %}<|im_start|>system
Tools: <tools>{% for t in tools %}{{ t.function | tojson }}{% endfor %}</tools>
Call one as <tool_call>{"name": ..., "arguments": ...}</tool_call><|im_end|>
{% endif %}
{%- for m in messages %}<|im_start|>{{ m.role }}
{% if m.content %}{{ m.content }}{% endif %}
{%- for c in m.tool_calls or [] %}<tool_call>{{ {"name": c.function.name, "arguments": c.function.arguments} \
| tojson }}</tool_call>{% endfor %}<|im_end|>
{% endfor %}<|im_start|>assistant
"""


def test_a_template_that_renders_tools_gets_them():
    tokenizer = Tokenizer(embedded_model_path())
    template = ChatTemplate(HERMES_TEMPLATE)
    call = {"id": "call_1", "type": "function", "function": {"name": "add", "arguments": '{"a": 1, "b": 2}'}}
    messages = [
        {"role": "user", "content": "1+2?"},
        {"role": "assistant", "tool_calls": [call]},
        {"role": "tool", "tool_call_id": "call_1", "content": "3"},
    ]
    body = chat_request(msgspec.convert({"messages": messages, "tools": [ADD]}, ChatCompletionRequest))
    plan = tool_plan(body, template, tokenizer.vocab)
    assert plan.format is HERMES and plan.triggers == ["(<tool_call>)"] and plan.system_text is None
    prompt = render(template, body, plan)
    assert '"description": "Add two integers"' in prompt  # the tools, as the template writes them
    assert '<tool_call>{"name": "add", "arguments": {"a": 1, "b": 2}}</tool_call>' in prompt  # arguments as an object
    assert "<|im_start|>tool\n3<|im_end|>" in prompt
    assert tool_plan(body, tokenizer.chat_template(), tokenizer.vocab).format is GENERIC  # SmolLM2's


def test_a_control_token_opener_is_shown_to_the_parser():
    """Mistral's [TOOL_CALLS] is a control token, which text leaves out; the parser must see it."""
    tok = Tokenizer(embedded_model_path())
    start = tok.control_token("<|im_start|>")  # a control token of this vocabulary, as [TOOL_CALLS] is of Mistral's
    hello = tok.encode("Hello", add_special=False)
    assert tok.detokenizer().feed([start, *hello]) == "Hello"
    assert tok.detokenizer(frozenset([start])).feed([start, *hello]) == "<|im_start|>Hello"
    assert tok.control_token("<tool_call>") is None and tok.control_token("Hello") is None


# gpt-oss's harmony format, as its template writes it: the tools as a TypeScript namespace, calls as messages to
# them; the generation prompt ends with "<|start|>assistant".
HARMONY_TEMPLATE = """{%- if tools %}<|start|>developer<|message|># Tools
namespace functions {
{% for t in tools %}// {{ t.function.description }}
type {{ t.function.name }} = (_: {{ t.function.parameters | tojson }}) => any;
{% endfor %}}<|end|>{% endif %}
{%- for m in messages %}
{%- if m.tool_calls %}{% for c in m.tool_calls %}<|start|>assistant<|channel|>commentary \
to=functions.{{ c.function.name }} \
<|constrain|>json<|message|>{{ c.function.arguments | tojson }}<|call|>{% endfor %}
{%- elif m.role == 'tool' %}<|start|>functions to=assistant<|channel|>commentary<|message|>{{ m.content }}<|end|>
{%- else %}<|start|>{{ m.role }}<|message|>{{ m.content }}<|end|>{% endif %}
{%- endfor %}
{%- if add_generation_prompt %}<|start|>assistant{% endif %}"""
CITY = {"type": "object", "properties": {"city": {"type": "string", "enum": ["Tokyo", "Paris"]}}, "required": ["city"]}


def test_harmony_calls_on_every_route(tmp_path):
    """A forced call: the grammar has SmolLM2 write it in harmony's syntax (as text: its vocabulary has no such
    control tokens), and each route gives it back as its own tool call, whole and streamed alike."""
    template = tmp_path / "harmony.jinja"
    template.write_text(HARMONY_TEMPLATE)
    question = [{"role": "user", "content": "What is the weather in Tokyo?"}]
    body = chat_request(msgspec.convert({"messages": question, "tools": [WEATHER]}, ChatCompletionRequest))
    plan = tool_plan(body, ChatTemplate(HARMONY_TEMPLATE), Tokenizer(embedded_model_path()).vocab)
    # the template renders the tools; auto is lazy
    assert plan.format is HARMONY and plan.template_tools and plan.triggers
    tool = {
        "type": "function",
        "function": {"name": "get_weather", "description": "The weather in a city", "parameters": CITY},
    }
    with start_server("--parallel", "2", "--ctx-size", "2048", "--chat-template-file", str(template)) as srv:
        with openai.OpenAI(base_url=srv.url + "/v1", api_key="unused", timeout=120, max_retries=0) as oai:
            # SmolLM2 spells the markers out a few characters a token: the header alone takes ~40 tokens.
            kw = {
                "model": MODEL,
                "messages": question,
                "tools": [tool],
                "tool_choice": "required",
                "temperature": 0,
                "max_tokens": 150,
            }
            choice = oai.chat.completions.create(**kw).choices[0]
            assert choice.finish_reason == "tool_calls" and choice.message.content is None
            (call,) = choice.message.tool_calls
            args = json.loads(call.function.arguments)
            assert call.function.name == "get_weather" and args["city"] in ("Tokyo", "Paris")
            chunks = [c.choices[0] for c in oai.chat.completions.create(**kw, stream=True)]
            assert not "".join(c.delta.content or "" for c in chunks) and chunks[-1].finish_reason == "tool_calls"
            streamed = "".join(t.function.arguments or "" for c in chunks for t in c.delta.tool_calls or ())
            assert streamed == call.function.arguments

            rkw = {
                "model": MODEL,
                "input": question[0]["content"],
                "tool_choice": "required",
                "temperature": 0,
                "max_output_tokens": 150,
                "tools": [{"type": "function", "name": "get_weather", "parameters": CITY}],
            }
            (item,) = oai.responses.create(**rkw).output
            assert (item.type, item.name, item.arguments, item.status) == (
                "function_call",
                "get_weather",
                call.function.arguments,
                "completed",
            )
            events = list(oai.responses.create(**rkw, stream=True))
            done = [e for e in events if e.type == "response.function_call_arguments.done"]
            assert [e.arguments for e in done] == [call.function.arguments] and events[-1].type == "response.completed"
            assert not [e for e in events if e.type == "response.output_text.delta"]

        with anthropic.Anthropic(base_url=srv.url, api_key="unused", max_retries=0) as claude:
            akw = {
                "model": MODEL,
                "max_tokens": 150,
                "messages": question,
                "tool_choice": {"type": "any"},
                "extra_body": {"temperature": 0},
                "tools": [{"name": "get_weather", "description": "The weather in a city", "input_schema": CITY}],
            }
            message = claude.messages.create(**akw)
            assert [(b.type, b.name, b.input) for b in message.content] == [("tool_use", "get_weather", args)]
            assert message.stop_reason == "tool_use"
            with claude.messages.stream(**akw) as stream:
                final = stream.get_final_message()
            assert [(b.type, b.input) for b in final.content] == [
                ("tool_use", args)
            ] and final.stop_reason == "tool_use"


def test_harmony_trigger_is_a_recipient_after_a_header():
    """auto's lazy grammar starts at a call's recipient in either header, not at one the reasoning mentions."""
    trigger = re.compile(trigger_pattern(HARMONY))
    calls = [
        " to=functions.",
        "<|channel|>commentary to=functions.",
        "x<|end|><|start|>assistant to=functions.",
        "<|end|><|start|>assistant<|channel|>analysis to=functions.",
    ]
    for text in calls:
        m = trigger.search(text)
        assert m and text[m.start(1) :] == "to=functions.", text
    assert trigger.search("<|channel|>analysis<|message|>I will send it to=functions.get_weather") is None
