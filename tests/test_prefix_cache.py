"""The prefix cache's default mode: any cached prefix is reused, generated tokens included.

A request reuses the KV cells of the longest prefix it shares with a cached
stream, up to the first token that differs, so a conversation's next turn
prefills only what is new. Prompts are sent as token ids where the test
counts exactly how many tokens are shared.

With flash attention a reused cell may differ in its last bits from a fresh
prefill (a token's cells depend on the query chunk that computed them), so
the servers here run with --flash-attn off, where they do not: there the
cache must change no bit of what the model answers, which catches a cell
reused at the wrong place. tests/test_prefix_cache_exact.py holds the mode
that is exact with flash attention on.
"""

from __future__ import annotations

import pytest

from tests.conftest import start_server
from tests.test_prefix_cache_exact import Side, doc, reused

PARALLEL = 2
CACHE_SLOTS = 2  # 4 streams in all
SEQ_CTX = 1024


def args(cache_slots: int = CACHE_SLOTS) -> tuple[str, ...]:
    return (
        "--parallel",
        str(PARALLEL),
        "--ctx-size",
        str(PARALLEL * SEQ_CTX),
        "--cache-slots",
        str(cache_slots),
        "--flash-attn",
        "off",
    )


@pytest.fixture(scope="module")
def pair():
    """(cache on, cache off)."""
    with (
        start_server(*args()) as on,
        start_server(*args(0), "--no-prefix-cache") as off,
        on.client() as a,
        off.client() as b,
    ):
        yield Side(a), Side(b)


def tokens(side: Side, text: str) -> list[int]:
    return side.http.post("/encode", json={"text": text}).json()["data"]["tokens"]


def complete(side: Side, prompt: list[int], max_tokens: int = 8) -> str:
    """The greedy text that follows ``prompt``."""
    return side.post("/v1/completions", {"prompt": prompt, "max_tokens": max_tokens})["choices"][0]["text"]


def test_a_repeated_prompt_reuses_all_of_it(pair):
    """With the logits its prefill gave (tests/test_repeated_prompt.py): nothing is prefilled again."""
    on, _ = pair
    prompt = tokens(on, doc("repeat", 10))
    text = complete(on, prompt)
    before = on.cache()
    assert complete(on, prompt) == text
    assert reused(before, on.cache()) == len(prompt)


def test_a_prompt_that_diverges_mid_block_reuses_up_to_the_divergence(pair):
    on, off = pair
    prompt = tokens(on, doc("divergence", 15))  # ~230 tokens
    complete(on, prompt)
    cut = 200  # not a multiple of anything the engine uses
    other = prompt[:cut] + tokens(on, " Something else entirely, about boats and rivers.")
    before = on.cache()
    first_on = on.first_token(other)
    assert reused(before, on.cache()) == cut
    assert first_on == off.first_token(other)


def test_generated_tokens_are_reused_as_generation_left_them(pair):
    """A prompt that continues an earlier request's output reuses the cells decoding wrote.

    Those cells come from one-token steps, not a prefill, so the check is
    against the earlier request itself: greedy, going on from its first 12
    tokens gives the rest of its own 24.
    """
    on, _ = pair
    prompt = tokens(on, doc("continuation", 15))
    text = complete(on, prompt, 24)
    generated = tokens(on, text)
    head = prompt + generated[:12]
    before = on.cache()
    rest = complete(on, head, 12)
    assert reused(before, on.cache()) == len(head) - 1  # so the 12 ids are those it generated
    assert tokens(on, text) == generated and text.endswith(rest) and rest


def test_a_conversation_reuses_its_previous_turn_reply_included(pair):
    on, _ = pair
    messages = [{"role": "system", "content": "You answer briefly. " + doc("price", 20)}]
    usage = None
    for question in ("What is the price of item 3?", "And of item 4?", "And of item 9?"):
        messages.append({"role": "user", "content": question})
        before = on.cache()
        reply = on.post("/v1/chat/completions", {"messages": messages, "max_tokens": 16})
        if usage is not None:
            # Everything the previous turn held, its reply included, less what the template changes at its end.
            assert reused(before, on.cache()) >= usage["prompt_tokens"] + usage["completion_tokens"] - 4
        usage = reply["usage"]
        messages.append({"role": "assistant", "content": reply["choices"][0]["message"]["content"]})


def test_conversations_outnumbering_the_running_slots_keep_their_cells(pair):
    """PARALLEL + CACHE_SLOTS conversations, one turn each in turn: every second turn finds its first."""
    side, _ = pair
    n = PARALLEL + CACHE_SLOTS
    prompts = [tokens(side, doc(f"customer {i}", 9)) for i in range(n)]
    for prompt in prompts:
        complete(side, prompt)
    before = side.cache()
    for prompt in prompts:
        complete(side, prompt + tokens(side, " Next question."))
    after = side.cache()
    assert after["hits"] - before["hits"] == n
    assert reused(before, after) >= sum(len(p) for p in prompts)


def test_eviction_under_pressure_moves_the_least_recent_to_host_ram(pair):
    on, off = pair
    streams = PARALLEL + CACHE_SLOTS
    prompts = [tokens(on, doc(f"subject {i}", 9)) for i in range(streams + 2)]  # ~150 tokens: kept in host RAM
    for prompt in prompts:  # each leaves an entry; the oldest leave the streams
        complete(on, prompt, 4)
    before = on.cache()
    assert 0 < before["cells"] <= streams * SEQ_CTX and before["host_cells"] >= len(prompts[0])
    complete(on, prompts[-1] + tokens(on, " More."), 4)  # the most recent is still in a stream
    middle = on.cache()
    assert middle["hits"] == before["hits"] + 1 and middle["restored"] == before["restored"]
    assert reused(before, middle) >= len(prompts[-1])
    later = prompts[0] + tokens(on, " More.")
    assert complete(on, later) == complete(off, later)  # the least recent comes back from host RAM, bit for bit
    after = on.cache()
    assert after["restored"] == middle["restored"] + 1 and reused(middle, after) >= len(prompts[0])


def test_without_host_ram_eviction_drops_the_least_recent():
    with start_server(*args(), "--cache-ram", "0") as server, server.client() as http:
        side = Side(http)
        # Nothing shared from the first token on: each prompt's entry is used by no later one.
        words = ("Apples", "Rivers", "Clocks", "Ships", "Lamps", "Roads")
        prompts = [tokens(side, f"{word}: " + doc(word, 9)) for word in words[: PARALLEL + CACHE_SLOTS + 2]]
        for prompt in prompts:
            complete(side, prompt, 4)
        before = side.cache()
        assert before["host_cells"] == 0 and before["misses"] == len(prompts)
        complete(side, prompts[-1] + tokens(side, " More."), 4)  # the most recent is there
        middle = side.cache()
        assert reused(before, middle) >= len(prompts[-1])
        complete(side, prompts[0] + tokens(side, " More."), 4)  # the least recent is gone
        assert reused(middle, side.cache()) == 0


def test_usage_reports_the_prompt_tokens_the_cache_served(pair):
    """Chat completions' usage.prompt_tokens_details.cached_tokens is the engine's count for that request.

    Last in the module: the entries it leaves made the eviction test above keep an entry it expects gone.
    """
    on, off = pair
    body = {"messages": [{"role": "user", "content": doc("usage", 10)}], "max_tokens": 4}
    before = on.cache()
    cached = on.post("/v1/chat/completions", body)["usage"]["prompt_tokens_details"]["cached_tokens"]
    assert cached == reused(before, on.cache()) < 8  # a new prompt: at most the chat template's opening tokens
    before = on.cache()
    usage = on.post("/v1/chat/completions", body)["usage"]
    assert usage["prompt_tokens_details"]["cached_tokens"] == reused(before, on.cache()) == usage["prompt_tokens"]
    streamed = on.post(
        "/v1/chat/completions", {**body, "stream": True, "stream_options": {"include_usage": True}}, stream=True
    )
    assert streamed[-1]["usage"] == usage
    off.post("/v1/chat/completions", body)
    assert off.post("/v1/chat/completions", body)["usage"]["prompt_tokens_details"]["cached_tokens"] == 0
