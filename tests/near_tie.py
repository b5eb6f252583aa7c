"""What the embedded model writes greedily, checked for near ties before a test rests on it.

A test that expects a 135M model's greedy choice (a word in the answer, where the answer ends, which tool it calls)
rests on every token on the way: where the two likeliest are nearly tied, another machine's kernels, thread count
or a batch's shape can flip the pick, and the test fails though the server did nothing wrong. greedy() asks the
same request with top-2 logprobs and fails first, naming the tie, where one of the tokens the test rests on is not
ahead by MARGIN: such a failure reads as a prompt to change, not as a bug.
"""

from __future__ import annotations

from dataclasses import dataclass

import httpx

# nats between the two likeliest tokens. Kernels and batch shapes were seen to move a pair's gap by ~0.15
# (0.245 -> 0.095 for the first token of the capital of France, the same server before and after other traffic).
MARGIN = 0.5
# Where two runs of one request computed a token's row in other batch shapes (a draft's rows against a plain step's,
# a prompt's last token alone after its cached cells against in a fresh prefill), the logits were measured up to ~0.1
# nats apart (an AMD EPYC, f32 keys, flash attention off), so their greedy texts may part only where the two best
# tokens are under about twice that apart: this leaves room.
NEAR_TIE = 0.25

# A question after one answered in a word: SmolLM2's greedy reply is "Paris." and its end, each ahead of the next
# likeliest by 4.0, 2.9 and 8.0 nats (the shared server), where a question alone starts on a tie (L -1.92, The -2.01).
CAPITAL = [
    {"role": "user", "content": "What is the capital of Germany?"},
    {"role": "assistant", "content": "Berlin."},
    {"role": "user", "content": "What is the capital of France?"},
]


@dataclass
class Greedy:
    text: str  # the greedy reply up to where it ends (or to `until`, or to max_tokens)
    ended: bool  # it ends at an end-of-generation token within max_tokens (finish reason "stop")
    tokens: list[str]


def greedy(
    http: httpx.Client,
    body: dict,
    path: str = "/v1/chat/completions",
    until: str | None = None,
    margin: float = MARGIN,
) -> Greedy:
    """``body`` (a chat or completions request) asked greedily with top-2 logprobs; where it ends, asked again to one
    token past its end with end-of-generation ignored, so the row where the reply ends shows its runner-up too. Each
    token up to that end (or up to and including the one that completes ``until``) must lead the next likeliest by
    ``margin``, else AssertionError names the tie.

    The logprobs are the model's, before any grammar: a request with a grammar has no check here.
    """
    chat = path == "/v1/chat/completions"

    def rows_of(extra: dict) -> tuple[list[Row], str]:
        asked = {**body, "temperature": 0, "stream": False, **extra}
        asked.update({"logprobs": True, "top_logprobs": 2} if chat else {"logprobs": 2})
        r = http.post(path, json=asked)
        assert r.status_code == 200, r.text
        choice = r.json()["choices"][0]
        logprobs = choice["logprobs"]
        if chat:
            rows = [
                (t["token"], t["logprob"], [(b["token"], b["logprob"]) for b in t["top_logprobs"]])
                for t in logprobs["content"]
            ]
        else:
            rows = [
                (t, lp, sorted(top.items(), key=lambda kv: -kv[1]))
                for t, lp, top in zip(logprobs["tokens"], logprobs["token_logprobs"], logprobs["top_logprobs"])
            ]
        return rows, choice["finish_reason"]

    rows, finish = rows_of({})
    reached = until is not None and until in "".join(row[0] for row in rows)
    # Asked again one token past its end, which shows the end's row and its runner-up (not needed where the reply
    # reached ``until`` before its end: a request with tools may not ignore end-of-generation).
    if finish == "stop" and not reached:
        rows, _ = rows_of({"ignore_eos": True, "max_tokens": len(rows) + 1})
    return clear(rows, until, margin)


# A token of a greedy reply: its text, its logprob, the two likeliest (text, logprob) on its row, likeliest first.
Row = tuple[str, float, list[tuple[str, float]]]


def clear(rows: list[Row], until: str | None = None, margin: float = MARGIN) -> Greedy:
    """The reply of ``rows`` (a greedy run's, end-of-generation ignored) up to where it ends, or to ``until``; each of
    those tokens must lead the next likeliest by ``margin``, else AssertionError names the tie."""
    text, tokens = "", list[str]()
    for i, (token, logprob, best) in enumerate(rows):
        (first, lp1), (second, lp2) = best[:2]
        assert lp1 - lp2 >= margin, (
            f"near tie at token {i} of the greedy reply {text!r}: {first!r} {lp1:.4f} against {second!r} {lp2:.4f}, "
            f"{lp1 - lp2:.4f} nats apart (under {margin}): what the test expects rests on which of the two wins, "
            "which kernels, thread counts and batch shapes can flip; choose a prompt without one"
        )
        if logprob < lp1:  # the likeliest was refused: an end-of-generation token, where the reply ends
            return Greedy(text, True, tokens)
        text, tokens = text + token, [*tokens, token]
        if until is not None and until in text:
            break
    return Greedy(text, False, tokens)
