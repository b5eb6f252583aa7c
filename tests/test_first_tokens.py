"""First tokens of a step's streamed prompts go out before the step ends, shortest prompt first (real model)."""

from __future__ import annotations

from cllm.core.protocol import SamplingParams, SeqOutput, Submit
from engine_proc.engine import FIRST_TOKEN_GROUP

TOPICS = {1: "Lighthouses", 2: "Dragons", 3: "Apples", 4: "Rivers", 11: "Castles", 12: "Bees", 13: "Comets",
          14: "Trains", 15: "Owls", 16: "Glaciers"}


def prompt(tok, rid: int, n: int) -> list[int]:
    """A prompt of exactly n tokens that shares no first token with the others."""
    return tok.encode(f"{TOPICS[rid]}: write a long story about them. " * 40)[:n]


def finish_all(engine, emitted: list[SeqOutput]) -> list[SeqOutput]:
    outs = []
    for _ in range(200):
        if not engine.has_work():
            return outs
        outs += engine.step()
        outs += emitted
        emitted.clear()
    raise AssertionError("the engine did not finish")


def test_shortest_streamed_prompts_are_sent_first(engine, tok):
    emitted: list[SeqOutput] = []
    seen: list[list[SeqOutput]] = []  # what each emit call sent, in order
    engine.emit = lambda outs: (seen.append(list(outs)), emitted.extend(outs))
    try:
        params = SamplingParams(max_tokens=4, temperature=0.0)
        engine.add(Submit(1, prompt(tok, 1, 20), params))
        engine.step()  # 1 decodes from now on
        sizes = {2: 90, 3: 30, 4: 25}  # 4 and 3 make the first call, 2 the second
        assert sizes[4] < FIRST_TOKEN_GROUP <= sizes[4] + sizes[3] and sizes[2] >= FIRST_TOKEN_GROUP
        for rid, n in sizes.items():
            engine.add(Submit(rid, prompt(tok, rid, n), params))
        emitted.clear()
        seen.clear()
        returned = engine.step()
        # Sent before the step ends, in two calls; the decoding request's token with the step.
        assert [sorted(o.id for o in outs) for outs in seen] == [[3, 4], [2]]
        assert [o.id for o in returned] == [1]
        assert all(o.token is not None and o.cached_tokens == 0 for outs in seen for o in outs)
        emitted.clear()
        rest = finish_all(engine, emitted)
        every = [*seen[0], *seen[1], *returned, *rest]
        for rid in (2, 3, 4):
            mine = [o for o in every if o.id == rid]
            assert len(mine) == 4 and mine[-1].finish == "length"
    finally:
        engine.emit = None


def test_prompts_read_whole_and_without_an_emit_are_not_split(engine, tok):
    params = SamplingParams(max_tokens=2, temperature=0.0)
    emitted: list[SeqOutput] = []
    engine.emit = emitted.extend
    try:
        for rid in (11, 12, 13):
            engine.add(Submit(rid, prompt(tok, rid, 30), params, per_step=False))
        assert sorted(o.id for o in engine.step()) == [11, 12, 13] and not emitted
        finish_all(engine, emitted)
    finally:
        engine.emit = None
    for rid in (14, 15, 16):
        engine.add(Submit(rid, prompt(tok, rid, 30), params))
    assert sorted(o.id for o in engine.step()) == [14, 15, 16]
    finish_all(engine, [])
