"""Speculative decoding: drafts from the sequence's own text, verified in the step's batch.

A verified token is the one the sequence's sampler picks on that row, so
speculation may change only the last bits of the rows' logits (a query of
several tokens and a query of one go through other kernels). So greedy replies
with speculation on and off must be the same, or part only where the two best
tokens are nearly tied in both runs: same_or_parted_at_a_near_tie.
docs/internals.md ("Speculative decoding") says what differs, where and why.
"""

from __future__ import annotations

import json
import pathlib
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest

from cllm.core.config_load import load_config
from cllm.core.settings import ConfigError
from engine_proc.step.draft_pricing import StepCosts
from engine_proc.step.drafter import lookup
from tests.conftest import generated, start_server, wait_idle
from tests.near_tie import NEAR_TIE
from tests.test_metrics import scrape, value

EXACT = ("--parallel", "4", "--ctx-size", "8192", "--flash-attn", "off", "--cache-type-k", "f32")
# engine_proc/run/batch.py as it was: fixed text, fixed figures
CODE = pathlib.Path(__file__).resolve().parent.joinpath("copy_task.txt").read_text()
# The file first, the task after it: the prompts share the file's cells, so each server prefills it once.
COPY = f"Here is a file:\n\n{CODE}\n\nCopy it exactly as it is."
# Free text that quotes the file: its greedy reply, with drafts or without, agrees for 128 tokens (quoting the
# docstring, then one sentence on the class parted at the 20th, at a tie 0.055 nats apart).
QUOTE = f"Here is a file:\n\n{CODE}\n\nWhat does the class do? Quote the line that says so."
ORDINARY = "Write a short story about a lighthouse keeper who finds a message in a bottle."
MAX_TOKENS = 128


# Where a draft's rows and a plain step's row give other last bits, greedy text may part where the two best tokens
# are nearly tied (NEAR_TIE); a token kept without being the sampler's pick would show as a token outside the top 2,
# or one far from tied, in the run without drafts.
# A parting ends the comparison, so one early in a reply would leave the rest of it unchecked: the prompts are ones
# whose replies agree for most of their length, and a parting before this share of the longer reply fails.
AGREED = 0.5
TOP2 = {"logprobs": True, "top_logprobs": 2}


def greedy_picks(reply: dict) -> None:
    """Each token of a greedy reply is the likeliest on its row, as its own top-2 logprobs say: a verifier that kept
    a drafted token the sampler did not pick shows here, wherever it did, after a parting too."""
    for i, row in enumerate(reply["logprobs"]["content"]):
        best = row["top_logprobs"][0]
        assert row["bytes"] == best["bytes"], f"token {i} is not its row's likeliest: {row}"


def same_or_parted_at_a_near_tie(a: dict, b: dict, grammar: bool = False) -> int | None:
    """Where two greedy replies (choices with top-2 logprobs) part, or None: they are the same, or the same up to a
    token where both runs' two best are the same two tokens, under NEAR_TIE apart in each run, past AGREED of the
    longer reply. Each token of each is its row's greedy pick (greedy_picks), but under a ``grammar``."""
    ta, tb = a["logprobs"]["content"], b["logprobs"]["content"]
    if not grammar:
        greedy_picks(a)
        greedy_picks(b)
    longest = max(len(ta), len(tb))

    def best_two(row: dict) -> tuple[set[bytes], float]:
        first, second = row["top_logprobs"][:2]
        return {bytes(first["bytes"]), bytes(second["bytes"])}, first["logprob"] - second["logprob"]

    for i, (x, y) in enumerate(zip(ta, tb)):
        if x["bytes"] != y["bytes"]:
            for row in (x, y):
                two, gap = best_two(row)
                assert two == {bytes(x["bytes"]), bytes(y["bytes"])} and gap < NEAR_TIE, (i, x, y)
            assert i >= AGREED * longest, f"parted at a near tie at token {i} of {longest}: too early to end there"
            return i
    if len(ta) != len(tb):  # one ended on an end-of-generation token, which has no entry: the other's row is the tie
        (short, _), (_, longer) = sorted(((a, ta), (b, tb)), key=lambda r: len(r[1]))
        n = min(len(ta), len(tb))
        assert short["finish_reason"] == "stop" and best_two(longer[n])[1] < NEAR_TIE, (n, longer[n])
        assert n >= AGREED * longest, f"parted at a near tie at token {n} of {longest}: too early to end there"
        return n
    assert (a["message"], a["finish_reason"]) == (b["message"], b["finish_reason"])
    return None


def chat(http, prompt: str, **body) -> dict:
    r = http.post(
        "/v1/chat/completions",
        json={"messages": [{"role": "user", "content": prompt}], "max_tokens": MAX_TOKENS, "temperature": 0, **body},
    )
    assert r.status_code == 200, r.text
    return r.json()["choices"][0]


class Plain:
    """The server without drafts, the reference: its greedy reply (top-2 logprobs) to a prompt is asked once, of
    MAX_TOKENS; the reply to fewer is that one cut, as a greedy token does not depend on the limit that comes after it.
    """

    def __init__(self, http):
        self.http = http
        self.replies: dict[str, dict] = {}

    def reply(self, prompt: str, max_tokens: int = MAX_TOKENS) -> dict:
        assert max_tokens <= MAX_TOKENS
        if prompt not in self.replies:
            self.replies[prompt] = chat(self.http, prompt, **TOP2)
        full = self.replies[prompt]
        tokens = full["logprobs"]["content"]
        if max_tokens == MAX_TOKENS or max_tokens > len(tokens):  # asked, or it ended before the limit
            return full
        cut = tokens[:max_tokens]
        text = b"".join(bytes(t["bytes"]) for t in cut).decode()
        return {
            **full,
            "message": {**full["message"], "content": text},
            "logprobs": {**full["logprobs"], "content": cut},
            "finish_reason": "length",
        }


@pytest.fixture(scope="module")
def servers():
    """(speculation on, off), otherwise alike: an HTTP client, a Plain."""
    with start_server(*EXACT, "--spec-type", "ngram") as on, start_server(*EXACT, "--spec-type", "none") as off:
        with on.client() as a, off.client() as b:
            yield a, Plain(b)


def accepted(http, since: int | None = None) -> float:
    """Accepted draft tokens, as of the engine's figures that count every token past ``since`` (generated())."""
    wait_idle(http, since=since)
    return value(scrape(http), "cllm_spec_accepted_tokens_total")


@pytest.mark.parametrize("prompt", [COPY, QUOTE, ORDINARY], ids=["copy", "quote", "ordinary"])
def test_greedy_text_is_the_same_with_speculation_on_and_off(servers, prompt):
    on, off = servers
    before, made = accepted(on), generated(on)
    same_or_parted_at_a_near_tie(chat(on, prompt, **TOP2), off.reply(prompt))
    if prompt is COPY:
        assert accepted(on, since=made) - before > 40  # most of the copy came from drafts


def test_concurrent_requests_give_the_same_text(servers):
    on, off = servers
    prompts = [COPY, ORDINARY, QUOTE, COPY + "\n\nWord for word."]  # the last: the first's cells and other drafts
    with ThreadPoolExecutor(len(prompts)) as pool:
        together = list(pool.map(lambda p: chat(on, p, max_tokens=96, **TOP2), prompts))
    for a, p in zip(together, prompts):
        # Free text parts from the one-row run at early near ties in a batch of four (the story at token 19, the
        # quote at token 8, in make test): each of its tokens must still be its row's likeliest. Copies agree whole.
        if p is ORDINARY or p is QUOTE:
            greedy_picks(a)
            continue
        same_or_parted_at_a_near_tie(a, off.reply(p, 96))


def test_max_tokens_and_a_stop_string_inside_a_draft(servers):
    on, off = servers
    full = off.reply(COPY)
    parted = same_or_parted_at_a_near_tie(chat(on, COPY, **TOP2), full)
    text = full["message"]["content"]
    agreed = b"".join(bytes(t["bytes"]) for t in full["logprobs"]["content"][:parted]).decode(errors="ignore")
    assert text.startswith(agreed)
    # A stop string from the text both servers gave, late in it where drafts are long: the reply ends right before it.
    spots = [i for i in range(len(agreed) - 8) if text.find(text[i : i + 8]) == i]
    at = next((i for i in spots if i >= len(agreed) // 2), spots[-1])
    stop = text[at : at + 8]
    for body, finish in (({"max_tokens": 97}, "length"), ({"stop": [stop]}, "stop")):
        before, made = accepted(on), generated(on)
        a = chat(on, COPY, **body, **TOP2)
        b = off.reply(COPY, 97) if finish == "length" else chat(off.http, COPY, **body, **TOP2)
        assert b["finish_reason"] == finish
        if same_or_parted_at_a_near_tie(a, b) is None:
            assert a["finish_reason"] == finish
        assert accepted(on, since=made) > before
    assert b["message"]["content"] == text[:at]
    assert len(chat(on, COPY, max_tokens=97, logprobs=True)["logprobs"]["content"]) == 97


def test_streamed_tokens_arrive_as_accepted(servers):
    on, off = servers
    body = {"messages": [{"role": "user", "content": COPY}], "max_tokens": 120, "temperature": 0, "stream": True}
    with on.stream("POST", "/v1/chat/completions", json={**body, **TOP2}) as r:
        choices = [json.loads(line[6:])["choices"][0] for line in r.iter_lines() if line.startswith("data: {")]
    streamed = {
        "message": {"role": "assistant", "content": "".join(c["delta"].get("content") or "" for c in choices)},
        "logprobs": {"content": [t for c in choices if c.get("logprobs") for t in c["logprobs"]["content"]]},
        "finish_reason": choices[-1]["finish_reason"],
    }
    same_or_parted_at_a_near_tie(streamed, off.reply(COPY, 120))


def test_a_grammar_constrained_request(servers):
    on, off = servers
    schema = {
        "type": "object",
        "properties": {"docstring": {"type": "string", "maxLength": 60}},
        "required": ["docstring"],
    }
    fmt = {"type": "json_schema", "json_schema": {"name": "quote", "schema": schema}}
    prompt = f"Here is a file:\n\n{CODE}\n\nQuote its docstring in JSON."
    before, made = accepted(on), generated(on)
    a = chat(on, prompt, response_format=fmt, max_tokens=200, **TOP2)
    assert a["finish_reason"] == "stop"
    assert (
        json.loads(a["message"]["content"])["docstring"]
        == "A llama_batch backed by numpy arrays that live as long as it"
    )
    assert accepted(on, since=made) > before  # the quote came from drafts, each token checked by the grammar
    same_or_parted_at_a_near_tie(a, chat(off.http, prompt, response_format=fmt, max_tokens=200, **TOP2), grammar=True)


def test_a_seeded_sampled_request_is_reproducible(servers):
    on, _ = servers
    body = {"temperature": 0.8, "top_p": 0.95, "seed": 1234, "max_tokens": 96}
    # The prompt cached first: a prefill from scratch and one from the cache give logits that differ in the last bits
    # (as llama-server warns of cache_prompt), enough to change a sampled token; run alone, the test compared the two.
    chat(on, COPY, max_tokens=1)
    first = chat(on, COPY, **body)
    assert chat(on, COPY, **body) == first  # each row is sampled by the sequence's own seeded chain
    assert chat(on, COPY, **{**body, "seed": 99}) != first


def test_a_request_may_turn_speculation_off(servers):
    on, off = servers
    before, made = accepted(on), generated(on)
    # No drafts: the same kernels, so bit for bit; the plain server asked afresh, its prompt cached like this one's
    # (a cut reply from when it was not could differ in the last bits).
    assert chat(on, COPY, speculative=False, max_tokens=96) == chat(off.http, COPY, max_tokens=96)
    assert accepted(on, since=made) == before
    r = on.post("/v1/chat/completions", json={"messages": [{"role": "user", "content": "hi"}], "speculative": "yes"})
    assert r.status_code == 400 and "speculative" in r.text


def test_metrics_count_drafted_and_accepted_tokens(servers):
    on, _ = servers
    made = generated(on)
    chat(on, COPY)
    wait_idle(on, since=made)
    samples = scrape(on)
    drafted, kept = value(samples, "cllm_spec_drafted_tokens_total"), value(samples, "cllm_spec_accepted_tokens_total")
    assert 0 < kept <= drafted
    assert value(samples, "cllm_spec_step_drafted_tokens_sum") == drafted
    assert value(samples, "cllm_spec_step_accepted_tokens_sum") == kept
    assert value(samples, "cllm_prefix_cache_hit_tokens_total") > 0  # the repeated prompts came from the cache
    info = on.get("/model/info").json()["data"]
    assert (info["spec_type"], info["draft_max"]) == ("ngram", 64)


def test_lookup_takes_the_longest_then_the_latest_match():
    t = np.array([1, 2, 3, 4, 9, 9, 5, 2, 3, 4, 7, 7, 1, 2, 3, 4], np.int32)
    assert lookup(t, 2).tolist() == [9, 9]  # "1 2 3 4" matches at the start; "2 3 4" alone, later, is shorter
    t = np.array([4, 2, 3, 8, 5, 2, 3, 6, 0, 2, 3], np.int32)
    assert lookup(t, 3) is None  # no match of four tokens
    t = np.array([1, 2, 3, 4, 8, 1, 2, 3, 4, 6, 1, 2, 3, 4], np.int32)
    assert lookup(t, 5).tolist() == [6, 1, 2, 3, 4]  # the latest of two equal matches, up to the text's end
    # past the text's end, around the repeat: the text since the match goes on as it went
    assert lookup(t, 8).tolist() == [6, 1, 2, 3, 4, 6, 1, 2]
    assert lookup(np.array([5, 7, 7, 7, 7, 7], np.int32), 3).tolist() == [7, 7, 7]


def test_yaml_config_and_bad_settings(tmp_path):
    config = tmp_path / "cllm.yaml"
    config.write_text("spec-type: none\ndraft-max: 8\n")
    assert load_config(str(config), {}).spec_type == "none"
    for bad in ("spec-type: eagle\n", "draft-max: 0\n", "draft-max: 1000\n"):
        config.write_text(bad)
        with pytest.raises(ConfigError, match="spec-type|draft-max"):
            load_config(str(config), {})


def test_the_share_a_draft_must_keep_comes_from_measured_steps():
    costs = StepCosts()
    assert costs.break_even(8, 16) == 1.0  # no draft before a plain step of 8 sequences is timed
    costs.observe(8, 0, 0.040)  # 8 sequences, no draft: 5 ms a token
    assert costs.break_even(8, 16) == pytest.approx(8 / 9)  # the prior, until a step with drafts is timed too
    costs.observe(8, 20, 0.120)  # 20 drafted tokens add 80 ms: 4 ms each
    assert costs.break_even(8, 20) == pytest.approx(0.8, rel=1e-3)
    assert costs.break_even(8, 60) == pytest.approx(0.8, rel=1e-3)  # one size timed: a mean a row
    # drafts of other sizes: 4 rows add 40 ms, 64 rows 220 ms: a fixed part (28 ms) and 3 ms a row
    costs = StepCosts()
    costs.observe(8, 0, 0.040)
    for _ in range(3):
        costs.observe(8, 4, 0.080)
        costs.observe(8, 64, 0.260)
    assert costs.added(8, 4) == pytest.approx(0.040, rel=1e-3)
    assert costs.added(8, 64) == pytest.approx(0.220, rel=1e-3)
    assert costs.break_even(8, 4) == 1.0  # a short draft pays for the fixed part alone: never worth it
    assert costs.break_even(8, 64) == pytest.approx(0.220 / 64 * 8 / 0.040, rel=1e-3)  # a long one may
    costs.observe(32, 0, 0.100)
    costs.observe(32, 10, 0.140)  # 4 ms a drafted token against ~3 ms a token: never worth it
    assert costs.break_even(32, 10) == 1.0
    costs.observe(1, 0, 0.008)
    costs.observe(1, 8, 0.100)
    assert costs.break_even(1, 8) == 0.5  # alone, always the prior: the same drafts every run
