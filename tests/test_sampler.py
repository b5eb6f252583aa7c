"""The engine's sampler in-process on the real model: grammars, and grammars it must give up on."""

from __future__ import annotations

import itertools
from typing import Any

import msgspec

from cllm.core.config import DeviceSampling, ServeConfig
from cllm.core.protocol import SamplingParams, Submit
from tests.near_tie import Row, clear


def run(engine, submits) -> dict[int, tuple[list[int], str | None]]:
    """Step until every submitted sequence ends: id -> (tokens, finish)."""
    results: dict[int, tuple[list[int], str | None]] = {s.id: ([], None) for s in submits}
    for s in submits:
        out = engine.add(s)
        if out is not None:
            results[s.id] = ([], out.finish)
    for _ in range(500):
        if not engine.has_work():
            break
        for out in (o for result in engine.step() for o in result.outputs):
            if out.token is not None:
                results[out.id][0].append(out.token)
            if out.finish:
                results[out.id] = (results[out.id][0], out.finish)
    return results


def test_grammar_holds_at_high_temperature(engine, tok):
    # Hot sampling with no top-k picks tokens the grammar refuses almost every
    # step, so this runs the whole-vocabulary path as well as the quick check.
    prompt = tok.encode("Answer yes or no: is the sky green?")
    params = SamplingParams(max_tokens=20, temperature=1.5, top_k=0, top_p=1.0, grammar='root ::= ("yes" | "no") "."')
    results = run(engine, [Submit(i, prompt, msgspec.structs.replace(params, seed=i)) for i in range(1, 5)])
    for tokens, finish in results.values():
        assert finish == "stop"
        assert b"".join(map(tok.piece, tokens)).decode() in ("yes.", "no.")


def test_refused_grammar_ends_only_that_request(engine, tok):
    prompt = tok.encode("Hello")
    bad = Submit(10, prompt, SamplingParams(grammar="root ::= undefined-rule"))
    good = Submit(11, prompt, SamplingParams(max_tokens=5, temperature=0, ignore_eos=True))
    results = run(engine, [bad, good])
    assert results[10] == ([], "error")
    assert len(results[11][0]) == 5 and results[11][1] == "length"


def test_grammar_dead_end_ends_only_that_request(engine, tok):
    # After "yes" the grammar wants a character that does not exist: no token (not even EOS) may follow.
    prompt = tok.encode("Say yes")
    stuck = Submit(
        20, prompt, SamplingParams(max_tokens=10, temperature=0, grammar=r'root ::= "yes" [^\x00-\U0010FFFF]')
    )
    good = Submit(21, prompt, SamplingParams(max_tokens=5, temperature=0, ignore_eos=True))
    results = run(engine, [stuck, good])
    tokens, finish = results[20]
    assert finish == "error" and b"".join(map(tok.piece, tokens)).decode() == "yes"
    assert len(results[21][0]) == 5 and results[21][1] == "length"


def test_grammar_with_ignore_eos_is_refused(engine, tok):
    results = run(engine, [Submit(30, tok.encode("Hi"), SamplingParams(grammar='root ::= "a"', ignore_eos=True))])
    assert results[30] == ([], "error")


def test_nan_probabilities_never_feed_the_grammar_a_refused_token(engine, tok):
    # A repetition penalty of 0 in float32 divides logits by zero: every probability is NaN and the
    # draw lands anywhere. Accepting a refused token makes llama.cpp throw, aborting the engine process.
    prompt = tok.encode("Answer yes or no: is the sky green? yes no yes")
    params = SamplingParams(
        max_tokens=5,
        temperature=1.0,
        top_k=0,
        top_p=1.0,
        repetition_penalty=1e-323,
        grammar='root ::= ("yes" | "no") "."',
    )
    good = Submit(41, prompt, SamplingParams(max_tokens=5, temperature=0, ignore_eos=True))
    results = run(engine, [Submit(40, prompt, params), good])
    tokens, finish = results[40]
    text = b"".join(map(tok.piece, tokens)).decode()
    assert finish == "error" or (finish == "stop" and text in ("yes.", "no.")), (text, finish)
    assert len(results[41][0]) == 5 and results[41][1] == "length"


def greedy_rows(engine, tok, submit: Submit) -> list[Row]:
    """A greedy run's tokens with their top-2 logprobs (the Submit asks for them), as tests/near_tie reads them."""
    piece = lambda t: tok.piece(t).decode(errors="replace")  # noqa: E731
    assert engine.add(submit) is None
    outs = []
    while engine.has_work():
        outs += [o for result in engine.step() for o in result.outputs if o.id == submit.id and o.token is not None]
    return [
        (
            piece(o.token),
            o.logprobs.logprob,
            [(piece(i), lp) for i, lp in zip(o.logprobs.top_ids, o.logprobs.top_logprobs)],
        )
        for o in outs
    ]


def test_lazy_grammar_applies_from_its_trigger_on(engine, tok):
    """Free text until a trigger matches; from the trigger on, the grammar."""
    # Its greedy reply's six tokens "The sky is indeed blue." are each clear of a tie (the seventh is not: " This"
    # 0.16 nats ahead of " In"), so the reply the untriggered grammar must leave alone is compared over those six;
    # asked only the colour of the sky, it wrote "The sky is a beautiful shade of blue", " a" 0.30 nats ahead of
    # " often", " shade" 0.24 of " and".
    prompt = tok.encode(
        "<|im_start|>user\nThe sky is blue. What color is the sky?<|im_end|>\n<|im_start|>assistant\n",
        add_special=False,
    )
    plain = SamplingParams(max_tokens=6, temperature=0)
    clear(greedy_rows(engine, tok, Submit(39, prompt, msgspec.structs.replace(plain, logprobs=2))))
    longer = msgspec.structs.replace(plain, max_tokens=12)
    fires = msgspec.structs.replace(longer, grammar='root ::= " blue" " and green."', grammar_triggers=["( blue)"])
    # The greedy token " blue" runs past this trigger: llama.cpp would replay "ue" into the grammar
    # and abort the process on it, so the engine refuses that token and the model writes something else.
    past = msgspec.structs.replace(longer, grammar='root ::= "bl" "ack."', grammar_triggers=["(bl)"])
    never = msgspec.structs.replace(plain, grammar='root ::= "x"', grammar_triggers=["(never)"])
    submits = [
        Submit(40, prompt, plain),
        Submit(41, prompt, fires),
        Submit(42, prompt, past),
        Submit(43, prompt, never),
    ]
    results = run(engine, submits)
    text = {i: b"".join(map(tok.piece, results[i][0])).decode() for i in results}
    head, blue, _ = text[40].partition(" blue")
    assert blue and text[41] == head + " blue and green." and results[41][1] == "stop"
    assert "blue" not in text[42] and text[42].startswith(head)
    assert results[43] == results[40]


def test_a_request_read_whole_wakes_the_frontend_only_to_begin_and_end(engine, tok):
    # A request read whole (no stream, no stop strings) needs its first token (TTFT)
    # and its last; the steps between leave their outputs in the ring unannounced.
    # A stream's are announced at every step, alone whatever the stream interval;
    # with coalesce_streams streams and an interval longer than the requests, only
    # as a whole request's. Each case's prompts are new to the prefix cache: a prompt asked
    # again gets its first token from kept logits, in a result of its own before the step's prefill.
    texts = ("Count from one to twenty:", "List the planets:", "Name a color:", "Hi")
    params = SamplingParams(max_tokens=6, temperature=0, ignore_eos=True)
    ends = [True, False, False, False, False, True]
    rid = itertools.count(30)
    coalesce = engine.waker.coalesce_streams
    try:
        engine.waker.coalesce_streams = 4
        for case, (per_step, streams, interval, expected) in enumerate(
            (
                (False, 1, 0.0, ends),
                (True, 1, 0.0, [True] * 6),
                (True, 1, 60.0, [True] * 6),
                (True, 4, 0.0, [True] * 6),
                (True, 4, 60.0, ends),
            )
        ):
            engine.waker.stream_interval = interval
            for text in texts[:streams]:
                engine.add(Submit(next(rid), tok.encode(f"({case}) {text}"), params, per_step=per_step))
            urgent = []
            while engine.has_work():
                for result in engine.step():
                    if result.outputs:
                        urgent.append(result.wake)
            assert urgent == expected, (per_step, streams, interval)
    finally:
        engine.waker.stream_interval = ServeConfig().stream_interval_ms / 1000
        engine.waker.coalesce_streams = coalesce


def _device_or_host(tok, device: DeviceSampling) -> dict:
    """Greedy, logprobs and seeded outputs of an engine that samples on the device or on the host."""
    from cllm.core.model_file import resolve_model
    from engine_proc.engine import LLMEngine

    engine = LLMEngine(resolve_model(None), ServeConfig(parallel=4, ctx_size=2048, device_sampling=device))
    try:
        prompts = [tok.encode(t) for t in ("Write a story about a dragon.", "List the planets:", "Hello, my name is")]
        greedy = SamplingParams(max_tokens=12, temperature=0, ignore_eos=True)
        seeded = SamplingParams(max_tokens=12, temperature=0.8, top_p=0.9, ignore_eos=True)
        out: dict[str, Any] = {"greedy": run(engine, [Submit(i, p, greedy) for i, p in enumerate(prompts)])}
        out["logprobs"] = run(
            engine, [Submit(10 + i, p, msgspec.structs.replace(greedy, logprobs=1)) for i, p in enumerate(prompts)]
        )
        for name, first in (("seeded", 20), ("again", 30)):
            submits = [Submit(first + i, p, msgspec.structs.replace(seeded, seed=i)) for i, p in enumerate(prompts)]
            out[name] = run(engine, submits)
        engine.add(Submit(40, prompts[0], seeded))
        list(engine.step())
        out["on_device"] = len(engine.sampler._attached)  # chains attached while it decodes
        while engine.has_work():
            list(engine.step())
        out["left"] = len(engine.sampler._attached)  # none once it has ended
        return out
    finally:
        engine.close()


def test_device_sampling_gives_the_hosts_greedy_text_and_repeats_a_seed(tok):
    host, device = _device_or_host(tok, "off"), _device_or_host(tok, "on")
    assert (device["on_device"], device["left"]) == (1, 0) and host["on_device"] == 0
    renumber = lambda results, first: {i - first: r for i, r in results.items()}  # noqa: E731
    assert device["greedy"] == host["greedy"]
    assert renumber(device["logprobs"], 10) == host["greedy"]  # logprobs: sampled on the host, the same tokens
    assert renumber(device["again"], 30) == renumber(device["seeded"], 20)
    assert all(len(tokens) == 12 and finish == "length" for tokens, finish in device["again"].values())


def test_the_common_chain_is_drawn_over_the_matrix_and_a_seed_repeats(engine, tok):
    prompts = [tok.encode(t) for t in ("Write a story about a dragon.", "List the planets:", "Hello, my name is")]
    seeded = SamplingParams(max_tokens=12, temperature=0.8, top_k=40, top_p=0.9, ignore_eos=True)
    probe = engine.sampler.new(seeded, prompts[0])
    assert probe.draw is not None and probe.chain is None  # no llama.cpp chain
    engine.sampler.free(probe)
    together = run(engine, [Submit(i, p, msgspec.structs.replace(seeded, seed=i)) for i, p in enumerate(prompts)])
    again = run(engine, [Submit(i, p, msgspec.structs.replace(seeded, seed=i)) for i, p in enumerate(prompts)])
    assert together == again
    assert all(len(tokens) == 12 and finish == "length" for tokens, finish in together.values())
    other = run(engine, [Submit(9, prompts[0], msgspec.structs.replace(seeded, seed=99))])
    assert other[9][0] != together[0][0]
    # Top-k 1 leaves the draw one token: the greedy text.
    greedy = run(
        engine,
        [Submit(i, p, SamplingParams(max_tokens=12, temperature=0, ignore_eos=True)) for i, p in enumerate(prompts)],
    )
    top1 = run(engine, [Submit(i, p, msgspec.structs.replace(seeded, top_k=1, seed=i)) for i, p in enumerate(prompts)])
    assert top1 == greedy
