"""Ollama's API, driven by the real `ollama` Python client (and raw httpx for the error shapes) on the real model."""

from __future__ import annotations

import json

import httpx
import ollama
import pytest

from tests.conftest import embedded_with, start_server, wait_until
from tests.near_tie import CAPITAL, greedy
from tests.test_pool import write_config
from tests.test_tools import weather_history as openai_weather_history

NAME = "SmolLM2-135M-Instruct.Q4_1:latest"
FEW = {"num_predict": 8, "temperature": 0}
# Its greedy reply runs far past FEW's 8 tokens. The capital of France's is "The capital of France is Paris." on
# some servers, 7 tokens and the end: its first token is a near tie ("L" -1.92 against "The" -2.01 in logprob) that
# the state a shared server is in can flip.
LONG = "Describe the city of Paris in detail."
WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "The current weather in a city",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
    },
}


@pytest.fixture(scope="module")
def client(server) -> ollama.Client:
    return ollama.Client(host=server.url, timeout=300)


def ask(text: str) -> list[dict]:
    return [{"role": "user", "content": text}]


def test_tags_show_and_ps_describe_the_model_alike(client):
    (model,) = client.list().models
    assert model.model == NAME and model.size > 0 and len(model.digest) == 64
    d = model.details
    assert (d.format, d.family, d.parameter_size, d.quantization_level) == ("gguf", "llama", "135M", "Q4_1")
    shown = client.show(NAME)
    assert shown.modelinfo["general.architecture"] == "llama" and shown.modelinfo["llama.embedding_length"] == 576
    # the slot's (8192 cells / 16), not the 8192 it was trained on
    assert shown.modelinfo["llama.context_length"] == 512
    assert "completion" in shown.capabilities and "tools" in shown.capabilities
    assert "vision" not in shown.capabilities and "embedding" not in shown.capabilities  # it answers /api/embed too
    assert "im_start" in shown.template and shown.details.family == "llama"
    assert client.show("SmolLM2-135M-Instruct.Q4_1").details.format == "gguf"  # the tag may be left out
    (running,) = client.ps().models
    assert running.model == NAME and running.context_length == 512 and running.size > model.size


def test_chat_whole(client):
    r = client.chat(NAME, messages=ask(LONG), stream=False, options=FEW)
    assert r.done and r.done_reason == "length" and r.message.role == "assistant" and r.message.content
    assert r.eval_count == 8 and r.prompt_eval_count > 10
    assert r.total_duration >= r.eval_duration > 0 and r.prompt_eval_duration > 0 and r.load_duration >= 0


def test_chat_streamed_is_ndjson_ending_in_done(server, client):
    chunks = list(client.chat(NAME, messages=ask("Hi"), stream=True, options=FEW))
    assert [c.done for c in chunks] == [False] * (len(chunks) - 1) + [True]
    assert "".join(c.message.content for c in chunks).strip() and chunks[-1].eval_count == 8
    body = {"model": NAME, "messages": ask("Hi"), "options": FEW}  # stream is the default
    with httpx.stream("POST", f"{server.url}/api/chat", json=body, timeout=300) as r:
        assert r.headers["content-type"].startswith("application/x-ndjson")
        lines = [json.loads(line) for line in r.iter_lines() if line]
    assert lines[-1]["done"] is True and lines[-1]["done_reason"] == "length"


def test_ignore_eos_runs_to_num_predict(http, client):
    # cllm's extension, as on its other routes (perf.front_doors gives every route the same token count with it).
    options = {"temperature": 0, "num_predict": 24}
    assert greedy(http, {"messages": CAPITAL, "max_tokens": 24}).ended  # clear of a tie up to its end
    stopped = client.chat(NAME, messages=CAPITAL, options=options)
    assert stopped.done_reason == "stop" and stopped.eval_count < 24
    full = client.chat(NAME, messages=CAPITAL, options={**options, "ignore_eos": True})
    assert (
        full.done_reason == "length"
        and full.eval_count == 24
        and full.message.content.startswith(stopped.message.content)
    )


def test_generate_templated_raw_and_stop(http, client):
    r = client.generate(NAME, LONG, options=FEW)
    assert r.done and r.response and r.eval_count == 8
    said = greedy(http, {"prompt": "The capital of France is", "max_tokens": 8}, "/v1/completions", until=".")
    raw = client.generate(NAME, "The capital of France is", raw=True, options={**FEW, "stop": ["."]})
    assert raw.response == said.text[: said.text.index(".")] and "Paris" in raw.response
    assert raw.done_reason == "stop"
    assert raw.prompt_eval_count < 10  # no template around it
    streamed = list(client.generate(NAME, "The capital of France is", raw=True, stream=True, options=FEW))
    assert (
        streamed[-1].done
        and "".join(c.response for c in streamed)
        == client.generate(NAME, "The capital of France is", raw=True, options=FEW).response
    )


def test_format_schema_is_enforced(client):
    schema = {
        "type": "object",
        "properties": {"city": {"type": "string"}, "population": {"type": "integer"}},
        "required": ["city", "population"],
    }
    r = client.chat(
        NAME,
        messages=ask("Name a city and its population as JSON."),
        format=schema,
        options={"temperature": 0, "num_predict": 60},
    )
    value = json.loads(r.message.content)
    assert set(value) == {"city", "population"} and type(value["population"]) is int
    free = client.generate(
        NAME, "Describe Paris.", format="json", options={"temperature": 0, "num_predict": 12}
    ).response
    assert free.lstrip().startswith("{")  # any JSON object (it runs out of tokens before it closes)


def weather_history() -> list[dict]:
    """Earlier turns in Ollama's shape (arguments as objects, tool results by tool name) that SmolLM2 imitates."""
    messages: list[dict] = []
    for city in ("London", "Berlin"):
        messages += [
            {"role": "user", "content": f"Weather in {city}?"},
            {
                "role": "assistant",
                "content": "",
                "tool_calls": [{"function": {"name": "get_weather", "arguments": {"city": city}}}],
            },
            {"role": "tool", "tool_name": "get_weather", "content": "15 C"},
            {"role": "assistant", "content": f"15 C in {city}."},
        ]
    return [*messages, {"role": "user", "content": "Weather in Paris?"}]


def test_tool_calls_come_back_with_object_arguments(http, client):
    # The same history through the OpenAI door, the call written as text: clear of a tie from its first token to its
    # end (each ahead by 3.9 nats or more).
    written = greedy(http, {"messages": openai_weather_history(), "tools": [WEATHER], "tool_choice": "none"})
    assert written.ended and '"arguments": {"city": "Paris"}' in written.text
    r = client.chat(NAME, messages=weather_history(), tools=[WEATHER], options={"temperature": 0})
    (call,) = r.message.tool_calls
    assert call.function.name == "get_weather" and call.function.arguments == {"city": "Paris"}
    assert r.done_reason == "stop"
    chunks = list(
        client.chat(NAME, messages=weather_history(), tools=[WEATHER], stream=True, options={"temperature": 0})
    )
    calls = [c for chunk in chunks for c in chunk.message.tool_calls or ()]
    assert [(c.function.name, c.function.arguments) for c in calls] == [("get_weather", {"city": "Paris"})]


def test_embed_and_the_older_embeddings(client):
    r = client.embed(NAME, input=["The cat sat.", "A dog ran."])
    assert len(r.embeddings) == 2 and len(r.embeddings[0]) == 576 and r.prompt_eval_count > 4
    assert abs(sum(x * x for x in r.embeddings[0]) - 1) < 1e-3  # normalised, as Ollama's are
    (one,) = client.embed(NAME, input="The cat sat.").embeddings
    older = client.embeddings(NAME, prompt="The cat sat.").embedding
    assert max(abs(a - b) for a, b in zip(one, older)) < 1e-4


def test_a_model_that_says_how_it_pools_shows_as_an_embedding_model(tmp_path):
    """Ollama's rule: a GGUF with `<arch>.pooling_type` is an embedding model (`embedding` in place of `completion`),
    and Open WebUI and the `ollama` CLI go by it; it embeds as its pooling says."""
    import gguf

    mean = embedded_with(str(tmp_path / "smol-embed.gguf"), {"llama.pooling_type": (gguf.GGUFValueType.UINT32, 1)})
    with start_server("--model", mean, "--parallel", "1", "--ctx-size", "512") as srv:
        embedder = ollama.Client(host=srv.url, timeout=300)
        assert embedder.show("smol-embed").capabilities == ["embedding"]
        (vector,) = embedder.embed("smol-embed", input="The cat sat.").embeddings
        assert len(vector) == 576 and abs(sum(x * x for x in vector) - 1) < 1e-3


def test_num_ctx_beyond_the_slot_is_clamped_and_said(server, client):
    r = client.generate(NAME, "Hello", raw=True, options={**FEW, "num_ctx": 100000})
    assert r.done
    wait_until(lambda: any("num_ctx 100000 is clamped to the 512" in line for line in server.stderr_lines), 10)


@pytest.mark.parametrize(
    "path, body, status, says",
    [
        ("/api/chat", {"model": "nope", "messages": ask("Hi")}, 404, "model 'nope' not found"),
        ("/api/show", {"model": "nope:7b"}, 404, "model 'nope:7b' not found"),
        (
            "/api/chat",
            {"model": NAME, "messages": ask("Hi"), "options": {"num_predict": "x"}},
            400,
            "options.num_predict",
        ),
        (
            "/api/chat",
            {"model": NAME, "messages": [{"role": "user", "content": "Hi", "images": ["iVBOR"]}]},
            400,
            "messages[0].images[0]: the image is not valid base64",
        ),
        ("/api/chat", {"model": NAME, "messages": ask("Hi"), "format": "yaml"}, 400, "format"),
        ("/api/chat", {"model": NAME, "messages": ask("Hi"), "keep_alive": "soon"}, 400, "keep_alive"),
        (
            "/api/generate",
            {"model": NAME, "prompt": "Hi", "images": ["iVBOR"]},
            400,
            "images[0]: the image is not valid base64",
        ),
        ("/api/generate", {"model": NAME, "prompt": "Hi", "template": "{{ .Prompt }}"}, 400, "Go"),
        ("/api/generate", {"model": NAME, "prompt": "Hi", "raw": True, "system": "Be brief."}, 400, "system"),
        ("/api/generate", {"model": NAME, "prompt": "def f(", "suffix": "return 1"}, 400, "fill-in-the-middle"),
        ("/api/generate", {"model": NAME, "prompt": "Hi " * 600, "raw": True}, 400, "prompt"),
        ("/api/embed", {"model": NAME, "input": []}, 400, "input"),
        ("/api/pull", {"model": "llama3"}, 403, "--allow-pull"),
        ("/api/create", {"model": "x", "from": "y"}, 400, "--models-dir"),
        ("/api/copy", {"source": NAME, "destination": "y"}, 403, "--allow-pull"),
        ("/api/push", {"model": NAME}, 400, "--models-dir"),
        ("/api/blobs/sha256:00", None, 400, "--models-dir"),
    ],
)
def test_bad_requests_get_ollamas_error_shape(http, path, body, status, says):
    r = http.post(path, json=body) if body is not None else http.post(path, content=b"GGUF" * 100)
    assert r.status_code == status and list(r.json()) == ["error"] and says in r.json()["error"], r.text


def test_other_errors_take_the_shape_too(http):
    r = http.request("DELETE", "/api/delete", json={"model": NAME})
    assert r.status_code == 403 and r.json()["error"].startswith(
        "pulling, deleting and copying models over HTTP is off"
    )
    r = http.post("/api/chat", content=b"{not json", headers={"content-type": "application/json"})
    assert r.status_code == 400 and list(r.json()) == ["error"]
    r = http.get("/api/nothing")
    assert r.status_code == 404 and list(r.json()) == ["error"]
    with pytest.raises(ollama.ResponseError) as e:
        ollama.Client(host=str(http.base_url)).chat("llama3", messages=ask("Hi"))
    assert e.value.status_code == 404 and "llama3" in e.value.error


def test_unknown_fields_and_options_are_ignored(http):
    body = {
        "model": NAME,
        "messages": ask("Hi"),
        "stream": False,
        "options": {**FEW, "num_thread": 2, "mirostat": 0},
        "brand_new": 1,
    }
    r = http.post("/api/chat", json=body)
    assert r.status_code == 200 and r.json()["done"] is True


@pytest.fixture(scope="module")
def pool(tmp_path_factory):
    config = write_config(
        tmp_path_factory.mktemp("ollama"),
        """
models:
  - {id: a, path: FILE, ctx-size: 1024, parallel: 1}
  - {id: b, path: FILE, ctx-size: 1024, parallel: 1}
""",
    )
    with start_server("--config", config) as srv:
        yield srv


def test_keep_alive_zero_unloads_as_ollama_stop_does(pool):
    client = ollama.Client(host=pool.url, timeout=300)
    assert {m.model for m in client.list().models} == {"a:latest", "b:latest"}
    assert [m.model for m in client.ps().models] == ["a:latest"]
    loaded = client.generate("b", "")  # an empty prompt only loads it
    assert loaded.done_reason == "load"
    assert {m.model for m in client.ps().models} == {"a:latest", "b:latest"}
    stopped = client.generate("b:latest", "", keep_alive=0)  # what `ollama stop b` sends
    assert stopped.done_reason == "unload" and [m.model for m in client.ps().models] == ["a:latest"]
    r = client.chat("b", messages=ask("Hi"), options=FEW, keep_alive=0)  # it loads, answers, and goes again
    assert r.done
    wait_until(lambda: [m.model for m in client.ps().models] == ["a:latest"], 30)


def test_langchain_chat_ollama(server):
    from langchain_core.messages import AIMessage, HumanMessage, ToolMessage
    from langchain_ollama import ChatOllama
    from pydantic import BaseModel

    llm = ChatOllama(base_url=server.url, model=NAME, temperature=0, num_predict=8)
    assert llm.invoke("What is the capital of France?").content
    chunks = list(llm.stream("Hi"))
    assert "".join(c.content for c in chunks).strip() and any(
        c.response_metadata.get("done_reason") == "length" for c in chunks
    )

    class City(BaseModel):
        city: str
        population: int

    structured = ChatOllama(base_url=server.url, model=NAME, temperature=0, num_predict=60).with_structured_output(City)
    assert isinstance(structured.invoke("Name a city and its population."), City)

    history = []
    for i, city in enumerate(("London", "Berlin")):
        call = {"name": "get_weather", "args": {"city": city}, "id": f"call_{i}"}
        history += [
            HumanMessage(f"Weather in {city}?"),
            AIMessage("", tool_calls=[call]),
            ToolMessage("15 C", tool_call_id=f"call_{i}"),
            AIMessage(f"15 C in {city}."),
        ]
    reply = (
        ChatOllama(base_url=server.url, model=NAME, temperature=0)
        .bind_tools([WEATHER])
        .invoke([*history, HumanMessage("Weather in Paris?")])
    )
    assert [(c["name"], c["args"]) for c in reply.tool_calls] == [("get_weather", {"city": "Paris"})]


def test_keep_alive_duration_keeps_the_model_that_long(pool):
    client = ollama.Client(host=pool.url, timeout=300)
    client.generate("b", "", keep_alive="1s")
    assert "b:latest" in {m.model for m in client.ps().models}
    wait_until(lambda: [m.model for m in client.ps().models] == ["a:latest"], 30)  # idle past its second: unloaded
    client.generate("b", "", keep_alive=-1)  # for good
    (b,) = [m for m in client.ps().models if m.model == "b:latest"]
    assert b.expires_at.year == 9999
    client.generate("b", "", keep_alive=0)
