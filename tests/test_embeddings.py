"""/v1/embeddings and /embeddings with the openai SDK, against the real model."""

from __future__ import annotations

import base64
import threading

import numpy as np
import openai
import pytest

from cllm.core.protocol import Embed
from tests.conftest import start_server, wait_idle

MODEL = "SmolLM2-135M-Instruct.Q4_1"
CAT = "The cat sat on the mat."
CAT_AGAIN = "A cat was sitting on the rug."
MONEY = "Quarterly earnings rose by five percent."


def vectors(oai, inputs, **kw) -> np.ndarray:
    reply = oai.embeddings.create(model=MODEL, input=inputs, **kw)
    assert [d.index for d in reply.data] == list(range(len(reply.data)))
    return np.array([d.embedding for d in reply.data])


def test_same_text_same_vector_and_a_paraphrase_is_closer(oai):
    cat, again, money, cat2 = vectors(oai, [CAT, CAT_AGAIN, MONEY, CAT])
    assert np.allclose(cat, cat2, atol=1e-6)
    assert np.linalg.norm(cat) == pytest.approx(1, abs=1e-5)
    assert cat @ again > cat @ money + 0.1
    (alone,) = vectors(oai, CAT)
    assert np.array_equal(vectors(oai, CAT)[0], alone)
    assert np.allclose(alone, cat, atol=1e-4)


def test_a_batch_gives_what_its_inputs_give_alone(oai):
    texts = [
        f"Note {i}: " + " ".join(["apples", "rivers", "engines", "poems"][i % 4] for _ in range(i % 7 + 1))
        for i in range(20)
    ]
    batch = vectors(oai, texts)
    for text, v in zip(texts[:5], batch):
        assert np.allclose(vectors(oai, text)[0], v, atol=1e-6)


def test_base64_and_token_id_inputs_and_usage(server, oai, http):
    # The SDK asks for base64 unless told otherwise, and decodes it; asked explicitly, it hands it over.
    floats = np.array([d.embedding for d in oai.embeddings.create(model=MODEL, input=[CAT, MONEY]).data])
    reply = oai.embeddings.create(model=MODEL, input=[CAT, MONEY], encoding_format="base64")
    decoded = np.array([np.frombuffer(base64.b64decode(d.embedding), "<f4") for d in reply.data])
    assert np.allclose(decoded, floats, atol=1e-6)
    assert np.allclose(vectors(oai, [CAT, MONEY], encoding_format="float"), floats, atol=1e-6)

    ids = [http.post("/tokenize", json={"content": t, "add_special": True}).json()["tokens"] for t in (CAT, MONEY)]
    assert np.allclose(vectors(oai, ids), floats, atol=1e-4)
    assert np.allclose(vectors(oai, ids[0])[0], floats[0], atol=1e-4)
    usage = oai.embeddings.create(model=MODEL, input=ids).usage
    assert usage.prompt_tokens == usage.total_tokens == len(ids[0]) + len(ids[1])

    llama_server = http.post("/embeddings", json={"input": [CAT, MONEY]}).json()
    assert np.allclose(np.array([d["embedding"] for d in llama_server["data"]]), floats, atol=1e-4)


def test_bad_input_is_a_400_naming_the_field(http):
    def bad(field: str, **body) -> None:
        r = http.post("/v1/embeddings", json=body)
        assert r.status_code == 400, r.text
        assert r.json()["error"]["param"] == field, r.text

    bad("input", input=["x"] * 2049)
    bad("input", input="word " * 600)  # one decode holds --batch-size (512) tokens
    bad("input[1]", input=[CAT, ""])
    bad("input", input=[])
    bad("input[1]", input=[[1, 2], [10**9]])
    bad("input[0]", input=[1.5])
    bad("input[1]", input=[CAT, 3])
    bad("encoding_format", input=CAT, encoding_format="int8")
    bad("dimensions", input=CAT, dimensions=7)
    assert http.post("/v1/embeddings", json={"input": CAT}).status_code == 200
    wait_idle(http)


def test_generation_keeps_streaming_beside_a_big_batch():
    """16 inputs of ~40 tokens, with 64-token steps: each step holds the generation's token and one
    input, so the generation streams a token for about every input embedded, not one after all 16.
    (Such a step takes 0.2-0.9 s on two busy CPUs: 64 inputs made this test ~49 s.)"""
    with (
        start_server("--parallel", "4", "--ctx-size", "2048", "--batch-size", "64") as srv,
        openai.OpenAI(base_url=srv.url + "/v1", api_key="unused", timeout=300, max_retries=0) as oai,
    ):
        texts = [
            f"Document {i}. The river runs past the old mill, under the bridge and on to the sea." for i in range(16)
        ]
        done = threading.Event()
        result = []

        def embed():
            try:
                result.append(vectors(oai, texts))
            finally:
                done.set()

        stream = oai.completions.create(
            model=MODEL,
            prompt="Once upon a time",
            max_tokens=200,
            temperature=0,
            stream=True,
            extra_body={"ignore_eos": True},
        )
        worker = threading.Thread(target=embed)
        during = 0
        for i, _chunk in enumerate(stream):
            if i == 3:
                worker.start()
            elif i > 3 and not done.is_set():
                during += 1
            elif done.is_set():
                break  # the tokens after the batch prove nothing
        stream.close()
        worker.join(300)
        assert done.is_set() and result and result[0].shape[0] == 16
        assert during >= 8, during


def embed_all(engine, msg: Embed) -> list:
    engine.embed(msg)
    sent = []
    while engine.has_work():
        for result in engine.step():
            sent += result.embeddings
    return sent


def test_the_context_is_made_by_the_first_request_and_failing_to_fails_only_the_waiting_ones(engine, monkeypatch):
    """A server that never embeds holds no embeddings context (memory: see embedder.py)."""
    assert engine.embedder.ctx is None and len(engine.runner.contexts) == 1
    monkeypatch.setattr(engine.runner, "new_context", lambda cparams: None)  # as llama.cpp out of memory
    (failed,) = embed_all(engine, Embed(1, [[1, 2, 3], [4, 5]]))
    assert (failed.id, failed.vectors) == (1, b"") and "embeddings context" in failed.error
    monkeypatch.undo()
    (sent,) = embed_all(engine, Embed(2, [[1, 2, 3], [4, 5]]))
    assert (sent.id, sent.first, len(sent.vectors), sent.error) == (2, 0, 2 * 4 * engine.embedder.dim, "")
    assert engine.runner.contexts == [engine.runner.ctx, engine.embedder.ctx]
