"""The memory of earlier answers (engine_proc/step/ngram_memory.py) in a server: a repeated answer comes back in drafts,
for its own API key only, each draft still verified; its counts on /metrics and in llama-server's timings; kept
across a restart with --cache-dir."""

from __future__ import annotations

import httpx
import pytest

from tests.conftest import start_server, wait_idle
from tests.near_tie import greedy

KEYS = ("alice-key", "bob-key", "carol-key", "dave-key")
ARGS = ("--spec-type", "ngram", "--parallel", "2", "--ctx-size", "2048", "--flash-attn", "off", "--cache-type-k", "f32")
# An answer without near ties in its first N tokens (the two best 0.33 nats apart or more, without drafts): a
# draft's rows, computed by other kernels than a one-row step's (up to ~0.1 nats apart with f32 keys and flash
# attention off: tests/test_speculative.py), cannot turn it. The fixture checks that margin first (NEAR).
PROMPT = (
    "<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n"
    "<|im_start|>user\nWrite a Python class for a stack with push, pop and peek methods.<|im_end|>\n"
    "<|im_start|>assistant\n"
)
N = 40  # token 44 parts at a near tie (0.24 nats) on one thread
NEAR = 0.3


def completion(srv, key: str, **body) -> dict:
    """llama-server's /completion, greedy unless the body says otherwise: its tokens and timings."""
    with httpx.Client(base_url=srv.url, timeout=300, headers={"Authorization": f"Bearer {key}"}) as c:
        r = c.post(
            "/completion", json={"prompt": PROMPT, "n_predict": N, "temperature": 0, "return_tokens": True, **body}
        )
        assert r.status_code == 200, r.text
        return r.json()


def counters(srv, since: int | None = None) -> tuple[dict[str, float], int]:
    """llama-server's speculative counters and cllm's own, once the engine went idle and reported them (with
    ``since``, figures that count tokens past it: wait_idle); and its generated tokens then."""
    with httpx.Client(base_url=srv.url, timeout=60, headers={"Authorization": f"Bearer {KEYS[0]}"}) as c:
        generated = wait_idle(c, since=since)["engine"]["generated_tokens"]
        text = c.get("/metrics").text
    out: dict[str, float] = {}
    for line in text.splitlines():
        if line.startswith(("llamacpp:spec_decode_num_", "cllm_spec_drafted_tokens_total", "cllm_spec_accepted")):
            name = line.split("{", 1)[0].split(" ", 1)[0]
            out[name] = out.get(name, 0.0) + float(line.rsplit(" ", 1)[1])
    return out, generated


@pytest.fixture(scope="module")
def cache_dir(tmp_path_factory):
    return str(tmp_path_factory.mktemp("spec-memory"))


@pytest.fixture(scope="module")
def scoped(cache_dir):
    """A server with two keys, their memories apart, kept in cache_dir; and alice's first answer."""
    with start_server(*ARGS, "--cache-dir", cache_dir, env={"CLLM_API_KEY": ",".join(KEYS)}) as srv:
        with httpx.Client(base_url=srv.url, timeout=300, headers={"Authorization": f"Bearer {KEYS[3]}"}) as c:
            body = {"prompt": PROMPT, "max_tokens": N, "speculative": False}
            greedy(c, body, path="/v1/completions", margin=NEAR)  # dave's, whose memory no test reads
        yield srv, completion(srv, KEYS[0])


def accepted(answer: dict) -> int:
    return answer["timings"].get("draft_n_accepted", 0)


def test_a_repeated_answer_comes_back_in_drafts_for_its_own_key_only(scoped):
    srv, first = scoped
    before, generated = counters(srv)
    again = completion(srv, KEYS[0])
    after, _ = counters(srv, since=generated)
    assert again["content"] == first["content"] and again["tokens_predicted"] == N
    assert accepted(again) >= 0.75 * N, again["timings"]  # all but the tokens its first draft needs
    assert accepted(again) <= again["timings"]["draft_n"]
    # The counters moved with it, llama-server's names and cllm's alike.
    moved = {k: after.get(k, 0) - before.get(k, 0) for k in after}
    assert moved["llamacpp:spec_decode_num_accepted_tokens_total"] == accepted(again)
    assert moved["llamacpp:spec_decode_num_draft_tokens_total"] == again["timings"]["draft_n"]
    assert moved["cllm_spec_accepted_tokens_total"] == accepted(again)
    assert 1 <= moved["llamacpp:spec_decode_num_drafts_total"] <= N // 8
    # Another key: its own text only, as if alice had never asked.
    bob = completion(srv, KEYS[1])
    assert bob["content"] == first["content"]
    assert accepted(bob) <= accepted(first) + 4, (bob["timings"], first["timings"])


def test_a_remembered_draft_is_verified_token_by_token(scoped):
    """The same request with a later token of its remembered answer banned: the memory drafts the answer, and the
    sampler must refuse the banned token where the draft holds it."""
    srv, first = scoped
    tokens = first["tokens"]
    at = next(i for i in range(32, N) if tokens[i] not in tokens[:i])  # its first place in the answer
    banned = completion(srv, KEYS[0], logit_bias=[[tokens[at], False]])
    assert tokens[at] not in banned["tokens"]
    assert banned["tokens"][:at] == tokens[:at]
    assert accepted(banned) >= at // 2, banned["timings"]  # the answer's start came from the memory's drafts


def test_a_seeded_sampled_request_drafts_and_reads_the_same_every_time(scoped):
    srv, _ = scoped
    body = {"temperature": 0.8, "top_p": 0.95, "seed": 1234}
    first = completion(srv, KEYS[0], **body)  # its text is remembered now, as alice's greedy answer is
    again = completion(srv, KEYS[0], **body)
    assert again["content"] == first["content"]
    assert again["timings"].get("draft_n") == first["timings"].get("draft_n")  # from its own text only


def test_the_memory_outlives_a_restart_with_a_cache_dir(scoped, cache_dir):
    srv, first = scoped
    srv.stop()
    with start_server(*ARGS, "--cache-dir", cache_dir, env={"CLLM_API_KEY": ",".join(KEYS)}) as again:
        answer = completion(again, KEYS[0])
        assert answer["content"] == first["content"]
        assert accepted(answer) >= 0.75 * N, answer["timings"]
        assert accepted(completion(again, KEYS[2])) <= accepted(first) + 4  # a key that never asked


def test_the_operator_may_share_the_memory_across_keys():
    with start_server(*ARGS, "--spec-memory-shared", env={"CLLM_API_KEY": ",".join(KEYS)}) as srv:
        first = completion(srv, KEYS[0])
        bob = completion(srv, KEYS[1])
        assert bob["content"] == first["content"]
        assert accepted(bob) >= 0.75 * N, bob["timings"]


# Code to copy. Its second answer parted from the first at token 38 while a remembered token lost every near tie
# (the embedded Q4_1, llama.cpp's default kernels, a 2-core AMD EPYC); keeping them, all 160 came back the same.
COPY = (
    "Copy this code exactly:\n\ndef merge(a, b):\n    out = []\n    i = j = 0\n    while i < len(a) and j < len(b):\n"
    "        if a[i] <= b[j]:\n            out.append(a[i])\n            i += 1\n        else:\n"
    "            out.append(b[j])\n            j += 1\n    out.extend(a[i:])\n    out.extend(b[j:])\n    return out\n\n"
    "def merge_sort(xs):\n    if len(xs) <= 1:\n        return xs\n    mid = len(xs) // 2\n"
    "    return merge(merge_sort(xs[:mid]), merge_sort(xs[mid:]))\n"
)


def test_a_repeated_answer_comes_back_whole_across_near_ties():
    """With llama.cpp's default kernels (flash attention, f16 keys) a draft's rows and a one-row step's move Q4_1's
    logits ~0.6 apart: the same request asked again keeps its earlier answer's token wherever the two are that close,
    and the whole answer comes back in drafts."""
    with start_server("--spec-type", "ngram", "--parallel", "1", "--ctx-size", "2048") as srv, srv.client() as c:
        prompt = c.post("/apply-template", json={"messages": [{"role": "user", "content": COPY}]}).json()["prompt"]
        body = {"prompt": prompt, "n_predict": 160, "temperature": 0, "ignore_eos": True}  # 160 wherever it would end
        first = c.post("/completion", json=body).json()
        again = c.post("/completion", json=body).json()
    assert first["tokens_predicted"] == again["tokens_predicted"] == 160
    assert again["content"] == first["content"]
    assert again["timings"]["draft_n_accepted"] >= 150, again["timings"]
