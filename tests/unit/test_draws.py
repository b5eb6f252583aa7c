"""engine_proc/sampling/draws.py: the common chain drawn over a logits matrix, against its exact distribution."""

from __future__ import annotations

from collections import Counter

import numpy as np
import pytest

from engine_proc.sampling.draws import Draw, draw_rows, uniforms

VOCAB = 16384


def exact(row: np.ndarray, temperature: float, top_k: int, top_p: float, min_p: float, banned=()) -> np.ndarray:
    """llama.cpp's chain, written out over the whole row: top-k, top-p and min-p at temperature 1, temperature, draw."""
    x = row.astype(np.float64).copy()
    x[list(banned)] = -np.inf
    order = np.argsort(-x, kind="stable")
    xs = x[order] - x[order[0]]
    keep = np.isfinite(xs) & (np.arange(len(x)) < top_k)
    p = np.where(keep, np.exp(xs), 0.0)
    p /= p.sum()
    keep &= np.cumsum(p) - p < top_p
    if min_p:
        keep &= xs >= np.log(min_p)
    keep[0] = True
    w = np.where(keep, np.exp(xs / temperature), 0.0)
    out = np.zeros(len(x))
    out[order] = w / w.sum()
    return out


@pytest.fixture
def logits():
    rng = np.random.default_rng(0)
    m = (rng.standard_normal((3, VOCAB)) * 2).astype(np.float32)
    m[0, :20] += 6  # a peaked row
    m[2, 1] = m[2].max() + 30  # an EOS token far ahead
    return m


@pytest.mark.parametrize(
    "chain", [(0.7, 40, 0.9, 0.0), (1.0, 5, 1.0, 0.0), (1.5, 100, 0.95, 0.05), (0.3, 256, 0.5, 0.0)]
)
def test_every_row_follows_the_chains_exact_distribution(logits, chain):
    eog = np.zeros(VOCAB, bool)
    eog[[1, 2]] = True
    ban = np.array([False, False, True])
    n = 1500  # draws of each row: 1500 copies of it, each with a seed of its own, drawn at once
    rows = np.repeat(logits, n, axis=0)
    draws = [Draw.new(*chain, seed=i) for i in range(len(rows))]
    tokens = np.array(draw_rows(rows, draws, np.repeat(ban, n), eog)).reshape(3, n)
    counts = [Counter(tokens[r].tolist()) for r in range(3)]
    for r in range(3):
        want = exact(logits[r], *chain, banned=(1, 2) if ban[r] else ())
        got = np.zeros(VOCAB)
        for token, k in counts[r].items():
            got[token] = k / n
        assert set(np.flatnonzero(got)) <= set(np.flatnonzero(want)), "a token the chain leaves out"
        assert np.abs(got - want).max() < 0.05, (r, np.abs(got - want).max())


def test_a_seed_draws_the_same_tokens_whatever_else_is_batched(logits):
    alone = [draw_rows(logits[1:2], [d], None, np.zeros(VOCAB, bool))[0] for d in [Draw.new(1.0, 40, 0.95, 0.0, 9)] * 1]
    d = Draw.new(1.0, 40, 0.95, 0.0, 9)
    first = [draw_rows(logits[1:2], [d], None, np.zeros(VOCAB, bool))[0] for _ in range(20)]
    d2, other = Draw.new(1.0, 40, 0.95, 0.0, 9), Draw.new(1.0, 40, 0.95, 0.0, 10)
    batched = [
        draw_rows(logits, [other, d2, Draw.new(0.5, 3, 1.0, 0.0, 1)], None, np.zeros(VOCAB, bool))[1] for _ in range(20)
    ]
    assert first == batched and first[0] == alone[0]
    assert len(set(first)) > 1  # the stream moves on


def test_numbers_depend_on_the_seed_and_the_count_alone():
    a, b = Draw.new(1.0, 1, 1.0, 0.0, 5), Draw.new(1.0, 1, 1.0, 0.0, 6)
    first = uniforms([a, b])
    assert (a.n, b.n) == (1, 1) and first[0] != first[1] and ((first >= 0) & (first < 1)).all()
    assert uniforms([Draw.new(1.0, 1, 1.0, 0.0, 5)])[0] == first[0]
    # Neighbouring seeds are not one stream shifted by a step.
    assert uniforms([Draw(1.0, 1, 1.0, 0.0, 6, n=0)])[0] != uniforms([Draw(1.0, 1, 1.0, 0.0, 5, n=1)])[0]


def test_the_nucleus_keeps_the_token_that_crosses_top_p():
    # A background of distinct logits: one of equal ones makes every token a candidate for top-k (seconds of sorting).
    row = -30.0 - np.arange(VOCAB, dtype=np.float32) / VOCAB
    row[[7, 8, 9, 10]] = np.log([0.5, 0.3, 0.15, 0.05])  # top-p 0.7: 7 (0 before it), 8 (0.5 before it), not 9 (0.8)
    rows = np.repeat(row[None], 1000, axis=0)
    got = Counter(draw_rows(rows, [Draw.new(1.0, 40, 0.7, 0.0, i) for i in range(1000)], None, np.zeros(VOCAB, bool)))
    assert set(got) == {7, 8}
    assert abs(got[8] / 1000 - 0.3 / 0.8) < 0.06


@pytest.mark.parametrize("vocab, top_k", [(49152, 40), (49152, 256), (VOCAB, 256), (32000, 40)])
def test_every_token_of_the_top_k_can_be_drawn(vocab, top_k):
    # At a high temperature with no top-p the top-k tokens are about equally likely: each of them must turn up,
    # so a floor that leaves out even the k-th (draw_rows's candidates) fails here. Seeded: the same draws each run.
    row = np.random.default_rng(1).standard_normal(vocab).astype(np.float32)
    n = 40 * top_k
    got = set(
        draw_rows(
            np.repeat(row[None], n, axis=0),
            [Draw.new(1e4, top_k, 1.0, 0.0, i) for i in range(n)],
            None,
            np.zeros(vocab, bool),
        )
    )
    assert got == set(np.argsort(-row, kind="stable")[:top_k].tolist())
