"""The prefix cache's exact mode: the same results with it as without it, and it is really used.

Two servers alike but for --no-prefix-cache answer the same requests; the
one with the cache runs it in exact mode (--prefix-cache-exact), where only
whole prompt blocks are reused, and no cache slots beyond --parallel. A
request whose decode runs alone must give the same greedy text on both.
Requests decoded together may not: with flash attention a decode step's
logits depend on what else is in the step, cache or no cache. What the cache
guarantees there is the prompt's KV cells, checked by the first token's
logprobs, which come from the prompt alone; with --flash-attn off, whole
greedy texts. Both servers decode on one thread, held (--fixed-threads):
under flash attention a decode over 512 or more KV cells splits them between
the threads, so the count changes the logits' last bits, and a server that
went down to fewer threads beside a busy program could part from the other
for that alone, cache or no cache. One thread also meets no barrier: beside a
busy program two held threads kept ~0.23 of their speed (engine_proc/run/threads.py)
and this module took many times as long. The two servers answer each request
at the same time, each on a CPU of its own. A step holds STEP tokens (--batch-size),
not the default 512, so that a prompt prefilled over two steps is half as long.
"""

from __future__ import annotations

import json
import threading
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

import httpx
import pytest

from tests.conftest import start_server
from tests.test_metrics import scrape, value, wait_idle

BLOCK = 128  # the scheduler's prefill block: only whole blocks are reused
SLOTS = 4
STEP = 256  # a step's token budget: two whole blocks
EXACT = ("--prefix-cache-exact", "--cache-slots", "0")
SAME_THREADS = ("--threads", "1", "--fixed-threads")  # like with like: the cache is the only difference between the two
ARGS = ("--parallel", str(SLOTS), "--ctx-size", str(SLOTS * 1024), "--batch-size", str(STEP), *SAME_THREADS)


def doc(topic: str, facts: int = 24) -> str:
    """About 12 tokens a fact, its own from its first token."""
    return f"Notes on {topic}. " + " ".join(f"Fact {i}: the {topic} of item {i} is {i * 7 % 13}." for i in range(facts))


@dataclass
class Side:
    """One server of the pair, and the tokens its engine has made for this module.

    Every request here decodes exactly max_tokens (ignore_eos), so the cache
    figures are read once the engine has reported them all: it sends its
    figures when it goes idle, just after the last reply.
    """

    http: httpx.Client
    tokens: int = 0
    lock: threading.Lock = field(default_factory=threading.Lock)

    def post(self, path: str, body: dict, stream: bool = False) -> Any:  # the JSON: a dict, or a stream's events
        """The JSON response; stream: the events of an SSE stream instead."""
        r = self.http.post(path, json={**body, "temperature": 0, "ignore_eos": True})
        assert r.status_code == 200, r.text
        with self.lock:
            self.tokens += body["max_tokens"]
        if stream:
            return [json.loads(line[6:]) for line in r.text.splitlines() if line.startswith("data: {")]
        return r.json()

    def generate(self, prompt: str, max_tokens: int = 12) -> str:
        return self.post("/generate", {"prompt": prompt, "max_tokens": max_tokens})["data"]["text"]

    def first_token(self, prompt: str) -> dict:
        """The first token's logprobs, its five likeliest alternatives included."""
        lp = self.post("/v1/completions", {"prompt": prompt, "max_tokens": 1, "logprobs": 5})["choices"][0]["logprobs"]
        return {"token_logprobs": lp["token_logprobs"], "top_logprobs": lp["top_logprobs"]}

    def n_tokens(self, text: str) -> int:
        return self.http.post("/encode", json={"text": text}).json()["data"]["length"]

    def cache(self) -> dict:
        return wait_idle(self.http, self.tokens)["prefix_cache"]


@pytest.fixture(scope="module")
def pair():
    """(cache on, cache off): SLOTS sequences of 1024 cells each."""
    with (
        start_server(*ARGS, *EXACT) as on,
        start_server(*ARGS, "--no-prefix-cache") as off,
        on.client() as a,
        off.client() as b,
    ):
        yield Side(a), Side(b)


def both(pair, call) -> list:
    """call(side) for both sides at once: [its result on the cache's side, on the other]."""
    with ThreadPoolExecutor(2) as pool:
        return list(pool.map(call, pair))


def same(pair, prompt: str, max_tokens: int = 12) -> str:
    text, text_off = both(pair, lambda side: side.generate(prompt, max_tokens))
    assert text == text_off
    return text


def at_once(call, prompts: list[str]) -> list:
    """call(prompt) for every prompt at once, on one server: they share its steps."""
    with ThreadPoolExecutor(len(prompts)) as pool:
        return list(pool.map(call, prompts))


def reused(before: dict, after: dict) -> int:
    return after["hit_tokens"] - before["hit_tokens"]


def test_shared_prefix_reuses_whole_blocks(pair):
    on, _ = pair
    notes = doc("colour", 18)  # ~290 tokens: two whole blocks
    first, second = notes + "\nQuestion: what is item 5?\nAnswer:", notes + "\nQuestion: and item 11?\nAnswer:"
    same(pair, first)
    before = on.cache()
    same(pair, second)
    after = on.cache()
    shared = on.n_tokens(notes)  # at least: the questions share a few more tokens
    assert after["hits"] == before["hits"] + 1
    assert shared // BLOCK * BLOCK <= reused(before, after) < on.n_tokens(second)
    assert reused(before, after) % BLOCK == 0


def test_partial_match_and_a_prefix_of_a_cached_prompt(pair):
    on, _ = pair
    notes = doc("weight", 30)  # a third of it still holds a whole block
    same(pair, notes + " That is all.")
    before = on.cache()
    same(pair, notes[: len(notes) // 2] + " and then something else entirely.")  # shares half of it
    middle = on.cache()
    same(pair, notes[: len(notes) // 3])  # a prefix of the cached prompt
    after = on.cache()
    assert reused(before, middle) >= BLOCK and reused(middle, after) >= BLOCK
    # The longer entry survived the shorter prompts: it is reused whole again.
    same(pair, notes + " That is all, again.")
    assert reused(after, on.cache()) >= on.n_tokens(notes) // BLOCK * BLOCK


def test_multi_turn_chat_reuses_the_conversation_so_far(pair):
    on, _ = pair
    system = "You answer briefly. " + doc("price", 20)  # ~320 tokens: two whole blocks
    messages = [{"role": "system", "content": system}]
    for question in ("What is the price of item 3?", "And of item 4?", "And of item 9?"):
        messages.append({"role": "user", "content": question})
        before = on.cache()
        replies = both(pair, lambda side: side.post("/v1/chat/completions", {"messages": messages, "max_tokens": 16}))
        answer, answer_off = (r["choices"][0]["message"]["content"] for r in replies)
        assert answer == answer_off
        messages.append({"role": "assistant", "content": answer})
    # The last turn reused the previous turn's prompt: the system prompt's whole blocks at least.
    assert on.n_tokens(system) // BLOCK * BLOCK <= reused(before, on.cache()) < replies[0]["usage"]["prompt_tokens"]


def test_concurrent_requests_sharing_a_prefix_being_prefilled(pair):
    on, _ = pair
    # ~290 tokens: the first request prefills for two steps, and the one
    # step's budget (STEP tokens) it takes first lets no other in; the others
    # copy its 2 whole blocks while it is still prefilling, or once it is done.
    notes = doc("height", 18)
    prompts = [notes + f"\nItem {i} doubled is" for i in range(4)]
    before = on.cache()
    got_on, got_off = both(pair, lambda side: at_once(side.first_token, prompts))
    assert got_on == got_off
    after = on.cache()
    assert after["misses"] == before["misses"] + 1 and after["hits"] == before["hits"] + len(prompts) - 1
    assert reused(before, after) >= (len(prompts) - 1) * 2 * BLOCK


def test_without_flash_attention_concurrent_texts_are_identical_too():
    """Decode steps then do not depend on what else is in them: batching and the cache change no text."""
    with (
        start_server(*ARGS, "--flash-attn", "off", *EXACT) as a,
        start_server(*ARGS, "--flash-attn", "off", "--no-prefix-cache") as b,
        a.client() as x,
        b.client() as y,
    ):
        on, off = Side(x), Side(y)
        notes = doc("width", 18)  # ~290 tokens: the first prefills for two steps
        prompts = [notes + f"\nItem {i} tripled is" for i in range(4)]
        got_on, got_off = both((on, off), lambda side: at_once(lambda p: side.generate(p, 16), prompts))
        assert on.cache()["hits"] == len(prompts) - 1
        # Alone, on the cache's side: its cells are a fresh prefill's, and the other side would prefill the notes again.
        alone = [on.generate(p, 16) for p in prompts[:2]]
    assert got_on == got_off
    assert got_off[:2] == alone


def test_eviction_under_memory_pressure(pair):
    on, _ = pair
    topics = [f"subject {i}" for i in range(SLOTS + 2)]
    for topic in topics:  # each leaves an entry (one whole block and more); the oldest leave the streams
        on.generate(doc(topic, 10), 4)  # a miss, as on a server without the cache: the texts compared come next
    before = on.cache()
    assert 0 < before["cells"] <= SLOTS * 1024 and before["host_cells"] > 0
    same(pair, doc(topics[-1], 10) + " More.", 4)  # the most recent is still in its stream
    middle = on.cache()
    assert middle["hits"] == before["hits"] + 1 and middle["restored"] == before["restored"]
    for topic in topics[:-1]:  # the others, in a stream or in host RAM: back bit for bit
        same(pair, doc(topic, 10) + " More.", 4)
    after = on.cache()
    assert after["hits"] == middle["hits"] + len(topics) - 1 and after["restored"] > middle["restored"]
    # As many new requests as slots: every entry is displaced or dropped.
    prompts = [doc(f"other {i}", 10) for i in range(SLOTS)]
    got_on, got_off = both(pair, lambda side: at_once(side.first_token, prompts))
    assert got_on == got_off


def test_health_and_metrics_report_the_cache(pair):
    on, off = pair
    on.generate(doc("depth", 12) + " One.")
    before, scraped = on.cache(), scrape(on.http)
    on.generate(doc("depth", 12) + " Two.")
    after = on.cache()
    assert set(after) == {
        "enabled",
        "hits",
        "misses",
        "hit_tokens",
        "cells",
        "restored",
        "host_cells",
        "host_bytes",
        "disk_hits",
        "disk_entries",
        "disk_bytes",
        "disk_load_seconds",
        "disk_rejected",
    }
    assert after["enabled"] is True and after["hits"] == before["hits"] + 1 and after["cells"] > 0
    assert off.cache()["enabled"] is False
    assert off.cache()["hits"] == off.cache()["misses"] == 0
    samples = scrape(on.http)
    assert (
        value(samples, "cllm_prefix_cache_lookups_total", result="hit")
        - value(scraped, "cllm_prefix_cache_lookups_total", result="hit")
        == 1
    )
    assert value(samples, "cllm_prefix_cache_hit_tokens_total") - value(
        scraped, "cllm_prefix_cache_hit_tokens_total"
    ) == reused(before, after)
    assert value(samples, "cllm_prefix_cache_cells") == after["cells"]


def test_a_scored_prompt_reuses_nothing_and_leaves_nothing(pair):
    """Echo with logprobs needs every prompt token's logits, and its 64-token chunks are not the fixed
    blocks: it takes no cells from the cache, and a later prompt reuses none of its own."""
    on, _ = pair
    notes = doc("length", 15)  # ~230 tokens: a whole block
    on.generate(notes + " First.")  # cached: a plain prompt would reuse its blocks
    before = on.cache()
    body = {"prompt": notes + " Second.", "max_tokens": 0, "echo": True, "logprobs": 1}
    scored = both(pair, lambda side: side.post("/v1/completions", body)["choices"][0]["logprobs"]["token_logprobs"])
    assert scored[0] == scored[1] and len(scored[0]) == on.n_tokens(notes + " Second.")
    middle = on.cache()
    assert reused(before, middle) == 0
    text = notes + " Second. Third."  # whatever it reuses, the same cells as a fresh prefill
    first, first_off = both(pair, lambda side: side.first_token(text))
    assert first == first_off
    assert reused(middle, on.cache()) >= BLOCK
