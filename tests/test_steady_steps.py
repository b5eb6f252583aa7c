"""`--steady-steps on`: finished sequences stay parked in the decode batch and new ones start in waves.

On the CPU the setting is off by default (auto: on with GPU layers); turned on, the server must give every request
the tokens it asked for, the same greedy text as without it, and llama.cpp must reuse its graph in no fewer decode
steps.
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import pytest

from cllm.core.config import DeviceSampling, SteadySteps
from tests.conftest import start_server, wait_idle
from tests.test_metrics import scrape, value

# A wave needs 8 or more decoding sequences (Scheduler.wave): 12 requests of different lengths.
LENGTHS = [6, 9, 12, 15, 18, 21, 24, 27, 30, 33, 36, 39]
COMMON = ("--parallel", "12", "--ctx-size", "6144")


def run_all(http) -> tuple[list[tuple[int, str]], float, float]:
    """Every request at once: each one's (tokens predicted, text), the share of decode steps that reused a graph,
    and the rows the steps held."""
    wait_idle(http)
    before = scrape(http)

    def one(i: int) -> tuple[int, str]:
        body = {
            "prompt": f"Story {i}: once upon a time",
            "n_predict": LENGTHS[i],
            "ignore_eos": True,
            "temperature": 0,
            "cache_prompt": False,
        }
        r = http.post("/completion", json=body)
        assert r.status_code == 200, r.text
        return r.json()["tokens_predicted"], r.json()["content"]

    with ThreadPoolExecutor(len(LENGTHS)) as pool:
        out = list(pool.map(one, range(len(LENGTHS))))
    wait_idle(http)
    after = scrape(http)
    steps = value(after, "cllm_decode_steps_total") - value(before, "cllm_decode_steps_total")
    reused = value(after, "cllm_decode_steps_graph_reused_total") - value(
        before, "cllm_decode_steps_graph_reused_total"
    )
    rows = value(after, "cllm_batch_size_sum") - value(before, "cllm_batch_size_sum")
    return out, reused / steps, rows


@pytest.fixture(scope="module")
def results():
    with start_server(*COMMON, "--steady-steps", "on") as steady, start_server(*COMMON) as plain:
        with steady.client() as a, plain.client() as b:
            yield run_all(a), run_all(b)


def test_every_request_gets_its_tokens_and_the_same_greedy_text(results):
    (steady, _, _), (plain, _, _) = results
    assert [n for n, _ in steady] == LENGTHS
    assert steady == plain


def test_no_fewer_decode_steps_reuse_their_graph(results):
    # Twelve departures in ~40 steps leave little to gain here; tests/test_bench.py measures the gain itself.
    (_, steady, rows), (_, plain, plain_rows) = results
    assert rows > plain_rows  # finished sequences stayed parked in the batch
    assert steady >= plain, (steady, plain)


def _engine(steady: SteadySteps, device: DeviceSampling = "off"):
    from cllm.core.config import ServeConfig
    from cllm.core.model_file import resolve_model
    from engine_proc.engine import LLMEngine

    config = ServeConfig(parallel=12, ctx_size=6144, steady_steps=steady, device_sampling=device)
    return LLMEngine(resolve_model(None), config)


def _submits(tok, first: int) -> list:
    """Greedy requests of LENGTHS and, between them, seeded sampled ones."""
    from cllm.core.protocol import SamplingParams, Submit

    out = []
    for i, n in enumerate(LENGTHS):
        params = SamplingParams(max_tokens=n, temperature=0.0, ignore_eos=True)
        if i % 3 == 1:
            params = SamplingParams(max_tokens=n, temperature=0.8, top_p=0.9, seed=i, ignore_eos=True)
        out.append(Submit(first + i, tok.encode(f"Story {i}: once upon a time"), params, per_step=False))
    return out


def _drive(engine, submits, abort: frozenset[int] = frozenset(), abort_at: int = 6) -> dict[int, list]:
    """Every request through the engine, all queued at once: id -> its outputs' tokens and finishes; ``abort``:
    ids aborted after ``abort_at`` steps. Requests read whole (not per step), as a non-streamed one is."""
    got: dict[int, list] = {s.id: [] for s in submits}
    for s in submits:
        assert engine.add(s) is None
    steps = 0
    while engine.has_work():
        assert steps < 400, "the engine never finished"
        if steps == abort_at and abort:
            engine.abort(sorted(abort))
            for i in abort:
                got[i].append("aborted")
        for result in engine.step():
            for o in result.outputs:
                got[o.id].append(o.token if o.finish is None else (o.token, o.finish))
                assert o.finish is None or result.wake, o  # the frontend learns at once that a request ended
        # The step that leaves the engine idle wakes the frontend: its final figures go with it (engine_proc.main).
        assert engine.has_work() or result.wake
        steps += 1
    return got


def test_decodes_run_ahead_lose_no_token_abort_or_seed(tok):
    """Steady steps launch their decode a step ahead (LLMEngine._step_ahead): every request still gets its tokens,
    greedy text as without steady steps, a seeded request its text again, and an aborted one nothing after its
    abort, while the others go on."""
    from engine_proc.step.timer import StepTimer

    plain = _engine("off")
    try:
        base = _drive(plain, _submits(tok, 100))
    finally:
        plain.close()
    engine = _engine("on")
    try:
        engine.timer = timer = StepTimer()
        ahead = _drive(engine, _submits(tok, 100))
        again = _drive(engine, _submits(tok, 200))
        aborted = _drive(engine, _submits(tok, 300), abort=frozenset({303, 306}))
        assert not engine.has_work() and engine.scheduler.running == []
    finally:
        engine.close()
    assert timer.cpu["overlapped"] > 0  # tokens were recorded while a decode ran
    for i, n in enumerate(LENGTHS):
        tokens = ahead[100 + i]
        assert len(tokens) == n and tokens[-1][1] == "length", (i, tokens)
        assert tokens == again[200 + i], i  # greedy and seeded alike, run again
        if i % 3 != 1:
            assert tokens == base[100 + i], i  # greedy: the text without steady steps
    for i in range(len(LENGTHS)):
        if 300 + i in (303, 306):
            cut = aborted[300 + i].index("aborted")
            assert cut == len(aborted[300 + i]) - 1 and cut < LENGTHS[i], aborted[300 + i]
        else:
            assert aborted[300 + i] == ahead[100 + i], i


def test_decodes_run_ahead_with_the_chains_on_the_device(tok, monkeypatch):
    """With --device-sampling on the decode runs a step ahead too (StepAhead.next_decode), each sequence's chain
    attached to its slot and sampling inside the decodes launched ahead: the greedy text of the host's synchronous
    step, a seeded request its text again, and no chain attached or detached while a decode uses the context, nor
    a parked sequence's."""
    import llama_cpp as L

    from engine_proc.step.timer import StepTimer

    plain = _engine("off")
    try:
        base = _drive(plain, _submits(tok, 100))
    finally:
        plain.close()
    engine = _engine("on", "on")
    attached = []
    set_sampler = L.llama_set_sampler

    def checked(ctx, slot, chain):
        assert engine.lookahead.inflight is None, "a chain attached or detached while a decode ran"
        # A detached chain changes the context's samplers, and the next decode's graph is built anew: a parked
        # sequence keeps its chain until it leaves in a wave (Recorder.park).
        parked = [s.id for s in engine.scheduler.running if s.parked and s.slot == slot]
        assert chain is not None or not parked, f"the chain of parked sequence {parked} detached"
        attached.append(chain is not None)
        return set_sampler(ctx, slot, chain)

    monkeypatch.setattr(L, "llama_set_sampler", checked)
    try:
        engine.timer = timer = StepTimer()
        ahead = _drive(engine, _submits(tok, 100))
        again = _drive(engine, _submits(tok, 200))
        assert not engine.sampler._attached  # every chain detached once its sequence ended
    finally:
        engine.close()
    assert timer.cpu["overlapped"] > 0  # tokens were recorded while a decode launched ahead ran
    assert attached.count(True) >= 2 * len(LENGTHS)  # every request's chain went onto the device
    for i, n in enumerate(LENGTHS):
        tokens = ahead[100 + i]
        assert len(tokens) == n and tokens[-1][1] == "length", (i, tokens)
        assert tokens == again[200 + i], i  # greedy and seeded alike, run again
        if i % 3 != 1:
            assert tokens == base[100 + i], i  # greedy: the host's text without steady steps


def test_a_burst_of_long_prompts_all_get_their_tokens(tok):
    """Eight prompts of over half a step at once (copy tasks at c = 8, as perf/speculative.py's): a wave starts them in
    what the step's own prompt chunks leave of the budget. It once gave them a whole budget of their own, beside
    the chunks of a prompt still prefilling, and the llama_decode they share overflowed the batch: the engine
    died on a GPU, where steady steps are on by default."""
    from cllm.core.config import ServeConfig
    from cllm.core.model_file import resolve_model
    from cllm.core.protocol import SamplingParams, Submit
    from engine_proc.engine import LLMEngine

    engine = LLMEngine(resolve_model(None), ServeConfig(parallel=8, ctx_size=8 * 1024, steady_steps="on"))
    try:
        budget = engine.runner.token_budget
        text = " ".join(f"line {i}: the quick brown fox jumps over the lazy dog." for i in range(25))
        submits = []
        for i in range(8):
            prompt = tok.encode(f"Copy this, {i}:\n{text}")
            assert budget // 2 < len(prompt) < budget
            submits.append(Submit(400 + i, prompt, SamplingParams(max_tokens=3, ignore_eos=True), per_step=False))
        got = _drive(engine, submits)
    finally:
        engine.close()
    for s in submits:
        assert len(got[s.id]) == 3 and got[s.id][-1][1] == "length", (s.id, got[s.id])
