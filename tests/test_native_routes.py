"""llama-server's native routes on the real model: /completion (whole, streamed, grammars, probabilities),
/infill (refused for a model without FIM tokens; built as llama-server builds it on a copy that has them),
/props, /slots, /apply-template, llama-server's error shape, and a key-by-key comparison with llama-server
itself when `make llama-server` has built it (skipped without it, a failure when CI is set)."""

from __future__ import annotations

import json

import httpx
import pytest

from tests.conftest import CHAT_PROMPT, embedded_with, running, start_server, wait_idle
from tests.llama_server import ONLY_LLAMA_SERVER, llama_server_on, refused, same_shape

TIMING_KEYS = {
    "cache_n",
    "prompt_n",
    "prompt_ms",
    "prompt_per_token_ms",
    "prompt_per_second",
    "predicted_n",
    "predicted_ms",
    "predicted_per_token_ms",
    "predicted_per_second",
}
RESULT_KEYS = {
    "index",
    "content",
    "tokens",
    "id_slot",
    "stop",
    "model",
    "tokens_predicted",
    "tokens_evaluated",
    "generation_settings",
    "prompt",
    "has_new_line",
    "truncated",
    "stop_type",
    "stopping_word",
    "tokens_cached",
    "timings",
}
GREEDY = {"temperature": 0, "seed": 1}


def completion(http: httpx.Client, **body) -> dict:
    r = http.post("/completion", json=body)
    assert r.status_code == 200, r.text
    return r.json()


def events(http: httpx.Client, path: str = "/completion", **body) -> list[dict]:
    """The data of each Server-Sent Event of a streamed answer."""
    with http.stream("POST", path, json={**body, "stream": True}) as r:
        assert r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream")
        lines = [line for line in r.iter_lines() if line]
    assert all(line.startswith("data: ") for line in lines), lines
    return [json.loads(line[6:]) for line in lines]


# ---- /completion ----------------------------------------------------------------


def test_completion_in_llama_servers_shape(http):
    out = completion(http, prompt=CHAT_PROMPT, n_predict=8, n_probs=2, return_tokens=True, **GREEDY)
    assert RESULT_KEYS | {"completion_probabilities"} == out.keys()
    assert out["stop"] is True and out["stop_type"] in ("eos", "limit") and out["stopping_word"] == ""
    assert 0 < out["tokens_predicted"] <= 8 and len(out["tokens"]) == out["tokens_predicted"]
    assert out["tokens_evaluated"] == len(http.post("/tokenize", json={"content": CHAT_PROMPT}).json()["tokens"])
    assert out["timings"].keys() == TIMING_KEYS and out["timings"]["predicted_n"] == out["tokens_predicted"]
    probs = out["completion_probabilities"]
    assert [p["id"] for p in probs] == out["tokens"]
    assert all(len(p["top_logprobs"]) == 2 and p["logprob"] <= 0 for p in probs)
    assert probs[0]["top_logprobs"][0]["id"] == probs[0]["id"]  # greedy: the likeliest
    settings = out["generation_settings"]
    assert (settings["temperature"], settings["n_predict"], settings["n_probs"], settings["seed"]) == (0, 8, 2, 1)
    # The one generation core: the same greedy text as OpenAI's completions of the same prompt.
    oai = http.post("/v1/completions", json={"prompt": CHAT_PROMPT, "max_tokens": 8, "temperature": 0}).json()
    assert oai["choices"][0]["text"] == out["content"]


def test_prompt_as_tokens_a_mix_or_several(http):
    text = completion(http, prompt="The capital of France is", n_predict=6, **GREEDY)["content"]
    ids = http.post("/tokenize", json={"content": "The capital of France is"}).json()["tokens"]
    assert completion(http, prompt=ids, n_predict=6, **GREEDY)["content"] == text
    head = http.post("/tokenize", json={"content": "The capital"}).json()["tokens"]
    assert completion(http, prompt=[*head, " of France is"], n_predict=6, **GREEDY)["content"] == text
    several = completion(http, prompt=["The capital of France is", ids], n_predict=6, **GREEDY)
    assert [r["index"] for r in several] == [0, 1] and [r["content"] for r in several] == [text, text]
    two = completion(http, prompt="Once upon a time", n_predict=4, n_cmpl=2, temperature=1.0, seed=3)
    assert [r["index"] for r in two] == [0, 1]


def test_stop_types_and_stopping_word(http):
    free = completion(http, prompt="1, 2, 3, 4, 5,", n_predict=12, ignore_eos=True, **GREEDY)
    assert free["stop_type"] == "limit" and free["tokens_predicted"] == 12
    word = free["content"][len(free["content"]) // 2 :][:2]
    cut = completion(http, prompt="1, 2, 3, 4, 5,", n_predict=12, stop=[word], **GREEDY)
    assert cut["stop_type"] == "word" and cut["stopping_word"] == word
    assert cut["content"] == free["content"][: free["content"].index(word)]
    eos = completion(http, prompt=CHAT_PROMPT, n_predict=64, **GREEDY)
    assert eos["stop_type"] == "eos" and eos["tokens_predicted"] < 64
    nothing = completion(http, prompt="Hello there", n_predict=0)
    n_prompt = len(http.post("/tokenize", json={"content": "Hello there"}).json()["tokens"])
    assert (nothing["content"], nothing["tokens_predicted"], nothing["tokens_evaluated"]) == ("", 0, n_prompt)
    (streamed,) = events(http, prompt="Hello there", n_predict=0)
    assert streamed["stop"] is True and streamed["tokens_evaluated"] == n_prompt


def test_streamed_as_llama_server_streams(http):
    whole = completion(http, prompt=CHAT_PROMPT, n_predict=10, **GREEDY)
    chunks = events(http, prompt=CHAT_PROMPT, n_predict=10, n_probs=1, **GREEDY)
    *parts, last = chunks
    assert parts and all(c["stop"] is False for c in parts) and last["stop"] is True
    assert "".join(c["content"] for c in parts) == whole["content"]
    assert sum(len(c["tokens"]) for c in parts) == whole["tokens_predicted"] == last["tokens_predicted"]
    assert all(len(c["completion_probabilities"]) == len(c["tokens"]) for c in parts if c["tokens"])
    assert last.keys() == RESULT_KEYS and last["content"] == "" and last["tokens"] == []
    assert last["timings"].keys() == TIMING_KEYS and last["stop_type"] == whole["stop_type"]


def test_grammar_and_json_schema(http):
    out = completion(http, prompt=CHAT_PROMPT, grammar='root ::= "yes" | "no"', n_predict=8)
    assert out["content"] in ("yes", "no") and out["stop_type"] == "eos"
    assert out["generation_settings"]["grammar"] == 'root ::= "yes" | "no"'
    schema = {"type": "object", "properties": {"n": {"type": "integer"}}, "required": ["n"]}
    out = completion(http, prompt=CHAT_PROMPT, json_schema=schema, n_predict=40)
    assert isinstance(json.loads(out["content"])["n"], int)


def test_a_grammar_llama_cpp_cannot_parse_is_a_400_quoting_why(http):
    messages = [{"role": "user", "content": "hi"}]
    refused(
        http.post("/completion", json={"prompt": "x", "grammar": "root ::= foo"}),
        400,
        "Undefined rule identifier 'foo'",
    )
    refused(http.post("/completion", json={"prompt": "x", "grammar": 'root ::= ("a"'}), 400, "expecting ')'")
    refused(
        http.post("/completion", json={"prompt": "x", "grammar": 'rot ::= "a"'}),
        400,
        "does not contain a 'root' symbol",
    )
    for path, body in (("/v1/chat/completions", {"messages": messages}), ("/v1/completions", {"prompt": "x"})):
        r = http.post(path, json={**body, "grammar": "root ::= [a-"})
        assert r.status_code == 400 and r.json()["error"]["param"] == "grammar"
        assert "unexpected end of input" in r.json()["error"]["message"]
    wait_idle(http)


def test_grammar_on_the_openai_routes(http):
    messages = [{"role": "user", "content": "Is Paris in France?"}]
    grammar = 'root ::= "yes" | "no"'
    r = http.post("/v1/chat/completions", json={"messages": messages, "grammar": grammar, "max_tokens": 8})
    assert r.status_code == 200 and r.json()["choices"][0]["message"]["content"] in ("yes", "no")
    r = http.post("/v1/completions", json={"prompt": CHAT_PROMPT, "grammar": grammar, "max_tokens": 8})
    assert r.status_code == 200 and r.json()["choices"][0]["text"] in ("yes", "no")
    r = http.post(
        "/v1/chat/completions",
        json={"messages": messages, "grammar": grammar, "response_format": {"type": "json_object"}},
    )
    assert r.status_code == 400 and r.json()["error"]["param"] == "grammar"


def test_bad_completion_bodies_name_what_is_wrong(http):
    post = lambda **body: http.post("/completion", json=body)  # noqa: E731
    refused(post(prompt="x", n_predict=-5), 400, "n_predict")
    refused(post(prompt="x", top_p=2), 400, "top_p")
    refused(post(prompt=[1, 1 << 30]), 400, "outside the vocabulary")
    refused(post(prompt={"a": 1}), 400, "prompt")
    refused(post(prompt=[]), 400, "prompt")
    refused(post(prompt="x", grammar='root ::= "a"', json_schema={}), 400, "grammar")
    refused(post(prompt="x", grammar='root ::= "a"', grammar_lazy=True), 400, "grammar_lazy")
    refused(post(prompt="x", post_sampling_probs=True), 400, "post_sampling_probs")
    refused(post(prompt="x", logit_bias=[[1, "a"]]), 400, "logit_bias")
    refused(post(prompt="x", n_probs=50), 400, "n_probs")
    refused(http.post("/completion", content=b"{nope", headers={"content-type": "application/json"}), 400)
    # A near miss of a known field is a typo, refused naming both (dropped, it would generate to the end);
    # a new field is not.
    refused(post(prompt="x", n_prdict=3), 400, "`n_prdict`", "`n_predict`")
    assert (
        completion(http, prompt="x", n_predict=2, min_tokens=5, a_new_field={"x": 1}, **GREEDY)["tokens_predicted"] <= 2
    )
    # What llama.cpp's clients send that cLLM does not apply is accepted.
    out = completion(
        http,
        prompt="x",
        n_predict=1,
        dry_multiplier=0.8,
        mirostat=2,
        samplers=["top_k"],
        cache_prompt=False,
        logit_bias={"13": False},
        xtc_probability=0.5,
        typical_p=0.9,
        id_slot=3,
    )
    assert out["tokens_predicted"] == 1 and out["generation_settings"]["logit_bias"][0]["token"] == 13


def test_response_fields_pick_and_unnest(http):
    out = completion(
        http, prompt="Hi", n_predict=2, response_fields=["content", "generation_settings/n_predict", "nope"], **GREEDY
    )
    assert out.keys() == {"content", "generation_settings/n_predict"} and out["generation_settings/n_predict"] == 2


# ---- /props, /slots, /apply-template --------------------------------------------------


def test_props(http):
    props = http.get("/props").json()
    assert props["total_slots"] == 16 and props["default_generation_settings"]["n_ctx"] == 512
    assert props["default_generation_settings"]["params"]["temperature"] == 0.8
    assert "<|im_start|>" in props["chat_template"] and props["model_path"].endswith(".gguf")
    assert props["modalities"] == {"vision": False, "video": False, "audio": False}
    refused(http.post("/props", json={}), 501, "does not support changing global properties")


BUSY_SLOT_KEYS = {
    "id",
    "n_ctx",
    "speculative",
    "is_processing",
    "id_task",
    "n_prompt_tokens",
    "n_prompt_tokens_processed",
    "n_prompt_tokens_cache",
    "params",
    "next_token",
}


def test_slots_show_the_requests_running(http, server):
    wait_idle(http)
    idle = http.get("/slots").json()
    assert len(idle) == 16 and [s["id"] for s in idle] == list(range(16))
    assert all(s.keys() == {"id", "n_ctx", "speculative", "is_processing"} and not s["is_processing"] for s in idle)
    with running(server.url, "/completion", {"prompt": "Once", "n_predict": 300, "ignore_eos": True}):
        busy = [s for s in http.get("/slots").json() if s["is_processing"]]
        assert len(busy) == 1 and busy[0]["params"]["n_predict"] == 300 and busy[0]["params"]["ignore_eos"] is True
        assert busy[0].keys() == BUSY_SLOT_KEYS and busy[0]["next_token"][0]["n_decoded"] >= 1
        assert busy[0]["n_prompt_tokens"] == len(http.post("/tokenize", json={"content": "Once"}).json()["tokens"])
    wait_idle(http)


def test_apply_template_renders_as_the_chat_route(http):
    messages = [{"role": "user", "content": "What is the capital of France?"}]
    prompt = http.post("/apply-template", json={"messages": messages}).json()["prompt"]
    assert prompt.endswith("<|im_start|>assistant\n") and "What is the capital of France?" in prompt
    tokens = http.post("/tokenize", json={"content": prompt, "add_special": True}).json()["tokens"]
    usage = http.post("/v1/chat/completions", json={"messages": messages, "max_tokens": 1}).json()["usage"]
    assert usage["prompt_tokens"] == len(tokens)
    refused(http.post("/apply-template", json={"messages": []}), 400, "messages")


# ---- /infill ----------------------------------------------------------------------------


def test_infill_on_a_model_without_fim_tokens(http):
    error = refused(http.post("/infill", json={"input_prefix": "def f(", "input_suffix": ")"}), 501)
    assert (
        error["message"]
        == "Infill is not supported by this model: prefix token is missing. suffix token is missing. middle token is "
        "missing. "
    )
    assert error["type"] == "not_supported_error"


# The embedded vocabulary's control tokens, named as FIM tokens in a copy of the model.
FIM_IDS = {"fim_pre": 11, "fim_suf": 12, "fim_mid": 13, "fim_rep": 3, "fim_sep": 5}


@pytest.fixture(scope="module")
def fim_model(tmp_path_factory) -> str:
    """A copy of the embedded model whose metadata names FIM tokens."""
    import gguf

    meta = {f"tokenizer.ggml.{name}_token_id": (gguf.GGUFValueType.UINT32, i) for name, i in FIM_IDS.items()}
    return embedded_with(str(tmp_path_factory.mktemp("fim") / "smollm2-fim.gguf"), meta)


@pytest.fixture(scope="module")
def fim_server(fim_model):
    with start_server("--model", fim_model, "--parallel", "2", "--ctx-size", "2048") as srv, srv.client() as c:
        yield c


INFILL = {
    "input_prefix": "def add(a, b):\n    return ",
    "input_suffix": "\n\nprint(add(1, 2))\n",
    "prompt": "a",
    "input_extra": [{"filename": "util.py", "text": "x = 1\n"}],
    "n_predict": 4,
    "ignore_eos": True,
    **GREEDY,
}


def test_infill_builds_llama_servers_prompt_and_generates(fim_server):
    out = fim_server.post("/infill", json=INFILL)
    assert out.status_code == 200, out.text
    out = out.json()
    expected = (
        "<repo_name>myproject\n<file_sep>util.py\nx = 1\n<file_sep>filename\n"
        "<jupyter_start>def add(a, b):\n    return a<jupyter_text>\n\nprint(add(1, 2))\n<jupyter_code>"
    )
    assert out["prompt"] == expected
    assert out["tokens_predicted"] == 4 and out["stop_type"] == "limit"
    chunks = events(fim_server, "/infill", **INFILL)
    assert chunks[-1]["stop"] is True and "".join(c["content"] for c in chunks) == out["content"]
    refused(fim_server.post("/infill", json={"input_suffix": ""}), 400, "input_prefix")
    refused(fim_server.post("/infill", json={**INFILL, "input_sufix": "x"}), 400, "`input_sufix`", "`input_suffix`")
    refused(
        fim_server.post("/infill", json={"input_prefix": "", "input_suffix": "", "input_extra": [{"filename": "a"}]}),
        400,
        "text",
    )


# ---- beside llama-server ----------------------------------------------------------------


@pytest.fixture(scope="module")
def llama_server(tmp_path_factory):
    from cllm.core.model_file import resolve_model

    with llama_server_on(resolve_model(None), tmp_path_factory, "--parallel", "2", "--ctx-size", "1024") as c:
        yield c


def test_the_same_keys_and_types_as_llama_server(http, llama_server):
    both = (http, llama_server)
    body = {"prompt": "The capital of France is", "n_predict": 4, "n_probs": 2, **GREEDY}
    ours, theirs = (completion(c, **body) for c in both)
    settings = ONLY_LLAMA_SERVER["settings"]
    same_shape({**ours, "generation_settings": {}}, {**theirs, "generation_settings": {}}, "completion")
    same_shape(ours["generation_settings"], theirs["generation_settings"], "generation_settings", settings)
    ours, theirs = (events(c, **body) for c in both)
    same_shape(ours[0], theirs[0], "partial chunk")
    same_shape({**ours[-1], "generation_settings": {}}, {**theirs[-1], "generation_settings": {}}, "last chunk")
    ours, theirs = (c.get("/props").json() for c in both)
    same_shape(
        {**ours, "default_generation_settings": {}},
        {**theirs, "default_generation_settings": {}},
        "props",
        ONLY_LLAMA_SERVER["props"],
    )
    assert ours["chat_template_caps"] == theirs["chat_template_caps"]  # the same probes of the same template
    same_shape(
        ours["default_generation_settings"]["params"],
        theirs["default_generation_settings"]["params"],
        "props params",
        settings,
    )
    ours, theirs = (c.get("/slots").json() for c in both)
    same_shape(ours[0], {k: theirs[0][k] for k in ours[0]}, "idle slot")  # llama-server's keeps its last task's fields
    ran = next(s for s in theirs if "id_task" in s)
    assert ran.keys() - ONLY_LLAMA_SERVER["slot"] == BUSY_SLOT_KEYS
    messages = {"messages": [{"role": "user", "content": "hi"}]}
    ours, theirs = (c.post("/apply-template", json=messages).json() for c in both)
    assert ours == theirs
    ours, theirs = (c.post("/infill", json={"input_prefix": "a", "input_suffix": "b"}) for c in both)
    assert ours.status_code == theirs.status_code == 501 and ours.json() == theirs.json()
    ours, theirs = (c.post("/props", json={}) for c in both)
    assert (
        ours.status_code == theirs.status_code == 501 and ours.json()["error"]["type"] == theirs.json()["error"]["type"]
    )
    ours, theirs = (c.post("/completion", json={"prompt": "x", "grammar": "root ::= foo"}) for c in both)
    assert ours.status_code == theirs.status_code == 400
    assert ours.json()["error"].keys() == theirs.json()["error"].keys()


def test_infill_as_llama_server_builds_it(fim_model, fim_server, tmp_path_factory):
    """The same /infill to llama-server on the same FIM model, sized alike (its batch as cLLM's 512): the same
    prompt."""
    with llama_server_on(
        fim_model, tmp_path_factory, "--parallel", "2", "--ctx-size", "2048", "--batch-size", "512"
    ) as theirs:
        ours, theirs = (c.post("/infill", json=INFILL).json() for c in (fim_server, theirs))
    assert ours["prompt"] == theirs["prompt"] and ours["tokens_evaluated"] == theirs["tokens_evaluated"]
    assert ours["content"] == theirs["content"]
