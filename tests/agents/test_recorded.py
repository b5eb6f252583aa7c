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

from tests.agents.chat_bodies import anthropic_chat_body, chat_body
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
