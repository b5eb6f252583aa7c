"""Per-sequence llama.cpp sampler chains, grammars and logprobs.

Each sequence gets its own chain, built once at admission from its
parameters; a step calls llama_sampler_sample once per sampling sequence, so
the work over the vocabulary (logit bias, top-k, penalties, softmax, the
draw) runs in C and Python's share is O(batch). A chain's seeded
distribution belongs to its sequence alone, so a seed reproduces text
whatever else is batched.

A grammar stays outside the chain, as in llama.cpp's common sampler:
matching every one of 49k token pieces against it costs about 17 ms, so the
chain first picks from the unconstrained logits and the grammar checks only
that token; the whole vocabulary is filtered, and the chain asked again,
only when the grammar refuses it.

Plain greedy (temperature ~0, no penalty, no bias but the EOS ban, no
grammar) needs no chain: its token is the argmax of its logits row, which
numpy finds without the copy of the whole vocabulary into a candidate
array that llama_sampler_sample makes (32 rows: 0.1 ms instead of 1.7 ms),
and a run's greedy rows take one numpy call over its logits matrix
(sample_rows).

The common chain (top-k, temperature, top-p, min-p, a seed, and the EOS
ban of ignore_eos; no grammar, penalty or logit bias) needs no llama.cpp
chain either: a run's rows of it are drawn together over the logits matrix
(engine_proc/sampling/draws.py), rather than one llama_sampler_sample a row.

Logprobs are computed with numpy from the logits row, and only for the
sequences that ask.

Sampling on the device (``device``: --device-sampling on, or auto with GPU
layers; off by default: a chain per sequence on the device made a step
slower than these batched passes over the host's rows, docs/internals.md): a
request whose chain llama.cpp can run inside llama_decode (greedy,
temperature, top-k, top-p, min-p, the seeded draw, and the EOS ban of
ignore_eos) gets its chain attached to its KV stream's seq_id with
llama_set_sampler, so that only its token id comes back from the device and
its logits are not copied to the host at all (llama_sampler_sample then
returns the token the device drew, and advances the chain's state; a
greedy chain has no state, so its token is read alone).
Grammars, penalties, a request's own logit bias, logprobs and speculative
drafts stay on the host, as does every request without the switch: their
rows are copied and sampled as above. A greedy token is the same either
way (the argmax of the same logits); a seeded request repeats its text
run to run either way, but the device's draw is not the host's.
Attaching or detaching a chain makes llama.cpp re-plan its compute graph at
the next decode; chains stay attached while their sequence keeps its slot.
"""

from __future__ import annotations

import ctypes
import re
from dataclasses import dataclass

import llama_cpp as L
import numpy as np

from cllm.core.protocol import SamplingParams, TokenLogprobs
from engine_proc.sampling.draws import MAX_TOP_K, Draw, draw_rows

PENALTY_LAST_N = 64  # tokens the penalties look back over, prompt included, as llama-server
# Smaller temperatures are greedy, as in vLLM: they differ from it only on exact ties, and
# below ~1e-38 logits / temperature overflows float32 into infinities and NaN probabilities.
MIN_TEMPERATURE = 1e-5
MAX_TRIGGER_RETRIES = 8  # tokens refused for running past a lazy grammar's trigger, before giving up
TOKEN_DATA = np.dtype([("id", np.int32), ("logit", np.float32), ("p", np.float32)])  # llama_token_data
# llama_get_logits_ith returning the row's address as an int: a numpy view of it
# then costs ~1 us, where np.ctypeslib.as_array on llama-cpp-python's float pointer
# costs ~6 us, and several times that right after a llama_decode, with the caches cold.
_logits_ith = ctypes.CFUNCTYPE(ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int32)(
    ctypes.cast(L.llama_get_logits_ith, ctypes.c_void_p).value
)
# The token a greedy chain chose on the device, the same way: ~1 us a row, where llama_sampler_sample reads the
# row's token, probabilities, logits and candidates and then accepts the token into the chain (~5 us).
_sampled_ith = ctypes.CFUNCTYPE(ctypes.c_int32, ctypes.c_void_p, ctypes.c_int32)(
    ctypes.cast(L.llama_get_sampled_token_ith, ctypes.c_void_p).value
)


class GrammarError(ValueError):
    """A request's grammar cannot be parsed, or allows no token to go on with."""


def grammar_sampler(vocab, gbnf: str, triggers: list[str] | None):
    """llama.cpp's grammar sampler; lazy (waiting for a trigger regex to match the output) when triggers are given."""
    if triggers is None:
        return L.llama_sampler_init_grammar(vocab, gbnf.encode(), b"root")
    patterns = (ctypes.c_char_p * len(triggers))(*(t.encode() for t in triggers))
    return L.llama_sampler_init_grammar_lazy_patterns(vocab, gbnf.encode(), b"root", patterns, len(triggers), None, 0)


@dataclass(slots=True)
class SeqSampler:
    chain: object  # None: plain greedy, the argmax of the row, or drawn (draw)
    draw: Draw | None = None  # the common chain, drawn with numpy over the logits matrix (draws.py)
    grammar: object = None  # checked apart from the chain, see Sampler.sample
    ban_eog: bool = False  # plain greedy under ignore_eos
    triggers: list[re.Pattern] | None = None  # a lazy grammar's
    waiting: str | None = None  # a lazy grammar's text while it waits for a trigger; None once it applies
    device: bool = False  # the chain runs inside llama_decode once attached to the sequence's slot
    argmax: bool = False  # greedy on the device: no sampler of its chain keeps state to accept a token into
    slot: int = -1  # the slot its chain is attached to
    placed: bool = False  # its chain was attached once: llama.cpp takes a chain onto the device only once


class Sampler:
    def __init__(self, ctx, vocab, n_vocab: int, eog_tokens: frozenset[int], device: bool = False):
        self.ctx = ctx
        self.device = device  # chains llama.cpp can run go onto the device (see the module's docstring)
        self._attached: dict[int, SeqSampler] = {}  # slot -> the chain llama_decode samples it with
        self.vocab = vocab
        self.n_vocab = n_vocab
        self._ban_eog = dict.fromkeys(sorted(eog_tokens), float("-inf"))
        self._eog = np.array(sorted(eog_tokens), dtype=np.intp)
        self._is_eog = np.zeros(n_vocab, bool)
        self._is_eog[self._eog] = True
        self._scratch = np.empty(n_vocab, np.float32)
        self._row = ctypes.c_float * n_vocab
        self._matrices: dict[int, type] = {}  # rows -> the ctypes type of that many logits rows
        # Candidate arrays for grammar sequences: the whole vocabulary, and one token.
        self._ids = np.arange(n_vocab, dtype=np.int32)
        self._cur = np.zeros(n_vocab, TOKEN_DATA)
        self._one = np.zeros(1, TOKEN_DATA)
        self._piece_buf = ctypes.create_string_buffer(256)
        self._cur_p = L.llama_token_data_array()
        self._one_p = L.llama_token_data_array()
        self._cur_data = self._cur.ctypes.data_as(L.llama_token_data_p)
        self._one_data = self._one.ctypes.data_as(L.llama_token_data_p)

    def new(self, params: SamplingParams, prompt: list[int]) -> SeqSampler:
        s = SeqSampler(None, ban_eog=params.ignore_eos)
        if params.grammar is not None:
            if params.ignore_eos:  # a finished grammar allows only end-of-generation tokens
                raise GrammarError("a grammar cannot be combined with ignore_eos")
            s.grammar = grammar_sampler(self.vocab, params.grammar, params.grammar_triggers)
            if not s.grammar:
                raise GrammarError("llama.cpp could not parse the grammar")
            if params.grammar_triggers is not None:
                s.triggers, s.waiting = [re.compile(t) for t in params.grammar_triggers], ""
        penalize = params.repetition_penalty != 1.0 or params.presence_penalty or params.frequency_penalty
        greedy = params.temperature < MIN_TEMPERATURE
        s.device = self.device and not (
            penalize
            or params.logit_bias
            or s.grammar
            or params.logprobs is not None
            or params.prompt_logprobs is not None
        )
        plain = not (penalize or params.logit_bias or s.grammar or s.device)
        if plain and greedy:
            return s
        if plain and 0 < params.top_k <= MAX_TOP_K:
            s.draw = Draw.new(params.temperature, params.top_k, params.top_p, params.min_p, params.seed)
            return s
        chain = L.llama_sampler_chain_init(L.llama_sampler_chain_default_params())
        add = lambda sampler: L.llama_sampler_chain_add(chain, sampler)  # noqa: E731
        bias = dict(params.logit_bias or ())
        if params.ignore_eos:  # never end: ban end-of-generation tokens outright
            bias.update(self._ban_eog)
        if bias:
            add(
                L.llama_sampler_init_logit_bias(
                    self.n_vocab, len(bias), (L.llama_logit_bias * len(bias))(*bias.items())
                )
            )
        # Top-k goes before the penalties, as llama.h advises: they look every
        # candidate up in their history, ~1 ms a step over the whole vocabulary.
        if params.top_k > 0 and (penalize or not greedy):
            add(L.llama_sampler_init_top_k(params.top_k))
        if penalize:
            penalties = L.llama_sampler_init_penalties(
                self.n_vocab,
                PENALTY_LAST_N,
                params.repetition_penalty,
                params.frequency_penalty,
                params.presence_penalty,
            )
            for t in prompt[-PENALTY_LAST_N:]:
                L.llama_sampler_accept(penalties, t)
            add(penalties)
        s.chain = chain
        if greedy:
            add(L.llama_sampler_init_greedy())
            s.argmax = s.device
            return s
        if params.top_p < 1.0:
            add(L.llama_sampler_init_top_p(params.top_p, 1))
        if params.min_p > 0.0:
            add(L.llama_sampler_init_min_p(params.min_p, 1))
        add(L.llama_sampler_init_temp(params.temperature))
        seed = L.LLAMA_DEFAULT_SEED if params.seed is None else params.seed & 0xFFFFFFFF
        add(L.llama_sampler_init_dist(seed))
        return s

    def sample_rows(self, samplers: list[SeqSampler], rows: list[int]) -> list[int]:
        """Each sequence's next token from its row (rows of one decode, in output order); -1 where its
        grammar allows none. Plain greedy rows go through one argmax over the logits matrix, the common
        chain's through one draw over it (draws.py), the rest through their llama.cpp chains."""
        greedy: list[int] = []
        drawn: list[int] = []
        for k, s in enumerate(samplers):
            if s.chain is None:
                (greedy if s.draw is None else drawn).append(k)
        if len(greedy) == len(samplers):
            tokens = self._argmax_rows(rows)
        else:
            tokens = [-1 if s.chain is None else self._sample_or_dead(s, row) for s, row in zip(samplers, rows)]
            if greedy:
                for k, token in zip(greedy, self._argmax_rows([rows[k] for k in greedy])):
                    tokens[k] = token
            if drawn:
                for k, token in zip(drawn, self._draw_rows([samplers[k] for k in drawn], [rows[k] for k in drawn])):
                    tokens[k] = token
        ban = self._ban_eog
        for k in greedy:
            if tokens[k] in ban and samplers[k].ban_eog:  # rare: look again without the EOS tokens
                tokens[k] = self._argmax(rows[k], True)
        return tokens

    def _draw_rows(self, samplers: list[SeqSampler], rows: list[int]) -> list[int]:
        span, k = self._span(rows)
        logits = span if len(rows) == k else span[[k + r for r in rows]]
        ban = np.fromiter((s.ban_eog for s in samplers), bool, len(samplers))
        return draw_rows(logits, [s.draw for s in samplers], ban, self._is_eog)

    def _sample_or_dead(self, s: SeqSampler, row: int) -> int:
        try:
            return self.sample(s, row)
        except GrammarError:
            return -1

    def _argmax_rows(self, rows: list[int]) -> list[int]:
        """The argmax of each logits row (increasing rows counted from the end of the outputs, as llama_get_logits_ith
        takes them)."""
        logits, k = self._span(rows)
        if len(rows) == k:  # every row of the span
            return logits.argmax(axis=1).tolist()
        return [int(logits[k + r].argmax()) for r in rows]

    def _span(self, rows: list[int]) -> tuple[np.ndarray, int]:
        """The outputs from the first of these increasing rows on, as one matrix, and how many rows it has."""
        k = -rows[0]
        matrix = self._matrices.get(k)
        if matrix is None:
            matrix = self._matrices[k] = ctypes.c_float * (k * self.n_vocab)
        last = _logits_ith(self.ctx, -1)
        span = matrix.from_address(last - (k - 1) * 4 * self.n_vocab)  # type: ignore[attr-defined]  # a ctypes array
        return np.frombuffer(span, np.float32).reshape(k, self.n_vocab), k

    def sample(self, s: SeqSampler, row: int) -> int:
        """The next token; GrammarError when the sequence's grammar allows none."""
        if s.draw is not None:
            return self._draw_rows([s], [row])[0]
        if s.chain is None:
            return self._argmax(row, s.ban_eog)
        if s.argmax and s.slot >= 0 and (token := _sampled_ith(self.ctx, row)) >= 0:
            return token
        if s.grammar is None:
            return L.llama_sampler_sample(s.chain, self.ctx, row)
        logits = self._logits(row)
        token = self._pick(s.chain, logits, None)
        if s.waiting is not None:
            token = self._until_trigger(s, logits, token)
            L.llama_sampler_accept(s.grammar, token)
            L.llama_sampler_accept(s.chain, token)
            return token
        one, one_p = self._one, self._one_p
        one[0] = (token, 0.0, 0.0)
        one_p.data, one_p.size, one_p.selected, one_p.sorted = self._one_data, 1, -1, False
        L.llama_sampler_apply(s.grammar, ctypes.byref(one_p))
        if one[0]["logit"] == -np.inf:  # refused: constrain the whole vocabulary and pick again
            token = self._pick(s.chain, logits, s.grammar)
        L.llama_sampler_accept(s.grammar, token)
        L.llama_sampler_accept(s.chain, token)
        return token

    def _until_trigger(self, s: SeqSampler, logits: np.ndarray, token: int) -> int:
        """The token for a lazy grammar that waits: any, unless it starts the grammar with more text after the trigger.

        llama.cpp replays the text from the trigger on into the grammar when
        it fires, and a replayed character the grammar refuses throws a C++
        exception that aborts the process. So the token that completes a
        trigger must end with it; one that runs past it is refused and the
        chain asked again (the next token then goes through the grammar).
        """
        for _ in range(MAX_TRIGGER_RETRIES):
            text = (s.waiting or "") + self._special_piece(token)
            m = next((m for p in s.triggers if (m := p.search(text))), None)
            if m is None:
                s.waiting = text
                return token
            if text[m.end(m.lastindex or 0) :] == "":
                s.waiting = None  # the grammar applies from now on
                return token
            logits = logits.copy()
            logits[token] = -np.inf
            token = self._pick(s.chain, logits, None)
        raise GrammarError("the model keeps writing past the start of a tool call")

    def _special_piece(self, token: int) -> str:
        """The token's text as llama.cpp's grammar sees it (control tokens written out)."""
        buf = self._piece_buf
        n = L.llama_token_to_piece(self.vocab, token, buf, len(buf), 0, True)
        return buf.raw[: max(n, 0)].decode(errors="replace")

    def _pick(self, chain, logits: np.ndarray, grammar) -> int:
        """Apply the grammar (if any) then the chain to the full candidate array; the chosen token."""
        cur, cur_p = self._cur, self._cur_p
        cur["id"] = self._ids
        cur["logit"] = logits
        cur["p"] = 0.0
        cur_p.data, cur_p.size, cur_p.selected, cur_p.sorted = self._cur_data, self.n_vocab, -1, False
        if grammar is not None:
            L.llama_sampler_apply(grammar, ctypes.byref(cur_p))
            # No token left: llama.cpp would pick one anyway and abort when the grammar rejects it.
            allowed = cur["logit"] > -np.inf
            if not allowed.any():
                raise GrammarError("the grammar allows no token here")
        L.llama_sampler_apply(chain, ctypes.byref(cur_p))
        token = cur_p.data[cur_p.selected].id  # samplers may repoint data: read through it
        # The chain can still pick a refused token when its probabilities are NaN; accepting
        # it would make llama.cpp's grammar throw, which aborts the whole process.
        if grammar is not None and not allowed[token]:
            raise GrammarError("the sampler picked a token the grammar refuses")
        return token

    def logprobs(self, row: int, token: int, top_n: int) -> TokenLogprobs:
        logits = self._logits(row)
        work = self._scratch
        top_ids = []
        if top_n:
            np.copyto(work, logits)
            for _ in range(top_n):  # top_n <= 20: repeated argmax is ~10x quicker than argpartition over 49k
                i = int(work.argmax())
                top_ids.append(i)
                work[i] = -np.inf
        top = logits.max()
        np.subtract(logits, top, out=work)
        np.exp(work, out=work)
        log_z = float(top) + float(np.log(work.sum()))
        return TokenLogprobs(float(logits[token] - log_z), top_ids, (logits[top_ids] - log_z).tolist())

    def keeps(self, s: SeqSampler) -> bool:
        """Whether ``pick`` can draw the sequence's tokens from a logits row the host keeps (greedy or the common
        chain on the host: no llama.cpp chain, which reads its rows from the context)."""
        return s.chain is None and not s.device

    def pick(self, s: SeqSampler, logits: np.ndarray) -> int:
        """The sequence's next token from a row the host keeps (one ``keeps`` allows); as sample_rows picks it."""
        if s.draw is not None:
            return draw_rows(logits[None, :], [s.draw], np.array([s.ban_eog]), self._is_eog)[0]
        return self._argmax_of(logits, s.ban_eog)

    def near(self, s: SeqSampler, row: int, token: int, other: int, gap: float) -> bool:
        """Whether, on a plain greedy sequence's row, ``other`` is a token it may pick within ``gap`` of the logit of
        ``token``, its argmax."""
        if s.chain is not None or s.draw is not None or (s.ban_eog and other in self._ban_eog):
            return False
        logits = self._logits(row)
        return float(logits[token] - logits[other]) <= gap

    def row(self, row: int) -> np.ndarray:
        """A copy of a logits row of the last decode."""
        return self._logits(row).copy()

    def _argmax(self, row: int, ban_eog: bool) -> int:
        return self._argmax_of(self._logits(row), ban_eog)

    def _argmax_of(self, logits: np.ndarray, ban_eog: bool) -> int:
        token = int(logits.argmax())
        if ban_eog and token in self._ban_eog:  # rare: look again without the EOS tokens, leaving the row intact
            scratch = self._scratch
            scratch[:] = logits
            scratch[self._eog] = -np.inf
            token = int(scratch.argmax())
        return token

    def _logits(self, row: int) -> np.ndarray:
        return np.frombuffer(self._row.from_address(_logits_ith(self.ctx, row)), np.float32)

    def attach(self, s: SeqSampler, slot: int) -> None:
        """Before a decode that samples the sequence in ``slot``: its chain attached there if it runs on the
        device, else whatever an earlier sequence left there detached."""
        want = s if s.device else None
        if self._attached.get(slot) is want:
            return
        self._detach(self._attached.get(slot))
        if want is None:
            return
        self._detach(want)  # from the slot it moved away from
        if want.placed:  # a chain goes onto the device once: a copy of it, state and all, goes on now
            old, want.chain = want.chain, L.llama_sampler_clone(want.chain)
            L.llama_sampler_free(old)
        if L.llama_set_sampler(self.ctx, slot, want.chain):
            self._attached[slot], want.slot, want.placed = want, slot, True
        else:  # refused: it samples on the host from now on
            want.device = False

    def _detach(self, s: SeqSampler | None) -> None:
        if s is not None and s.slot >= 0:
            if self._attached.get(s.slot) is s:
                L.llama_set_sampler(self.ctx, s.slot, None)
                del self._attached[s.slot]
            s.slot = -1

    def free(self, s: SeqSampler) -> None:
        self._detach(s)
        if s.chain is not None:
            L.llama_sampler_free(s.chain)
        if s.grammar is not None:
            L.llama_sampler_free(s.grammar)
