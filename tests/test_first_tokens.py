"""First tokens of a step's streamed prompts go out before the step ends, shortest prompt first (real model)."""

from __future__ import annotations

from cllm.core.protocol import SamplingParams, SeqOutput, Submit
from engine_proc.run.prefill_runs import FIRST_TOKEN_GROUP

TOPICS = {
    1: "Lighthouses",
    2: "Dragons",
    3: "Apples",
    4: "Rivers",
    11: "Castles",
    12: "Bees",
    13: "Comets",
    14: "Trains",
    15: "Owls",
    16: "Glaciers",
}


def prompt(tok, rid: int, n: int) -> list[int]:
    """A prompt of exactly n tokens that shares no first token with the others."""
    return tok.encode(f"{TOPICS[rid]}: write a long story about them. " * 40)[:n]


def finish_all(engine) -> list[SeqOutput]:
    outs: list[SeqOutput] = []
    for _ in range(200):
        if not engine.has_work():
            return outs
        outs += [o for result in engine.step() for o in result.outputs]
    raise AssertionError("the engine did not finish")


def test_shortest_streamed_prompts_are_sent_first(engine, tok):
    params = SamplingParams(max_tokens=4, temperature=0.0)
    engine.add(Submit(1, prompt(tok, 1, 20), params))
    list(engine.step())  # 1 decodes from now on
    sizes = {2: 90, 3: 30, 4: 25}  # 4 and 3 make the first call, 2 the second
    assert sizes[4] < FIRST_TOKEN_GROUP <= sizes[4] + sizes[3] and sizes[2] >= FIRST_TOKEN_GROUP
    for rid, n in sizes.items():
        engine.add(Submit(rid, prompt(tok, rid, n), params))
    *seen, returned = engine.step()
    # Yielded before the step ends, in two results; the decoding request's token with the step's own.
    assert [sorted(o.id for o in r.outputs) for r in seen] == [[3, 4], [2]] and not any(r.last for r in seen)
    assert returned.last and [o.id for o in returned.outputs] == [1]
    assert all(r.wake for r in seen)
    assert all(o.token is not None and o.cached_tokens == 0 for r in seen for o in r.outputs)
    rest = finish_all(engine)
    every = [*seen[0].outputs, *seen[1].outputs, *returned.outputs, *rest]
    for rid in (2, 3, 4):
        mine = [o for o in every if o.id == rid]
        assert len(mine) == 4 and mine[-1].finish == "length"


def test_prompts_read_whole_are_not_split(engine, tok):
    params = SamplingParams(max_tokens=2, temperature=0.0)
    for rid in (11, 12, 13):
        engine.add(Submit(rid, prompt(tok, rid, 30), params, per_step=False))
    [result] = engine.step()
    assert sorted(o.id for o in result.outputs) == [11, 12, 13] and result.last
    finish_all(engine)
