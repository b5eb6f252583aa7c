"""The bodies Claude Code and Codex CLI sent (tests/fixtures/clients/, recorded by record.py), generated from whole.

POSTed as they came (only the token limit made small) to a server whose one
sequence holds them (~12k tokens for Claude Code), each is answered 200 with a
well-formed stream in the order these clients read it. The long prefill is why
they run in `make test-agents` (tests/test_clients.py checks in `make test`
that each is read whole); without CLLM_TEST_AGENTS=1 they are skipped.
"""

from __future__ import annotations

import json
import os

import pytest

from tests.test_clients import RECORDED, recorded

if not os.environ.get("CLLM_TEST_AGENTS"):
    pytest.skip("the recorded agents' requests run in `make test-agents`", allow_module_level=True)

LIMIT = 8  # tokens per reply: the prefill is what is tested
GREEDY = {"temperature": 0, "seed": 1}
STOP_REASONS = {"end_turn", "max_tokens", "stop_sequence", "tool_use"}


def events(lines) -> list[tuple[str, dict]]:
    """A Server-Sent Events stream as (event, data) pairs."""
    out, name = [], None
    for line in lines:
        if line.startswith("event: "):
            name = line[7:]
        elif line.startswith("data: "):
            data = json.loads(line[6:])
            assert data["type"] == name, (name, data)
            out.append((name, data))
    return out


def check_anthropic_stream(stream: list[tuple[str, dict]], limit: int) -> dict:
    """message_start, pings, per block start/deltas/stop with indices 0, 1, ..., message_delta, message_stop."""
    names = [n for n, _ in stream if n != "ping"]
    assert names[0] == "message_start" and names[-2:] == ["message_delta", "message_stop"], names
    start = stream[0][1]["message"]
    assert (
        start["role"] == "assistant"
        and start["content"] == []
        and set(start["usage"]) >= {"input_tokens", "output_tokens"}
    )
    index, open_block = -1, None
    for name, data in stream[1:]:
        if name == "content_block_start":
            assert open_block is None and data["index"] == index + 1
            index, open_block = data["index"], data["content_block"]["type"]
        elif name == "content_block_delta":
            assert data["index"] == index and open_block is not None
            assert (
                data["delta"]["type"]
                == {"text": "text_delta", "tool_use": "input_json_delta", "thinking": "thinking_delta"}[open_block]
            )
        elif name == "content_block_stop":
            assert data["index"] == index and open_block is not None
            open_block = None
    assert open_block is None
    end = [d for n, d in stream if n == "message_delta"][0]
    assert end["delta"]["stop_reason"] in STOP_REASONS and index >= 0  # a block: something was said
    # one cut at the limit has all its tokens
    if end["delta"]["stop_reason"] == "max_tokens":
        assert end["usage"]["output_tokens"] == limit
    else:
        assert end["usage"]["output_tokens"] <= limit
    # The prompt: what the prefix cache served is counted apart from the rest (known at the end, not at the start).
    prompt = sum(end["usage"][k] for k in ("input_tokens", "cache_read_input_tokens", "cache_creation_input_tokens"))
    return {"input_tokens": prompt, "output_tokens": end["usage"]["output_tokens"]}


def check_responses_stream(stream: list[tuple[str, dict]], limit: int) -> dict:
    """created, in_progress, items added/deltas/done in order, then completed; sequence numbers 0, 1, ..."""
    names = [n for n, _ in stream]
    assert names[:2] == ["response.created", "response.in_progress"] and names[-1] in (
        "response.completed",
        "response.incomplete",
    ), names
    assert [d["sequence_number"] for _, d in stream] == list(range(len(stream)))
    added = [d["output_index"] for n, d in stream if n == "response.output_item.added"]
    done = [d["output_index"] for n, d in stream if n == "response.output_item.done"]
    assert added == done == list(range(len(added))) and added
    final = stream[-1][1]["response"]
    assert len(final["output"]) == len(added) and {o["type"] for o in final["output"]} <= {
        "message",
        "function_call",
        "reasoning",
    }
    usage = final["usage"]
    assert (
        usage["total_tokens"] == usage["input_tokens"] + usage["output_tokens"]
        and "cached_tokens" in usage["input_tokens_details"]
    )
    assert usage["output_tokens"] <= limit and (names[-1] == "response.completed" or usage["output_tokens"] == limit)
    return usage


def chat_body(body: dict) -> dict:
    """A Responses API body as the chat body it means (developer messages as system ones, calls as tool_calls, their
    outputs as tool messages, only function tools): what /apply-template renders to count its prompt."""
    messages = [{"role": "system", "content": body["instructions"]}] if body.get("instructions") else []
    for item in body["input"]:
        kind = item.get("type", "message")
        if kind == "message":
            content = (
                item["content"] if isinstance(item["content"], str) else "".join(p["text"] for p in item["content"])
            )
            messages.append({"role": "system" if item["role"] == "developer" else item["role"], "content": content})
        elif kind == "function_call":
            if messages[-1]["role"] != "assistant":
                messages.append({"role": "assistant", "content": ""})
            call = {
                "id": item["call_id"],
                "type": "function",
                "function": {"name": item["name"], "arguments": item["arguments"]},
            }
            messages[-1].setdefault("tool_calls", []).append(call)
        elif kind == "function_call_output":
            messages.append({"role": "tool", "tool_call_id": item["call_id"], "content": item["output"]})
    tools = [
        {"type": "function", "function": {k: t[k] for k in ("name", "description", "parameters") if k in t}}
        for t in body.get("tools", [])
        if t["type"] == "function"
    ]
    return {"messages": messages, "tools": tools}


def anthropic_chat_body(body: dict) -> dict:
    """An Anthropic body as the chat body it means: the system blocks but Claude Code's billing one joined with its
    system-role messages, text blocks joined, tool_use blocks as tool_calls and tool_result blocks as tool messages,
    the tools it offers (those with defer_loading not yet referenced left out: these bodies reference none). Written
    here apart from the door, so a door that drops part of the prompt counts less than this."""
    system = body.get("system") or ""
    if isinstance(system, list):
        system = "\n".join(b["text"] for b in system if not b["text"].startswith("x-anthropic-billing-header:"))
    systems, messages = [system] if system else [], []

    def text(content, joiner: str = "") -> str:
        return content if isinstance(content, str) else joiner.join(b["text"] for b in content if b["type"] == "text")

    for message in body["messages"]:
        if message["role"] == "system":
            systems.append(text(message["content"], "\n"))
            continue
        blocks = message["content"] if isinstance(message["content"], list) else []
        for block in blocks:
            if block["type"] == "tool_result":
                messages.append(
                    {"role": "tool", "tool_call_id": block["tool_use_id"], "content": text(block["content"], "\n")}
                )
        calls = [
            {"id": b["id"], "type": "function", "function": {"name": b["name"], "arguments": json.dumps(b["input"])}}
            for b in blocks
            if b["type"] == "tool_use"
        ]
        said = text(message["content"])
        if said or calls or not message["content"]:
            messages.append({"role": message["role"], "content": said, **({"tool_calls": calls} if calls else {})})

    def description(tool: dict) -> dict:
        return {"description": tool["description"]} if "description" in tool else {}

    tools = [
        {"type": "function", "function": {"name": t["name"], "parameters": t["input_schema"]} | description(t)}
        for t in body.get("tools", [])
        if not t.get("defer_loading")
    ]
    return {
        "messages": [{"role": "system", "content": "\n\n".join(systems)}, *messages] if systems else messages,
        "tools": tools,
    }


def prompt_tokens(http, rec: dict) -> int:
    """How many tokens the recorded request's prompt is, rendered and tokenized by the server (/apply-template,
    /tokenize) from the chat body it means: what the door under test read, counted without it."""
    anthropic_api = rec["path"].startswith("/v1/messages")
    r = http.post("/apply-template", json=(anthropic_chat_body if anthropic_api else chat_body)(rec["body"]))
    assert r.status_code == 200, r.text
    return len(http.post("/tokenize", json={"content": r.json()["prompt"], "add_special": True}).json()["tokens"])


@pytest.mark.parametrize("name", RECORDED)
def test_a_recorded_request_is_answered_with_a_well_formed_stream(server, name):
    """Greedy (temperature 0, a seed), so each reply is the same every run: at least one token, the prompt counted
    whole."""
    rec = recorded(name)
    anthropic_api = rec["path"].startswith("/v1/messages")
    body = {**rec["body"], ("max_tokens" if anthropic_api else "max_output_tokens"): LIMIT, **GREEDY}
    with server.client(timeout=1800) as http:
        with http.stream("POST", rec["path"], json=body, headers=rec["headers"]) as r:
            assert r.status_code == 200, r.read()
            stream = events(r.iter_lines())
        n_prompt = prompt_tokens(http, rec)
    usage = (check_anthropic_stream if anthropic_api else check_responses_stream)(stream, LIMIT)
    assert usage["input_tokens"] == n_prompt > 1000 and usage["output_tokens"] >= 1, (usage, n_prompt)
