"""What real clients send, beyond the docs: the bodies Claude Code and Codex CLI sent, and each leniency rule they need.

tests/fixtures/clients/ holds their requests as recorded by tests/agents/record.py
(claude-code 2.1.328, codex 0.169.0): a plain turn, and the turn after a call
to one of their tools. Each is read whole here (decoded, rendered, tokenized);
tests/agents/test_recorded.py generates from them in `make test-agents`. The rule: what is malformed is
a 400 naming it; what is merely new (a system message inside `messages`, a
kind of tool or content block not known here) is taken as meant or skipped.
"""

from __future__ import annotations

import json
import os
import re

import anthropic
import pytest

from tests.conftest import wait_idle

FIXTURES = os.path.join(os.path.dirname(os.path.abspath(__file__)), "fixtures", "clients")
RECORDED = ["claude-code-plain", "claude-code-tool-result", "codex-plain", "codex-tool-result"]
USER = [{"role": "user", "content": "What is the capital of France?"}]


def recorded(name: str) -> dict:
    with open(os.path.join(FIXTURES, f"{name}.json"), encoding="utf-8") as f:
        return json.load(f)


@pytest.mark.parametrize("name", RECORDED)
def test_a_recorded_request_is_read_whole(http, name):
    """Each body decodes, renders and tokenizes: Claude Code's are counted, Codex's are refused only for their length
    (~6-12k tokens, past the shared server's 512-cell sequences). `make test-agents` generates from them whole
    (tests/agents/test_recorded.py): a long prefill, kept out of `make test`."""
    rec = recorded(name)
    if rec["path"].startswith("/v1/messages"):
        counted = {k: v for k, v in rec["body"].items() if k not in ("max_tokens", "stream", "metadata")}
        r = http.post("/v1/messages/count_tokens", json=counted, headers=rec["headers"])
        assert r.status_code == 200 and r.json()["input_tokens"] > 1000, r.text
    else:
        r = http.post(rec["path"], json={**rec["body"], "max_output_tokens": 8}, headers=rec["headers"])
        assert r.status_code == 400 and r.json()["error"]["code"] == "context_length_exceeded", r.text


# ---- each rule on its own, on the shared server (count_tokens renders the prompt without generating)


def count(claude: anthropic.Anthropic, **body) -> int:
    return claude.messages.count_tokens(model="any", **{"messages": USER, **body}).input_tokens


@pytest.fixture(scope="module")
def claude(server):
    with anthropic.Anthropic(base_url=server.url, api_key="unused", max_retries=0) as client:
        yield client


def test_system_messages_inside_messages_join_the_system_prompt_in_order(claude):
    inside = [
        USER[0],
        {"role": "system", "content": [{"type": "text", "text": "Be brief.", "cache_control": {"type": "ephemeral"}}]},
        {"role": "system", "content": "Answer in French."},
    ]
    assert count(claude, system="You help.", messages=inside) == count(
        claude, system="You help.\n\nBe brief.\n\nAnswer in French."
    )
    assert count(claude, messages=inside) == count(claude, system="Be brief.\n\nAnswer in French.")
    billing = {"type": "text", "text": "x-anthropic-billing-header: cc_version=2.1.328.b7f; cc_entrypoint=sdk-cli;"}
    assert count(claude, system=[billing, {"type": "text", "text": "You help."}]) == count(claude, system="You help.")
    with pytest.raises(anthropic.BadRequestError, match="user or assistant"):
        count(claude, messages=[{"role": "system", "content": "Only a system prompt."}])
    with pytest.raises(anthropic.BadRequestError, match="only text"):
        count(claude, messages=[*USER, {"role": "system", "content": [{"type": "image", "source": {}}]}])
    with pytest.raises(anthropic.BadRequestError, match="role"):
        count(claude, messages=[{"role": "robot", "content": "Hi"}])


def test_unknown_content_blocks_are_skipped_and_malformed_ones_refused(claude):
    new = {"type": "server_tool_use_2030", "id": "x", "anything": [1, 2]}
    text = {
        "type": "text",
        "text": "What is the capital of France?",
        "cache_control": {"type": "ephemeral"},
        "citations": None,
    }
    assert count(claude, messages=[{"role": "user", "content": [new, text]}]) == count(claude)
    result = [
        {
            "type": "tool_result",
            "tool_use_id": "t1",
            "content": [{"type": "tool_reference", "tool_name": "Read"}, {"type": "text", "text": "42"}],
        }
    ]
    plain = [{"type": "tool_result", "tool_use_id": "t1", "content": [{"type": "text", "text": "42"}]}]
    call = {"role": "assistant", "content": [{"type": "tool_use", "id": "t1", "name": "f", "input": {}}]}
    assert count(claude, messages=[*USER, call, {"role": "user", "content": result}]) == count(
        claude, messages=[*USER, call, {"role": "user", "content": plain}]
    )
    for blocks, where in (
        ([{"text": "no type"}], "content[0]"),
        ([{"type": "text", "text": 3}], "content[0].text"),
        ([{"type": "tool_result", "tool_use_id": "t", "content": [{"type": "text"}]}], "content[0].content[0].text"),
    ):
        with pytest.raises(anthropic.BadRequestError, match=re.escape(f"messages[0].{where}:")):
            count(claude, messages=[{"role": "user", "content": blocks}])


WEATHER = {
    "name": "get_weather",
    "description": "The weather in a city.",
    "input_schema": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
}


def test_server_tools_are_skipped_and_deferred_tools_offered_once_referenced(claude):
    search = {"type": "web_search_20250305", "name": "web_search", "max_uses": 5}
    assert count(claude, tools=[WEATHER, search]) == count(claude, tools=[WEATHER])
    assert count(claude, tools=[{**WEATHER, "type": "custom", "cache_control": {"type": "ephemeral"}}]) == count(
        claude, tools=[WEATHER]
    )
    deferred = {**WEATHER, "name": "get_time", "defer_loading": True}
    assert count(claude, tools=[WEATHER, deferred]) == count(claude, tools=[WEATHER])
    call = {
        "role": "assistant",
        "content": [{"type": "tool_use", "id": "t1", "name": "ToolSearch", "input": {"query": "time"}}],
    }
    found = {
        "role": "user",
        "content": [
            {
                "type": "tool_result",
                "tool_use_id": "t1",
                "content": [{"type": "tool_reference", "tool_name": "get_time"}],
            }
        ],
    }
    conversation = [*USER, call, found]
    undeferred = {k: v for k, v in deferred.items() if k != "defer_loading"}
    assert count(claude, messages=conversation, tools=[WEATHER, deferred]) == count(
        claude, messages=conversation, tools=[WEATHER, undeferred]
    )
    with pytest.raises(anthropic.BadRequestError, match="input_schema"):
        count(claude, tools=[{"name": "no_schema"}])
    # new: ignored
    assert claude.messages.count_tokens(model="any", messages=USER, extra_body={"bogus": 1}).input_tokens == count(
        claude
    )


def test_responses_skip_unknown_tools_and_parts(http):
    def respond(**body) -> dict:
        r = http.post("/v1/responses", json={"max_output_tokens": 1, "temperature": 0, "store": False, **body})
        assert r.status_code == 200, r.text
        return r.json()

    function = {
        "type": "function",
        "name": "get_weather",
        "parameters": WEATHER["input_schema"],
        "strict": False,
        "defer_loading": False,
    }
    unknown = [
        {"type": "namespace", "name": "ns", "tools": [function]},
        {"type": "web_search", "external_web_access": False},
        {"type": "custom", "name": "apply_patch", "format": {"type": "grammar"}},
    ]
    with_all = respond(input="Hi", tools=[*unknown, function], client_metadata={"turn_id": "x"})
    assert [t["name"] for t in with_all["tools"]] == ["get_weather"]
    assert with_all["usage"]["input_tokens"] == respond(input="Hi", tools=[function])["usage"]["input_tokens"]
    parts = [{"type": "input_audio_2030", "data": "..."}, {"type": "input_text", "text": "Hi"}]
    assert (
        respond(input=[{"role": "user", "content": parts}])["usage"]["input_tokens"]
        == respond(input="Hi")["usage"]["input_tokens"]
    )
    for tools, param in (([{"name": "f"}], "tools[0]"), ([{"type": "function", "name": "has space"}], "tools[0].name")):
        r = http.post("/v1/responses", json={"input": "Hi", "tools": tools})
        assert r.status_code == 400 and param in r.json()["error"]["message"], r.text
    wait_idle(http)


def test_tool_schemas_a_grammar_cannot_hold_are_loosened_not_refused(http):
    """Claude Code's Workflow tool: a script of up to 524288 characters, and an argument of any type (a description
    only)."""
    workflow = {
        "type": "object",
        "properties": {
            "script": {"type": "string", "maxLength": 524288},
            "args": {"description": "any JSON value"},
            "tags": {"type": "array", "items": {"type": "string"}, "maxItems": 100000},
        },
    }
    tools = [{"type": "function", "function": {"name": "Workflow", "parameters": workflow}}]
    # Greedy, on a prompt after which SmolLM2 writes a short call and closes it (others fill `tags` to the limit).
    # One call (parallel_tool_calls false): how many it writes otherwise, or what it puts in them, is its choice.
    ask = [{"role": "user", "content": "Run the script `echo hi` with the Workflow tool."}]
    body = {"messages": ask, "tools": tools, "tool_choice": "required", "parallel_tool_calls": False}
    r = http.post("/v1/chat/completions", json={**body, "max_tokens": 100, "temperature": 0, "seed": 1})
    assert r.status_code == 200, r.text
    choice = r.json()["choices"][0]
    assert choice["finish_reason"] == "tool_calls", choice
    (call,) = [c["function"] for c in choice["message"]["tool_calls"]]
    args = json.loads(call["arguments"])  # the loosened schema, held by the grammar
    assert call["name"] == "Workflow" and set(args) <= set(workflow["properties"]), call
    assert isinstance(args.get("script", ""), str) and all(isinstance(t, str) for t in args.get("tags", [])), call
    pattern = {"type": "object", "properties": {"code": {"type": "string", "pattern": "^[a-z]{1,100000}$"}}}
    r = http.post(
        "/v1/chat/completions",
        json={
            "messages": USER,
            "max_tokens": 1,
            "tools": [{"type": "function", "function": {"name": "f", "parameters": pattern}}],
        },
    )
    assert r.status_code == 400 and r.json()["error"]["param"] == "tools[0].function.parameters"
    wait_idle(http)
