"""A draft model (--model-draft) in a server: the embedded SmolLM2's weights in F16 as the target, the embedded
Q4_1 as its draft (the same family at two precisions, as users pair them). Drafts are verified token by token, so
the text is the target's; a seeded sampled request repeats; the counters move; a repeated prompt the prefix cache
serves, a restart on --cache-dir and exact mode read the same with the draft still accepted; two requests at
once read as alone; a draft whose vocabulary cannot serve the target (perf/synth_gemma3.py's text model: Gemma 3's
BOS and EOS) is refused at start."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest

from cllm.core.model_file import resolve_model
from perf import synth_gemma3
from tests.conftest import start_server
from tests.near_tie import greedy
from tests.test_spec_memory import NEAR, counters

# Without near ties in its first N tokens on the F16 target (NEAR apart or more; the fixture checks that first).
PROMPT = (
    "<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n"
    "<|im_start|>user\nWrite a Python class for a queue with enqueue and dequeue methods.<|im_end|>\n"
    "<|im_start|>assistant\n"
)
N = 64
# A text to copy that no model guesses without reading it: its drafts hold only where the draft context has the
# prompt's cells, so a draft model that skipped the cells the target's prefix cache served would lose them. The
# reply, 37 tokens, has no near tie either.
COPY = PROMPT.replace(
    "Write a Python class for a queue with enqueue and dequeue methods.",
    "Repeat exactly: Zelda bought 14 green pears, 3 tin whistles, 88 paper cranes and 5 jars of honey at the "
    "Kessler market on Friday.",
)
ARGS = ("--parallel", "2", "--ctx-size", "2048", "--flash-attn", "off", "--cache-type-k", "f32")


def completion(srv, **body) -> dict:
    """llama-server's /completion of PROMPT, greedy unless the body says otherwise: its text, tokens and timings."""
    with httpx.Client(base_url=srv.url, timeout=300) as c:
        r = c.post(
            "/completion", json={"prompt": PROMPT, "n_predict": N, "temperature": 0, "return_tokens": True, **body}
        )
        assert r.status_code == 200, r.text
        return r.json()


def accepted(answer: dict) -> int:
    return answer["timings"].get("draft_n_accepted", 0)


def copying(answer: dict, plain: dict) -> None:
    """A reply to COPY drafted all along (a draft a step, n-max 3, after the prefill's token), its drafts held."""
    t = answer["timings"]
    assert t["draft_n"] >= 0.6 * len(plain["tokens"]) and accepted(answer) >= 0.8 * t["draft_n"], t


@pytest.fixture(scope="module")
def cache_dir(tmp_path_factory):
    return str(tmp_path_factory.mktemp("draft-model"))


@pytest.fixture(scope="module")
def drafted(smollm2_f16, cache_dir):
    """The server with the draft model, and its reply without drafts (checked first for near ties: a draft's rows
    are computed by other kernels than a one-row step's, tests/test_speculative.py)."""
    args = ("--model", smollm2_f16, "-md", resolve_model(None), *ARGS, "--cache-dir", cache_dir)
    with start_server(*args) as srv:
        with httpx.Client(base_url=srv.url, timeout=300) as c:
            for prompt in (PROMPT, COPY):
                greedy(
                    c, {"prompt": prompt, "max_tokens": N, "speculative": False}, path="/v1/completions", margin=NEAR
                )
        yield srv, args, completion(srv, speculative=False)


def test_greedy_text_with_the_draft_model_is_the_text_without(drafted):
    srv, _, plain = drafted
    spec = completion(srv)
    assert spec["tokens"] == plain["tokens"] and spec["content"] == plain["content"]
    assert "draft_n" not in plain["timings"] or plain["timings"]["draft_n"] == 0
    # The same weights at two precisions: the draft holds for most tokens, and each draft was verified.
    assert accepted(spec) >= N // 2, spec["timings"]
    assert accepted(spec) <= spec["timings"]["draft_n"]


def test_a_drafted_token_the_target_would_not_pick_is_refused(drafted):
    """A token of the answer banned: the draft model, which knows no bias, drafts it, and the verifier must refuse
    it where the draft holds it."""
    srv, _, plain = drafted
    tokens = plain["tokens"]
    at = next(i for i in range(16, N) if tokens[i] not in tokens[:i])
    banned = completion(srv, logit_bias=[[tokens[at], False]])
    assert tokens[at] not in banned["tokens"]
    assert banned["tokens"][:at] == tokens[:at]
    assert accepted(banned) >= at // 2, banned["timings"]


def test_the_counters_move_with_the_draft_model(drafted):
    srv, _, _ = drafted
    before, generated = counters(srv)
    spec = completion(srv)
    after, _ = counters(srv, since=generated)
    moved = {k: after.get(k, 0) - before.get(k, 0) for k in after}
    assert moved["llamacpp:spec_decode_num_accepted_tokens_total"] == accepted(spec) > 0
    assert moved["llamacpp:spec_decode_num_draft_tokens_total"] == spec["timings"]["draft_n"]
    assert moved["cllm_spec_accepted_tokens_total"] == accepted(spec)
    assert moved["llamacpp:spec_decode_num_drafts_total"] >= 1


def test_a_seeded_sampled_request_reads_the_same_every_time(drafted):
    srv, _, _ = drafted
    body = {"temperature": 0.8, "top_p": 0.95, "seed": 1234}
    first, again = completion(srv, **body), completion(srv, **body)
    assert again["content"] == first["content"]
    assert again["timings"]["draft_n"] == first["timings"]["draft_n"] > 0


def test_a_repeated_prompt_served_by_the_prefix_cache_reads_the_same_and_drafts(drafted):
    srv, _, _ = drafted
    plain = completion(srv, prompt=COPY, speculative=False)
    first, again = completion(srv, prompt=COPY), completion(srv, prompt=COPY)
    assert again["timings"]["cache_n"] > 0  # the target's cells came from the prefix cache
    assert again["tokens"] == first["tokens"] == plain["tokens"]
    # The draft context's cells for the prompt are right too: a copy's drafts hold (copying()).
    copying(again, plain)


def test_two_requests_at_once_read_as_alone_and_both_draft(drafted):
    """--parallel 2: both sequences' drafts come from one batched decode of the draft model and are verified in one
    step of the target; each reads as it does alone."""
    srv, _, plain = drafted
    copy = completion(srv, prompt=COPY, speculative=False)
    with ThreadPoolExecutor(2) as pool:
        a, b = pool.map(lambda p: completion(srv, prompt=p), (PROMPT, COPY))
    assert a["tokens"] == plain["tokens"] and b["tokens"] == copy["tokens"]
    # How much each drafts at two sequences is the step costs' call (engine_proc/step/drafter.py); some is drafted.
    assert accepted(a) + accepted(b) > 0, (a["timings"], b["timings"])


def test_a_restart_on_the_cache_dir_reads_the_same_and_drafts(drafted):
    srv, args, _ = drafted
    plain = completion(srv, prompt=COPY, speculative=False)
    # Prompt and answer over MIN_CELLS (engine_proc/kv/disk_cache.py): the entry goes to a file.
    completion(srv, prompt=COPY, n_predict=96, ignore_eos=True)
    srv.stop()
    with start_server(*args) as again:
        answer = completion(again, prompt=COPY)
        assert answer["tokens"] == plain["tokens"]
        assert answer["timings"]["cache_n"] > 0, answer["timings"]  # the prompt's cells from a --cache-dir file
        copying(answer, plain)


def test_in_exact_mode_a_repeated_prompt_reads_the_same_and_drafts(smollm2_f16):
    """--prefix-cache-exact (prompts prefilled in fixed blocks, only whole blocks reused) with a draft model: the
    repeat's prompt cells come from the cache, and the draft context still holds the prompt (a copy's drafts hold)."""
    args = ("--model", smollm2_f16, "-md", resolve_model(None), *ARGS, "--prefix-cache-exact", "--batch-size", "16")
    with start_server(*args) as srv:
        plain = completion(srv, prompt=COPY, speculative=False)
        first, again = completion(srv, prompt=COPY), completion(srv, prompt=COPY)
        assert again["timings"]["cache_n"] >= 16, again["timings"]
        assert again["tokens"] == first["tokens"] == plain["tokens"]
        copying(again, plain)


def test_a_draft_model_of_another_vocabulary_is_refused_at_start(tmp_path):
    gemma = synth_gemma3.write_text_model(str(tmp_path / "gemma3-tiny.gguf"))
    target = resolve_model(None)
    with pytest.raises(RuntimeError) as refused:
        start_server("--model", target, "-md", gemma, *ARGS).stop()
    assert f"the draft model {gemma} cannot draft for {target}: their BOS tokens differ" in str(refused.value)
