"""Streams as benchmark harnesses and SDKs read them (docs/internals.md: Streaming), on every streaming door.

Harnesses (llama-benchy, `vllm bench serve`, AIPerf) time TTFT to the first event they can count as a token and
ITL between such events: the first one must carry the first token, each one token at c = 1, and a stream that
waits for its prompt is kept alive with SSE comments, which they skip, never with data events.
"""

from __future__ import annotations

import json
import threading

import anthropic
import httpx
import ollama
import openai
import pytest

from tests.conftest import start_server

MODEL = "SmolLM2-135M-Instruct.Q4_1"
STORY = "Once upon a time"
ASK = [{"role": "user", "content": "Tell me a long story about a dragon."}]


def data_events(lines) -> list[dict]:
    return [json.loads(line[6:]) for line in lines if line.startswith("data: ") and line != "data: [DONE]"]


@pytest.fixture(scope="module")
def oai(server):
    with openai.OpenAI(base_url=server.url + "/v1", api_key="unused", timeout=300, max_retries=0) as client:
        yield client


def test_openai_chat_first_chunk_carries_the_role_and_the_first_token(oai):
    chunks = [c for c in oai.chat.completions.create(model=MODEL, messages=ASK, max_tokens=8, stream=True) if c.choices]
    first = chunks[0].choices[0].delta
    assert first.role == "assistant" and first.content, chunks[0]
    assert all(c.choices[0].delta.role is None for c in chunks[1:])


def test_openai_completion_first_chunk_carries_the_first_token(oai):
    chunks = list(oai.completions.create(model=MODEL, prompt=STORY, max_tokens=8, stream=True))
    assert chunks[0].choices[0].text


def test_responses_open_with_their_protocol_events_then_the_first_token(oai):
    events = list(oai.responses.create(model=MODEL, input=ASK[0]["content"], max_output_tokens=8, stream=True))
    kinds = [e.type for e in events]
    first = kinds.index("response.output_text.delta")
    opening = ["response.created", "response.in_progress", "response.output_item.added", "response.content_part.added"]
    assert kinds[:first] == opening and events[first].delta


def test_anthropic_opens_with_its_protocol_events_then_the_first_token(server):
    with (
        anthropic.Anthropic(base_url=server.url, api_key="unused", timeout=300, max_retries=0) as claude,
        claude.messages.stream(model=MODEL, messages=ASK, max_tokens=8) as stream,
    ):
        events = list(stream)
    kinds = [e.type for e in events]
    first = kinds.index("content_block_delta")
    assert kinds[:first] == ["message_start", "content_block_start"] and events[first].delta.text


def test_ollama_first_line_carries_the_first_token(server):
    client = ollama.Client(host=server.url, timeout=300)
    options = {"num_predict": 8, "temperature": 0}
    chat = next(iter(client.chat(MODEL, messages=ASK, stream=True, options=options)))
    assert chat.message.content and not chat.done
    generate = next(iter(client.generate(MODEL, prompt=STORY, raw=True, stream=True, options=options)))
    assert generate.response and not generate.done


@pytest.mark.parametrize(
    ("path", "body", "text"),
    [
        ("/completion", {"prompt": STORY, "n_predict": 8}, "content"),
        ("/generate_stream", {"prompt": STORY, "max_tokens": 8}, "token"),
    ],
)
def test_native_first_event_carries_the_first_token(http, path, body, text):
    with http.stream("POST", path, json={**body, "stream": True}) as r:
        first = data_events(r.iter_lines())[0]
    assert first[text] and not first.get("stop") and not first.get("done")


@pytest.fixture(scope="module")
def single():
    """One sequence at a time, and a stream interval longer than any request here: what a stream may wait for."""
    with start_server("--parallel", "1", "--ctx-size", "8192", "--stream-interval-ms", "1000") as srv:
        yield srv


def test_one_token_an_event_at_c1(single):
    """One stream alone: every token goes out in an event of its own (the engine wakes the frontend each step)."""
    body = {
        "prompt": STORY,
        "max_tokens": 48,
        "ignore_eos": True,
        "stream": True,
        "temperature": 0,
        "stream_options": {"include_usage": True},
    }
    with httpx.Client(base_url=single.url, timeout=120) as http, http.stream("POST", "/v1/completions", json=body) as r:
        events = data_events(r.iter_lines())
    texts = [e["choices"][0]["text"] for e in events if e["choices"] and e["choices"][0]["text"]]
    tokens = events[-1]["usage"]["completion_tokens"]
    assert tokens == 48 and tokens / len(texts) <= 1.1, (tokens, texts)


# Each door's stream while its prompt waits: the route, the body, and the data events its protocol opens with.
WAITING = {
    "chat": ("/v1/chat/completions", {"model": MODEL, "messages": ASK, "max_tokens": 4}, 0),
    "completions": ("/v1/completions", {"model": MODEL, "prompt": STORY, "max_tokens": 4}, 0),
    "responses": ("/v1/responses", {"model": MODEL, "input": STORY, "max_output_tokens": 4}, 2),
    "messages": ("/v1/messages", {"model": MODEL, "messages": ASK, "max_tokens": 4}, 2),
    "completion": ("/completion", {"prompt": STORY, "n_predict": 4}, 0),
    "generate_stream": ("/generate_stream", {"prompt": STORY, "max_tokens": 4}, 0),
}


def test_a_waiting_stream_is_kept_alive_with_comments_not_data(single):
    """One sequence at a time: streams queued behind a long one hear `: ping` comments (lifecycle.PING_SECONDS
    apart) and nothing else their clients could count, then their replies."""
    long = {"prompt": STORY, "max_tokens": 8000, "ignore_eos": True, "stream": True}
    lines = {door: [] for door in WAITING}
    pinged = {door: threading.Event() for door in WAITING}
    failed: list[BaseException] = []

    def read(url: str, door: str) -> None:
        path, body, _ = WAITING[door]
        try:
            with (
                httpx.Client(base_url=url, timeout=120) as c,
                c.stream("POST", path, json={**body, "stream": True}) as r,
            ):
                for line in r.iter_lines():
                    if line:
                        lines[door].append(line)
                    if line.startswith(":"):
                        pinged[door].set()
        except BaseException as e:  # noqa: BLE001 - raised again in the test's thread
            failed.append(e)
        finally:
            pinged[door].set()

    srv = single
    with (
        httpx.Client(base_url=srv.url, timeout=120) as http,
        http.stream("POST", "/v1/completions", json=long) as busy,
    ):
        busy_lines = busy.iter_lines()  # kept: a dropped iterator closes the response
        assert busy.status_code == 200 and next(busy_lines)  # it runs: the others wait for the one slot
        readers = [threading.Thread(target=read, args=(srv.url, door)) for door in WAITING]
        for t in readers:
            t.start()
        try:
            assert all(e.wait(60) for e in pinged.values()), "a waiting stream heard no keep-alive in 60 s"
        finally:
            busy.close()  # the slot goes to the waiting streams
            for t in readers:
                t.join(120)
    assert not failed, failed[0]
    for door, (_, _, opening) in WAITING.items():
        seen = lines[door]
        data = [i for i, line in enumerate(seen) if line.startswith("data:")]
        pings = [i for i, line in enumerate(seen) if line.startswith(":")]
        assert len(data) > opening and pings and {seen[i] for i in pings} == {": ping"}, (door, seen)
        # the protocol's opening events, then nothing a client reads but comments until the reply begins
        assert sum(i < pings[0] for i in data) == opening and pings[-1] < data[opening], (door, seen)
