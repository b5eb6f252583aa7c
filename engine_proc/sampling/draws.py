"""The common sampling chain, for every row of a decode at once: numpy over the logits matrix.

A request that asks for top-k (1 to MAX_TOP_K, 40 by default on every
route) with any temperature, top-p, min-p and seed (the EOS ban of
ignore_eos too) needs no llama.cpp chain: its row is drawn here, with the
other such rows of the step, in a few passes over the matrix instead of one
llama_sampler_sample per row (each of which partitions the whole vocabulary
for its top-k before top-p softmaxes what top-k left).

The chain is llama.cpp's, in llama-server's order: top-k, then top-p and
min-p on the probabilities at temperature 1 of what top-k kept, then the
temperature, then the draw; so the distribution is llama.cpp's exactly, and
needs only the top-k tokens of each row. They are found through the maxima
of groups of GROUP tokens (one pass over the matrix): the tokens at or
above the k-th largest maximum of coarser groups (a few groups each) hold
them. Without a top-k, the nucleus needs the softmax of the whole
vocabulary: an exp over 49k floats a row that numpy does no faster than
llama.cpp, so such a chain stays there.

The draw's random number is a hash of the request's seed and the count of
its draws (splitmix64), not a generator's state: a seeded request repeats
its text whatever else is batched, one token at a time or verified in
drafts. It is not llama.cpp's dist, so a seed draws other text than
llama.cpp's chain (or the device's) would.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

import numpy as np

GROUP = 16  # tokens a group holds (see draw_rows)
COARSE = 8  # groups a coarse group holds, where the vocabulary divides so (see draw_rows)
# A chain with a larger top-k, or none, goes to llama.cpp: its draw needs the whole vocabulary's softmax.
MAX_TOP_K = 256
_GOLDEN = np.uint64(0x9E3779B97F4A7C15)
_PAD = np.uint64(0xFFFFFFFFFFFFFFFF)  # sorts after every candidate's key
_MASK = (1 << 64) - 1


@dataclass(slots=True)
class Draw:
    """One request's chain (see the module's docstring) and how many tokens it has drawn."""

    temperature: float
    top_k: int  # 0: off
    top_p: float  # 1: off
    min_p: float  # 0: off
    seed: int  # 64 bits; a random one for a request without a seed
    n: int = 0

    @classmethod
    def new(cls, temperature: float, top_k: int, top_p: float, min_p: float, seed: int | None = None) -> Draw:
        return cls(temperature, top_k, top_p, min_p, random.getrandbits(64) if seed is None else seed & 0xFFFFFFFF)


def mix(z: np.ndarray) -> np.ndarray:
    """splitmix64's finaliser, over uint64 arrays (their products wrap, as the hash wants)."""
    z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
    z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    return z ^ (z >> np.uint64(31))


def mix_int(z: int) -> int:
    """mix of one 64-bit int, in Python's ints (no array for a single number)."""
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9 & _MASK
    z = (z ^ (z >> 27)) * 0x94D049BB133111EB & _MASK
    return z ^ (z >> 31)


def uniforms(draws: list[Draw]) -> np.ndarray:
    """Each draw's next number in [0, 1), from its seed and count alone; the counts advance."""
    seeds = np.fromiter((d.seed for d in draws), np.uint64, len(draws))
    counts = np.fromiter((d.n for d in draws), np.uint64, len(draws))
    for d in draws:
        d.n += 1
    z = mix(mix(seeds) + (counts + np.uint64(1)) * _GOLDEN)
    return (z >> np.uint64(11)).astype(np.float64) * 2.0**-53


def _sort_keys(values: np.ndarray, cols: np.ndarray) -> np.ndarray:
    """uint64 keys that sort by value, largest first, then by token id: the value's bits made
    order-preserving and inverted above, the token id below."""
    bits = values.view(np.uint32)
    order = np.where(bits & np.uint32(0x80000000), ~bits, bits | np.uint32(0x80000000))
    return ((~order).astype(np.uint64) << np.uint64(32)) | cols.astype(np.uint64)


def draw_rows(logits: np.ndarray, draws: list[Draw], ban: np.ndarray | None, eog: np.ndarray) -> list[int]:
    """A token for each row of ``logits`` (rows x vocabulary, float32, left as it is) by its Draw;
    ``ban``: the rows whose end-of-generation tokens (``eog``, a mask over the vocabulary) are out."""
    rows, vocab = logits.shape
    top_k = np.fromiter((d.top_k for d in draws), np.int64, rows)
    # The vocabulary in groups of GROUP tokens, j in group j % (vocab / GROUP): the groups' maxima take one pass
    # over the matrix that numpy vectorises (contiguous stretches), and point at where the candidates are.
    width = next(w for w in (GROUP, 4, 2, 1) if vocab % w == 0)
    groups = vocab // width
    strided = logits.reshape(rows, width, groups)
    group_max = strided.max(axis=1)
    if ban is not None and not ban.any():
        ban = None
    # The candidates: the tokens at or above a floor that at least need tokens of the row reach, need being the
    # largest top-k and the EOS tokens a banned row may find there. The floor is the need-th largest maximum of
    # coarse groups (each the union of a few groups, so their maxima are the groups' maxima's): each coarse group
    # at or above it holds one such token at least. A partition over the coarse maxima costs a fraction of one
    # over the groups' (the coarser, the lower the floor and the more candidates to sort: 8 measured best).
    need = int(top_k.max()) + (0 if ban is None else int(eog.sum()))
    if need < groups:
        n = groups // next(f for f in (COARSE, 4, 2, 1) if groups % f == 0 and groups // f > need)
        coarse = group_max.reshape(rows, -1, n).max(axis=1)
        floor = np.partition(coarse, n - need, axis=1)[:, n - need]
    else:
        floor = np.full(rows, -np.inf, np.float32)
    hit = np.flatnonzero(group_max >= floor[:, None])
    r, g = hit // groups, hit % groups
    values = strided[r, :, g]  # each group's tokens: g, g + groups, g + 2 groups, ...
    at = np.flatnonzero(values >= floor[r, None])
    pair = at // width
    r, c, v = r[pair], at % width * groups + g[pair], values.ravel()[at]
    if ban is not None:
        allowed = ~(ban[r] & eog[c])
        r, c, v = r[allowed], c[allowed], v[allowed]
    counts = np.bincount(r, minlength=rows)
    span = int(counts.max())
    table = np.full((rows, span), _PAD, np.uint64)
    table[r, np.arange(len(r)) - (np.cumsum(counts) - counts)[r]] = _sort_keys(v, c)
    table.sort(axis=1)
    span = min(span, int(top_k.max()))  # past the largest top-k nothing is kept
    table = table[:, :span]
    valid = table != _PAD
    tokens_of = np.where(valid, table & np.uint64(0xFFFFFFFF), 0).astype(np.intp)
    values = np.take_along_axis(logits, tokens_of, axis=1).astype(np.float64)
    shifted = np.where(valid, values - values[:, :1], -np.inf)  # below the row's likeliest allowed token
    keep = valid & (np.arange(span) < top_k[:, None])
    top_p = np.fromiter((d.top_p for d in draws), np.float64, rows)
    if (top_p < 1.0).any():  # the nucleus: tokens while the mass before them is under top_p of what top-k kept
        p = np.where(keep, np.exp(shifted), 0.0)
        mass = np.cumsum(p, axis=1)
        keep &= (mass - p < top_p[:, None] * mass[:, -1:]) | (top_p[:, None] >= 1.0)
    min_p = np.fromiter((d.min_p for d in draws), np.float64, rows)
    if (min_p > 0.0).any():
        keep &= shifted >= np.log(np.maximum(min_p, 1e-300))[:, None]
    keep[:, 0] = valid[:, 0]  # the likeliest stays (min_keep 1)
    temp = np.fromiter((d.temperature for d in draws), np.float64, rows)
    weights = np.where(keep, np.exp(shifted / temp[:, None]), 0.0)
    total = np.cumsum(weights, axis=1)
    picks = (total <= (uniforms(draws) * total[:, -1])[:, None]).sum(axis=1)
    last = span - 1 - np.argmax(keep[:, ::-1], axis=1)  # a rounding past the end falls on the last kept token
    picks = np.minimum(picks, last)
    return tokens_of[np.arange(rows), picks].tolist()
