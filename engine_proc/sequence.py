"""One request as the engine sees it: tokens, KV slot and progress."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from cllm.core.protocol import SamplingParams, TokenLogprobs
from engine_proc.sampling.draws import mix_int
from engine_proc.sampling.sampler import SeqSampler

FIRST_DRAFT = 2  # tokens a sequence drafts before it has shown how much it copies
# Logits rows a llama_decode asks beyond one a sequence: llama.cpp reserves its compute buffer for the most rows a
# decode may ask (n_vocab floats each; 64 rows of SmolLM2's 49k: 12 MiB, of gemma-3's 262k: 64 MiB), on the GPU
# when layers are. A chunk of a scored prompt (one that asks for its prompt's logprobs), which is a llama_decode of
# its own (engine_proc/run/prefill_runs.py), holds at most SCORED_ROWS tokens; a step's drafts add at most DRAFT_ROWS.
SCORED_ROWS = 64
DRAFT_ROWS = 128


@dataclass(slots=True)
class Drafting:
    """How well a sequence's speculative drafts fare (see drafter)."""

    want: int = FIRST_DRAFT  # the draft it earned: doubles when one is accepted whole
    rate: float = 1.0  # accepted / drafted, recent drafts weighing most
    rest: int = 0  # steps to wait before drafting again after a draft failed outright
    misses: int = 0  # drafts in a row that failed outright
    recalled: bool = False  # its draft in this step is an earlier answer, from the memory (Drafter.recall)
    after: int = -1  # then the answer's token after the draft, which the draft's last row should give; -1: none
    drafted: int = 0  # tokens, over the request, for its timings (llama-server's draft_n)
    accepted: int = 0


@dataclass(slots=True)
class ImageSpan:
    """One image's KV cells in a sequence's prompt, [start, end), and its encoding: row k goes in cell start + k.

    Its positions: one a cell, in order; with M-RoPE (``pos``) ``n_pos`` of them, fewer than its cells: every row
    has its four components from the image's first position (Vision.positions), and text after the image goes on
    n_pos positions after that first one."""

    start: int
    end: int
    rows: np.ndarray  # float32, one row of the model's input width per cell
    # Its rows see each other, not only the rows before them (Gemma 3: mtmd_decode_use_non_causal): it is decoded
    # whole, in one llama_decode and one ubatch, with the causal mask off (ModelRunner.decode_rows)
    non_causal: bool = False
    n_pos: int = 0  # positions it takes (0: one a cell)
    pos: np.ndarray | None = None  # int32 (4, cells): each row's M-RoPE components, from the image's first position

    @property
    def shift(self) -> int:
        """Cells it takes beyond its positions: what the positions after it lag their cells by."""
        return self.end - self.start - self.n_pos if self.pos is not None else 0

    def positions(self, k0: int, k1: int, first: int) -> int | np.ndarray:
        """Rows k0..k1's positions, the image's first being ``first``: the first of them (one a row, in order), or
        their M-RoPE components (EmbdBatch.decode takes either)."""
        return first + k0 if self.pos is None else self.pos[:, k0:k1] + first


@dataclass(eq=False, slots=True)
class Sequence:
    id: int
    prompt: np.ndarray  # int32 token ids
    params: SamplingParams
    sampler: SeqSampler
    slot: int = -1  # its KV stream / llama.cpp seq_id while running
    n_cached: int = 0  # tokens whose KV cells are filled
    reused: int = 0  # prompt tokens the prefix cache served when it was admitted
    output: list[int] = field(default_factory=list)
    prompt_logprobs: list[TokenLogprobs] = field(default_factory=list)  # when its params ask
    drafting: Drafting | None = None  # its speculation, once it decodes with the engine's drafter
    per_step: bool = True  # the frontend reads each step's token as it comes (Submit.per_step)
    scope: int = 0  # whose drafts its text may steer (Submit.scope; engine_proc/step/ngram_memory.py)
    arrived: int = 0  # the scheduler's step count when it was queued
    parked: bool = False  # finished, kept in a steady decode batch until the next wave (Scheduler.park)
    # Its images, in prompt order: their positions hold placeholder ids (engine_proc/vision/encoder.py), never decoded
    # as tokens.
    images: list[ImageSpan] = field(default_factory=list)
    lora: int = 0  # the LoRA adapter set it decodes under (engine_proc/run/lora.py; 0: none)
    # Under an adapter set, the set's hash, which the prefix cache's key mixes its first token with (see key). 0: none.
    mark: int = 0
    # The logits after its prompt, which pick its first token: kept from its prefill when ``keeps_logits`` (its
    # cache entry offers them to the same prompt later), or handed over by such an entry, whose cells then serve
    # the whole prompt and its first token needs no decode (PrefixCache.lookup).
    keeps_logits: bool = False
    end_logits: np.ndarray | None = None
    # Its known tokens, prompt then output, in one array whose capacity doubles: known() is a view, not a copy.
    tokens: np.ndarray = field(init=False)
    # Cells its images take beyond their positions (M-RoPE): the position of a cell after them is its index less
    # this (see position).
    shift: int = field(init=False)

    def __post_init__(self):
        self.tokens = np.empty(len(self.prompt) + 16, np.int32)
        self.tokens[: len(self.prompt)] = self.prompt
        self.shift = sum(span.shift for span in self.images)

    def append(self, token: int) -> None:
        """Record a sampled token."""
        n = len(self.prompt) + len(self.output)
        if n == len(self.tokens):
            self.tokens = np.concatenate((self.tokens, np.empty(n, np.int32)))
        self.tokens[n] = token
        self.output.append(token)

    @property
    def scored(self) -> bool:
        """It asks for its prompt's logprobs: every prompt token needs its logits row."""
        return self.params.prompt_logprobs is not None

    @property
    def prefilling(self) -> bool:
        return self.n_cached < len(self.prompt)

    def image_over(self, start: int, stop: int) -> ImageSpan | None:
        """The first image with positions in [start, stop)."""
        for span in self.images:
            if span.end > start and span.start < stop:
                return span
        return None

    def image_edge(self, n: int) -> int:
        """``n`` moved back to the start of the image it falls inside, if any: a cached prefix must end at an
        image's edge, so that another image's cells match all of an image's positions or none."""
        span = self.image_over(n - 1, n) if n else None
        return span.start if span is not None and span.end > n else n

    def position(self, n: int) -> int:
        """The position of its cell ``n``: ``n`` but after an M-RoPE image, whose cells take fewer positions; in
        an image, the image's first position. Cells are cut by position (llama_memory_seq_rm): cutting at
        position(n) keeps the first n cells, n at an image's edge."""
        if not self.shift:
            return n
        shift = 0
        for span in self.images:
            if span.end <= n:
                shift += span.shift
            elif span.start < n:
                return span.start - shift
            else:
                break
        return n - shift

    def known(self, n: int) -> np.ndarray:
        """Its first ``n`` known tokens: the prompt's, then the output's (a view: later tokens never change them)."""
        return self.tokens[:n]

    def key(self, n: int) -> np.ndarray:
        """Its first ``n`` known tokens as the prefix cache files its cells: under an adapter set, a copy whose
        first token is a negative number (never a token, nor the cache's -1 pad) made of the set's mark and that
        token, so that its cells are found only by prompts under the same set that start alike, in the streams,
        host RAM and files alike."""
        if not self.mark or not n:
            return self.tokens[:n]
        keyed = self.tokens[:n].copy()
        keyed[0] = -2 - mix_int(self.mark ^ int(keyed[0])) % (2**31 - 2)
        return keyed


@dataclass(slots=True)
class Chunk:
    """Tokens of one sequence in this step's batch: positions [start, end)."""

    seq: Sequence
    start: int
    end: int
    draft: np.ndarray | None = None  # tokens guessed after the last sampled one: [start + 1, end)
    image: ImageSpan | None = None  # the positions are this image's: its rows are decoded, not tokens

    @property
    def samples(self) -> bool:
        """The chunk ends the known tokens, so its last logits pick the next one."""
        return self.end >= len(self.seq.prompt)

    @property
    def every_row(self) -> bool:
        """Each token needs its logits row: to score the prompt, or to check a draft."""
        return self.draft is not None or self.scores

    @property
    def scores(self) -> bool:
        """Prompt tokens of a sequence that asks for their logprobs: a logits row for each."""
        return self.start < len(self.seq.prompt) and self.seq.scored


def common_prefix(a: np.ndarray, b: np.ndarray) -> int:
    """How many first tokens two token arrays share."""
    n = min(len(a), len(b))
    diff = np.flatnonzero(a[:n] != b[:n])
    return int(diff[0]) if len(diff) else n


def starts_with(tokens: np.ndarray, prefix: np.ndarray) -> bool:
    """Whether ``tokens`` begins with all of ``prefix``. The last token is compared first:
    it tells most arrays apart at the cost of one scalar, not a pass over both."""
    n = len(prefix)
    return len(tokens) >= n and (n == 0 or tokens[n - 1] == prefix[n - 1]) and common_prefix(tokens, prefix) == n
