"""cLLM's HTTP API against a real `cllm serve` on the embedded model."""

from __future__ import annotations

import json
from concurrent.futures import ThreadPoolExecutor

import pytest

from tests.conftest import CHAT_PROMPT
from tests.near_tie import greedy

PROMPTS = [
    "The capital of France is",
    "Once upon a time, in a small village,",
    "def fibonacci(n):",
    "The three primary colors are",
    "Water boils at",
    "My favourite book is",
    "In 1969, astronauts",
    "import numpy as np\n",
    "The quick brown fox",
    "Photosynthesis is the process",
    "Dear Sir or Madam,",
    "SELECT * FROM users WHERE",
    "The largest planet in the solar system",
    "Machine learning models",
    "A haiku about autumn:\n",
    "To make a cup of tea,",
]


def generate(http, **body) -> dict:
    r = http.post("/generate", json=body)
    assert r.status_code == 200, r.text
    assert r.json()["success"] is True
    return r.json()["data"]


def stream_events(http, path: str, **body) -> list[dict]:
    events = []
    with http.stream("POST", path, json=body) as r:
        assert r.status_code == 200
        assert r.headers["content-type"].startswith("text/event-stream")
        for line in r.iter_lines():
            if line.startswith("data: "):
                events.append(json.loads(line[len("data: ") :]))
    return events


def test_index_lists_endpoints(http):
    r = http.get("/")
    assert r.status_code == 200
    paths = {e["path"] for e in r.json()["data"]["endpoints"]}
    assert {"/", "/health", "/generate", "/generate_stream", "/encode", "/model/info"} <= paths


@pytest.mark.parametrize("level", ["basic", "detailed", "full"])
def test_health_levels(http, level):
    r = http.get("/health", params={"level": level})
    assert r.status_code == 200
    data = r.json()["data"]
    assert data["healthy"] is True and data["status"] == "healthy"
    assert data["components"] == {"frontend": True, "tokenizer": True, "engine": True}
    if level != "basic":
        assert set(data["queue"]) == {"in_flight", "running", "waiting"}
        assert data["uptime_seconds"] > 0
    if level == "full":
        assert data["engine"]["kv_total"] == 8192
        assert data["model"]["parallel"] == 16


def test_health_rejects_unknown_level(http):
    r = http.get("/health", params={"level": "verbose"})
    assert r.status_code == 400
    assert r.json() == {
        "success": False,
        "error": "invalid request",
        "message": "level must be basic, detailed or full, not 'verbose'",
    }


def test_model_info(http):
    data = http.get("/model/info").json()["data"]
    assert data["model_path"].endswith("SmolLM2-135M-Instruct.Q4_1.gguf")
    assert data["model_family"] == "llama"
    assert data["quantization"] == "Q4_1"
    assert data["vocab_size"] == 49152
    assert data["num_layers"] == 30
    assert data["max_sequence_length"] == 8192 // 16
    assert data["num_threads"] >= 1 and data["batch_size"] == 512 and data["use_mmap"] is True
    # llama.cpp's own figure: a logits row a stream and a scored chunk's 64 (a row for each of a step's 512 tokens
    # was 96 MiB of it alone)
    assert 1 << 20 < data["compute_bytes"] < 40 << 20


def test_encode_matches_generate_prompt_tokens(http):
    data = http.post("/encode", json={"text": "Hello world"}).json()["data"]
    assert data["length"] == len(data["tokens"]) == 2
    assert all(isinstance(t, int) for t in data["tokens"])
    gen = generate(http, prompt="Hello world", max_tokens=1, temperature=0)
    assert gen["prompt_tokens"] == 2


def test_generate_fields_and_length_finish(http):
    data = generate(http, prompt="The capital of France is", max_tokens=12, temperature=0)
    assert set(data) >= {
        "id",
        "text",
        "response_time",
        "tokens_per_second",
        "generated_tokens",
        "max_tokens",
        "finish_reason",
    }
    assert data["generated_tokens"] == 12 and data["max_tokens"] == 12
    assert data["finish_reason"] == "length"
    said = greedy(http, {"prompt": "The capital of France is", "max_tokens": 12}, "/v1/completions", until="Paris")
    assert "Paris" in said.text and data["text"].startswith(said.text)  # clear of a tie up to it
    assert data["response_time"] > 0 and data["tokens_per_second"] > 0


def test_eos_stops_unless_ignore_eos(http):
    assert greedy(http, {"prompt": CHAT_PROMPT, "max_tokens": 200}, "/v1/completions").ended  # clear of a tie
    data = generate(http, prompt=CHAT_PROMPT, max_tokens=200, temperature=0)
    assert data["finish_reason"] == "stop"
    assert 0 < data["generated_tokens"] < 200
    assert "<|im_end|>" not in data["text"]
    forced = generate(
        http, prompt=CHAT_PROMPT, max_tokens=data["generated_tokens"] + 10, temperature=0, ignore_eos=True
    )
    assert forced["finish_reason"] == "length"
    assert forced["generated_tokens"] == data["generated_tokens"] + 10


def test_default_sampling_runs(http):
    data = generate(http, prompt="Tell me a story", max_tokens=8, ignore_eos=True)
    assert data["generated_tokens"] == 8


def test_same_seed_same_text(http):
    body = dict(prompt="Write a poem about the sea", max_tokens=24, temperature=0.9, top_k=0, top_p=1.0, seed=1234)
    a, b = generate(http, **body), generate(http, **body)
    assert a["text"] == b["text"]
    others = {generate(http, **{**body, "seed": s})["text"] for s in (1, 2, 3)}
    assert len(others | {a["text"]}) > 1  # the seed really steers the draw


def test_sampling_parameters_are_accepted(http):
    data = generate(
        http,
        prompt="List some fruits:",
        max_tokens=10,
        temperature=0.5,
        top_k=5,
        top_p=0.8,
        min_p=0.05,
        repetition_penalty=1.3,
        seed=7,
        ignore_eos=True,
    )
    assert data["generated_tokens"] == 10


def test_greedy_argmax_equals_a_sampler_chain(http):
    # Greedy takes the argmax of the logits row without a llama.cpp chain;
    # top_k=1 goes through a chain and must pick the same tokens, EOS ban included.
    for ignore_eos in (False, True):
        body = dict(prompt=CHAT_PROMPT, max_tokens=40, ignore_eos=ignore_eos)
        greedy = generate(http, temperature=0, **body)
        chain = generate(http, temperature=0.8, top_k=1, seed=3, **body)
        assert (greedy["text"], greedy["finish_reason"]) == (chain["text"], chain["finish_reason"])


def test_concurrent_greedy_equals_alone(http):
    body = dict(max_tokens=24, temperature=0, ignore_eos=True)
    alone = [generate(http, prompt=p, **body)["text"] for p in PROMPTS]
    with ThreadPoolExecutor(len(PROMPTS)) as pool:
        together = list(pool.map(lambda p: generate(http, prompt=p, **body)["text"], PROMPTS))
    assert together == alone


def test_staggered_finishes_keep_results(http):
    # Early finishers leave gaps in the KV slots that the engine closes by
    # moving later sequences down; their text must not change.
    lengths = [3, 40, 8, 30, 5, 20, 12, 35]
    bodies = [dict(prompt=p, max_tokens=n, temperature=0, ignore_eos=True) for p, n in zip(PROMPTS, lengths)]
    alone = [generate(http, **b)["text"] for b in bodies]
    with ThreadPoolExecutor(len(bodies)) as pool:
        together = list(pool.map(lambda b: generate(http, **b)["text"], bodies))
    assert together == alone


@pytest.mark.parametrize("path,extra", [("/generate_stream", {}), ("/generate", {"stream": True})])
def test_stream_equals_non_stream(http, path, extra):
    body = dict(prompt="Once upon a time", max_tokens=30, temperature=0)
    whole = generate(http, **body)
    events = stream_events(http, path, **body, **extra)
    assert all(not e["done"] for e in events[:-1])
    last = events[-1]
    assert last["done"] is True and last["token"] == ""
    assert last["generated_tokens"] == whole["generated_tokens"] == 30
    assert last["finish_reason"] == "length"
    assert len({e["id"] for e in events}) == 1
    assert "".join(e["token"] for e in events) == whole["text"]


def test_stream_pieces_are_whole_characters(http):
    # Ask for text outside ASCII; byte-level BPE splits such characters across tokens.
    body = dict(prompt="Translate to Chinese and add emoji: I love cats 🐱 ->", max_tokens=40, temperature=0)
    whole = generate(http, **body)
    events = stream_events(http, "/generate_stream", **body)
    pieces = [e["token"] for e in events if not e["done"]]
    assert "".join(pieces) == whole["text"]
    assert not any("\ufffd" in p for p in pieces)


@pytest.mark.parametrize(
    "body,message",
    [
        ({"max_tokens": 5}, "Object missing required field `prompt`"),
        ({"prompt": 5}, "Expected `str`, got `int` - at `$.prompt`"),
        ({"prompt": "x", "max_tokens": "5"}, "Expected `int`, got `str` - at `$.max_tokens`"),
        ({"prompt": "x", "max_tokens": 0}, "Expected `int` >= 1 - at `$.max_tokens`"),
        ({"prompt": "x", "temperature": -1}, "Expected `float` >= 0.0 - at `$.temperature`"),
        ({"prompt": "x", "top_p": 0}, "Expected `float` > 0.0 - at `$.top_p`"),
        ({"prompt": "x", "top_p": 1.5}, "Expected `float` <= 1.0 - at `$.top_p`"),
        ({"prompt": "x", "stream": "yes"}, "Expected `bool`, got `str` - at `$.stream`"),
        ({"prompt": "x", "max_tokens": 2.5}, "Expected `int`, got `float` - at `$.max_tokens`"),
        ({"prompt": "x", "top_k": 2**31}, "Expected `int` <= 2147483647 - at `$.top_k`"),
        ({"prompt": "x", "seed": 10**30}, "Expected `int` <= 9223372036854775807 - at `$.seed`"),
        ({"prompt": "x", "repetition_penalty": 1e-323}, "Expected `float` >= 0.01 - at `$.repetition_penalty`"),
        ({"prompt": "x", "repetition_penalty": 1e300}, "Expected `float` <= 100.0 - at `$.repetition_penalty`"),
        ([1, 2], "Expected `object`, got `array`"),
    ],
)
def test_bad_generate_bodies_are_400_naming_the_field(http, body, message):
    for path in ("/generate", "/generate_stream"):
        r = http.post(path, json=body)
        assert r.status_code == 400
        assert r.json() == {"success": False, "error": "invalid request", "message": message}


def test_integral_floats_count_as_integers(http):
    data = generate(http, prompt="Hello", max_tokens=2.0, top_k=5.0, seed=3.0, temperature=1)
    assert data["generated_tokens"] == 2 and data["max_tokens"] == 2


def test_malformed_json_is_400(http):
    r = http.post("/generate", content=b'{"prompt": ', headers={"content-type": "application/json"})
    assert r.status_code == 400
    assert r.json()["error"] == "invalid JSON"


def test_limits_against_the_sequence_context(http):
    r = http.post("/generate", json={"prompt": "word " * 600, "max_tokens": 5})
    assert r.status_code == 400
    assert r.json()["error"] == "prompt too long"
    assert "at most 511" in r.json()["message"]
    r = http.post("/generate", json={"prompt": "hi", "max_tokens": 513})
    assert r.status_code == 400 and "max_tokens 513" in r.json()["message"]
    r = http.post("/generate", json={"prompt": "", "max_tokens": 5})
    assert r.status_code == 400 and r.json()["message"] == "Expected `str` of length >= 1 - at `$.prompt`"


def test_unknown_path_and_wrong_method(http):
    r = http.get("/nope")
    assert r.status_code == 404 and r.json() == {"success": False, "error": "not found", "message": "GET /nope"}
    r = http.get("/generate")
    assert r.status_code == 405 and r.json()["error"] == "method not allowed"
    r = http.post("/encode", json={})
    assert r.status_code == 400 and r.json()["message"] == "Object missing required field `text`"


def test_server_still_serves_after_bad_requests(http):
    assert generate(http, prompt="Hello", max_tokens=3, temperature=0)["generated_tokens"] == 3
