"""Open WebUI's Ollama connection, replayed call by call against `cllm serve` on the real model.

Read from Open WebUI's source (github.com/open-webui/open-webui, commit 598282cf75de358215d045c617e70d28bc48929e:
backend/open_webui/routers/ollama.py; the payload and answer conversions in backend/open_webui/utils/payload.py
and utils/response.py, and the task bodies in routers/tasks.py, as stored at later commits 04a8a879 / 074d4883):

start-up and the model list
  GET  /api/version   (the admin's "verify connection"; only an Authorization header, when a key is set):
                      reads `version`, compared as `tuple(map(int, re.sub(r"^v|-.*", "", v).split(".")))`
  GET  /api/tags      (aiohttp, `Content-Type: application/json` on a GET, `response.json()`, which refuses an
                      answer whose Content-Type is not application/json): reads `models[].model` (its key for the
                      model, also the id users pick), `name`; the model picker shows `size`, `details.parameter_size`
                      and `details.quantization_level`
  GET  /api/ps        reads `models[].model` and `expires_at`, parsed with `datetime.fromisoformat`
  POST /api/show      {"model": name}: the answer is handed to the admin page as it is
one chat
  POST /api/chat      Open WebUI appends ":latest" to a model name without a tag, then looks it up among the
                      `model` fields of /api/tags. Body: model, messages (system, user; `tool_call_id`/`thinking`
                      on the messages that have them), stream true, options (temperature, num_predict, stop, seed
                      ... and keys Ollama has but cllm does not use), and at the root keep_alive / format / think
                      lifted out of the options. The stream is read a line at a time (aiohttp's StreamReader),
                      each line `json.loads`ed: message.content, message.thinking, message.tool_calls, done, and on
                      the done line prompt_eval_count, eval_count, eval_duration, prompt_eval_duration,
                      total_duration, load_duration (numbers; it divides them). A non-2xx answer's JSON `error`
                      is shown to the user.
  POST /api/chat      title, tags and follow-up generation: the same model, one user message, stream false, and
                      the task's max_tokens moved to a root `num_predict` (which Ollama, too, ignores); the answer
                      is read like the streamed lines, whole.
and its retrieval (RAG), when Ollama is its embedding engine
  POST /api/embed     {"input": [...], "model", "truncate": true}, `Authorization: Bearer {key}` even when the key is
                      empty; reads `embeddings`.
"""

from __future__ import annotations

import json
import re
from datetime import datetime
from http.client import HTTPConnection
from urllib.parse import urlsplit

import pytest

from tests.test_ollama import NAME

JSON = {"Content-Type": "application/json"}
# What Open WebUI adds when ENABLE_FORWARD_USER_INFO_HEADERS is on: cllm must not mind them.
USER = {
    "X-OpenWebUI-User-Name": "Ada Lovelace",
    "X-OpenWebUI-User-Id": "0b6f8a2e",
    "X-OpenWebUI-User-Email": "ada@example.com",
    "X-OpenWebUI-User-Role": "admin",
    "X-OpenWebUI-Chat-Id": "c7d1b2a4",
}
DONE_NUMBERS = (
    "prompt_eval_count",
    "eval_count",
    "eval_duration",
    "prompt_eval_duration",
    "total_duration",
    "load_duration",
)


def _json(r) -> dict:
    """What aiohttp's response.json() accepts: a 2xx or not, the body must say it is JSON."""
    assert r.headers["content-type"].split(";")[0].strip() == "application/json", r.headers
    return r.json()


def _usage(done: dict) -> dict:
    """Open WebUI's convert_ollama_usage_to_openai, the arithmetic it does on the done line."""
    return {
        "input_tokens": int(done.get("prompt_eval_count", 0)),
        "output_tokens": int(done.get("eval_count", 0)),
        "response_token/s": round(done["eval_count"] / (done["eval_duration"] / 10_000_000) * 100, 2)
        if done.get("eval_duration", 0) > 0
        else "N/A",
        "approximate_total": (done.get("total_duration", 0) or 0) // 1_000_000_000,
    }


def test_start_up_lists_the_model_as_open_webui_reads_it(http):
    version = _json(http.get("/api/version"))["version"]
    assert isinstance(version, str) and tuple(map(int, re.sub(r"^v|-.*", "", version).split(".")))

    tags = _json(http.get("/api/tags", headers={**JSON, **USER}))
    models = {m["model"]: m for m in tags["models"]}
    assert NAME in models and ":" in NAME  # the key its chat route looks the model up by, once ":latest" is added
    m = models[NAME]
    assert isinstance(m["name"], str) and isinstance(m["size"], int)
    assert isinstance(m["details"]["parameter_size"], str) and isinstance(m["details"]["quantization_level"], str)

    # The first chat loads nothing new (one model, loaded at start), and /api/ps then names it with an expiry.
    running = _json(http.get("/api/ps", headers=JSON))["models"]
    expires = {r["model"]: r["expires_at"] for r in running if "expires_at" in r}
    assert NAME in expires and int(datetime.fromisoformat(expires[NAME]).timestamp()) > 0

    shown = _json(http.post("/api/show", content=json.dumps({"model": NAME}), headers=JSON))
    assert (
        isinstance(shown["model_info"], dict)
        and isinstance(shown["details"], dict)
        and "completion" in shown["capabilities"]
    )


def test_a_chat_streams_lines_open_webui_parses(server, http):
    body = {
        "model": NAME,
        "messages": [
            {"role": "system", "content": "You are a helpful assistant."},
            {"role": "user", "content": "Name three colours."},
        ],
        "stream": True,
        # Open WebUI's advanced parameters, mapped to Ollama's options (num_thread, use_mmap: ones cllm ignores).
        "options": {
            "temperature": 0.0,
            "num_predict": 24,
            "seed": 42,
            "stop": ["<|im_end|>"],
            "num_ctx": 2048,
            "num_thread": 2,
            "use_mmap": True,
        },
        "keep_alive": "5m",
    }
    lines = []
    with http.stream("POST", "/api/chat", content=json.dumps(body), headers={**JSON, **USER}) as r:
        assert r.status_code == 200
        buffer = b""
        for chunk in r.iter_bytes():
            buffer += chunk
            *whole, buffer = buffer.split(b"\n")  # a line at a time, as aiohttp's StreamReader yields them
            lines += whole
    assert buffer == b""  # the last line ends in a newline too
    objects = [json.loads(line) for line in lines]  # an empty line would be a JSONDecodeError in Open WebUI
    assert [o["done"] for o in objects] == [False] * (len(objects) - 1) + [True]
    text = ""
    for o in objects:
        message = o.get("message") or {}
        assert isinstance(message.get("content", ""), str) and o["model"] == NAME
        assert message.get("thinking") is None and message.get("tool_calls") is None
        text += message.get("content", "")
    assert text.strip()
    done = objects[-1]
    assert all(isinstance(done[k], int) for k in DONE_NUMBERS) and done["done_reason"] in ("stop", "length")
    usage = _usage(done)
    assert (
        usage["input_tokens"] > 10 and 0 < usage["output_tokens"] <= 24 and isinstance(usage["response_token/s"], float)
    )


TITLE_PROMPT = """### Task:
Generate a concise, 3-5 word title with an emoji summarizing the chat history.
### Output:
JSON format: { "title": "your concise title here" }
### Chat History:
<chat_history>
USER: Name three colours.
ASSISTANT: Red, green and blue.
</chat_history>"""


@pytest.mark.parametrize("task", ["title", "tags", "follow_ups"])
def test_task_generation_on_the_same_model_answers_whole(http, task):
    # Open WebUI's task body after convert_payload_openai_to_ollama: max_tokens lands at the root as num_predict.
    body = {
        "model": NAME,
        "messages": [{"role": "user", "content": TITLE_PROMPT.replace("title", task)}],
        "stream": False,
        "num_predict": 1000,
    }
    r = http.post("/api/chat", content=json.dumps(body), headers={**JSON, **USER})
    assert r.status_code == 200, r.text
    out = _json(r)
    assert out["done"] is True and out["message"]["role"] == "assistant" and out["message"]["content"].strip()
    assert all(isinstance(out[k], int) for k in DONE_NUMBERS)


def test_a_model_it_does_not_have_is_an_error_it_can_show(http):
    r = http.post(
        "/api/chat",
        content=json.dumps(
            {"model": "llama3.2:latest", "messages": [{"role": "user", "content": "hi"}], "stream": True}
        ),
        headers=JSON,
    )
    assert r.status_code == 404 and isinstance(_json(r)["error"], str) and "llama3.2" in r.json()["error"]


def test_a_later_turn_with_its_tool_history_is_taken(http):
    # convert_messages_openai_to_ollama: an assistant turn's tool_calls keep index and id, their arguments become
    # objects and its content ""; the tool's answer carries tool_call_id; an earlier turn's thinking is kept.
    # Two such rounds, then a third question: SmolLM2, greedy, imitates them with a call of its own, which comes back
    # with its arguments as an object (the history read whole, or there is nothing to imitate).
    messages: list[dict] = []
    for i, city in enumerate(("London", "Berlin")):
        call = {"index": 0, "id": f"call_{i}", "function": {"name": "get_weather", "arguments": {"city": city}}}
        messages += [
            {"role": "user", "content": f"Weather in {city}?"},
            {"role": "assistant", "thinking": "I should look it up.", "content": "", "tool_calls": [call]},
            {"role": "tool", "content": "15 C", "tool_call_id": f"call_{i}"},
            {"role": "assistant", "content": f"15 C in {city}."},
        ]
    body = {
        "model": NAME,
        "messages": [*messages, {"role": "user", "content": "Weather in Paris?"}],
        "stream": False,
        "tools": [
            {
                "type": "function",
                "function": {
                    "name": "get_weather",
                    "description": "The weather in a city",
                    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
                },
            }
        ],
        "options": {"temperature": 0.0, "num_predict": 40, "seed": 1},
        "keep_alive": -1,  # "-1" in its settings, json.loads-ed to a number
    }
    r = http.post("/api/chat", content=json.dumps(body), headers=JSON)
    assert r.status_code == 200, r.text
    out = _json(r)
    assert out["done"] is True and out["done_reason"] == "stop" and out["message"]["content"] == "", out
    (call,) = out["message"]["tool_calls"]
    assert (call["function"]["name"], call["function"]["arguments"]) == ("get_weather", {"city": "Paris"}), out


def test_rag_embeddings_with_its_empty_bearer(server):
    # Open WebUI's RAG with Ollama as its embedding engine (backend/open_webui/retrieval/utils.py,
    # agenerate_ollama_batch_embeddings): it always sends `Authorization: Bearer {key}`, the key "" when none is set,
    # and reads `embeddings`, a list of float lists, one per input.
    body = {"input": ["Paris is in France.", "Rivers flow to the sea."], "model": NAME, "truncate": True}
    # http.client, as requests sends it: httpx refuses a header value that ends in a space.
    conn = HTTPConnection(urlsplit(server.url).netloc, timeout=300)
    try:
        conn.request("POST", "/api/embed", body=json.dumps(body), headers={**JSON, "Authorization": "Bearer "})
        r = conn.getresponse()
        answer = r.read()
    finally:
        conn.close()
    assert r.status == 200 and r.getheader("content-type").startswith("application/json"), answer
    vectors = json.loads(answer)["embeddings"]
    assert len(vectors) == 2 and all(
        len(v) == len(vectors[0]) > 0 and all(isinstance(x, float) for x in v) for v in vectors
    )
