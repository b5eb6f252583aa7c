"""`--steady-steps on`: finished sequences stay parked in the decode batch and new ones start in waves.

On the CPU the setting is off by default (auto: on with GPU layers); turned on, the server must give every request
the tokens it asked for, the same greedy text as without it, and llama.cpp must reuse its graph in no fewer decode
steps.
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import pytest

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
