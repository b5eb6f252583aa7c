"""The published OpenAPI document, and schemathesis fuzzing the API against it.

Every generated request, valid or not, must get a status the document
declares, with a body that matches it, and never a 5xx; valid requests must be
accepted and invalid ones refused. Valid requests ask for a few tokens at
most, so generation stays short, and the examples are bounded.
"""

from __future__ import annotations

import httpx
import pytest
import schemathesis
from hypothesis import HealthCheck, given, settings
from schemathesis import GenerationMode
from schemathesis.specs.openapi.checks import positive_data_acceptance

EXAMPLES = 15  # per operation and mode
GEN_TOKENS = 4


def test_openapi_document_describes_every_route(http):
    doc = http.get("/openapi.json").json()
    assert doc["openapi"].startswith("3.1")
    paths = {(m.upper(), p) for p, ops in doc["paths"].items() for m in ops}
    listed = {(e["method"], e["path"]) for e in http.get("/").json()["data"]["endpoints"]}
    assert paths == listed and ("POST", "/generate") in paths and ("GET", "/openapi.json") in paths
    generate = doc["components"]["schemas"]["GenerateRequest"]
    # new fields are ignored, not refused
    assert generate["required"] == ["prompt"] and "additionalProperties" not in generate
    assert generate["properties"]["top_p"] == {
        "type": "number",
        "exclusiveMinimum": 0.0,
        "maximum": 1.0,
        "default": 0.9,
    }
    assert generate["properties"]["max_tokens"]["maximum"] == 512  # set at run time: one sequence's context
    statuses = set(doc["paths"]["/generate"]["post"]["responses"])
    assert statuses == {"200", "400", "408", "413", "415", "429", "503"}


@pytest.fixture(scope="module")
def api_schema(server):
    return schemathesis.openapi.from_dict(httpx.get(server.url + "/openapi.json", timeout=30).json())


def _short(case):
    """A valid request asks for a few tokens at most: fuzzing is about the API, not about generating."""
    body = case.body
    if isinstance(body, dict) and ("prompt" in body or "messages" in body):
        body["max_tokens"] = min(body.get("max_tokens") or GEN_TOKENS, GEN_TOKENS)
        for field in ("n_predict", "n_cmpl"):  # llama-server's /completion: its own names for them
            if field in body:
                body[field] = GEN_TOKENS if field == "n_predict" else min(body[field] or 1, 2)
        if body.get("max_completion_tokens"):
            body["max_completion_tokens"] = min(body["max_completion_tokens"], GEN_TOKENS)
        if body.get("n"):
            body["n"] = min(body["n"], 2)
        # LoRA adapter ids name what the server loaded (this one none): any id is a 400 no schema can state.
        body.pop("lora", None)
        # A string of control characters tokenizes to nothing: an empty prompt, a 400 no schema can state.
        if isinstance(body.get("prompt"), str) and not any(c.isalnum() for c in body["prompt"]):
            body["prompt"] = "A" + body["prompt"]
    return case


# Nothing to get wrong (a path parameter is any string).
OPERATIONS = [
    ("GET", "/"),
    ("GET", "/metrics"),
    ("GET", "/model/info"),
    ("GET", "/openapi.json"),
    ("GET", "/v1/models"),
    ("GET", "/v1/models/{model}"),
]
WITH_INPUT = [
    ("GET", "/health"),
    ("POST", "/generate"),
    ("POST", "/generate_stream"),
    ("POST", "/encode"),
    ("POST", "/v1/completions"),
    ("POST", "/v1/chat/completions"),
    ("POST", "/completion"),
]
CASES = [(*op, GenerationMode.POSITIVE) for op in OPERATIONS + WITH_INPUT] + [
    (*op, GenerationMode.NEGATIVE) for op in WITH_INPUT
]
# What the OpenAI request schemas allow but the routes refuse (token ids outside the vocabulary, max_tokens 0 without
# echo,
# best_of != n, grammars llama.cpp cannot build, ...) gets a 400: for /v1/ and llama-server's /completion a
# valid-looking request
# may be refused, but never with a 5xx or an undeclared answer.
LENIENT = [positive_data_acceptance]


@pytest.mark.parametrize("method,path,mode", CASES, ids=[f"{m} {p} {g.value}" for m, p, g in CASES])  # type: ignore[attr-defined]
def test_fuzz(api_schema, server, method, path, mode):
    cases = api_schema[path][method].as_strategy(generation_mode=mode)
    if mode is GenerationMode.POSITIVE:
        cases = cases.map(_short)
    excluded = LENIENT if path.startswith("/v1/") or path == "/completion" else []

    @given(case=cases)
    @settings(max_examples=EXAMPLES, deadline=None, database=None, suppress_health_check=list(HealthCheck))
    def check(case):
        case.call_and_validate(base_url=server.url, timeout=60, excluded_checks=excluded)

    check()
