"""Iteration-level scheduling: every step admits, decodes and retires.

A step decodes one token for every decoding sequence in one llama_decode,
then prompt chunks (of running sequences still prefilling, then of newly
admitted ones) while they fit the token budget (the engine groups them into
llama_decode calls). Sequences leave the moment they finish, and their slot goes to the
next waiting request in the same step.

A step starts at most one request that continues a cache entry (its
prompt extends the entry's tokens: a chat's next turn, an agent's next
call), and besides it any that has waited MAX_WAIT steps. The engine
already sends a step's first tokens call by call (see
engine_proc/run/prefill_runs.py), but conversations whose turns arrive together and
start together also decode in lockstep, and their next turns collide again:
each then waits for the whole burst's prefill. Started a step apart, they
drift apart. Requests start in arrival order, so the others (a shared
system prompt's too) start as many as the budget holds up to the next
continuation: there a burst fills the decode batch at once, which is
throughput, and each one's own prefill is most of its wait anyway.
admit_per_step bounds every request instead (at a cost in throughput under
bursts); the wait bound keeps any of this to a few steps.

A prompt chunk is as long as the budget allows, from wherever the cached
prefix ends. A scored prompt (see SCORED_ROWS) is prefilled whole, in
chunks of at most SCORED_ROWS tokens; in exact mode its cells are not
reused. In exact mode, and with the cache off, prompts are instead
prefilled in blocks of fixed positions [k*B, (k+1)*B) (the last one partial): with flash attention a
token's KV cells depend on the query chunk it was computed in, and fixed
blocks alone in their decode give a prompt token's cells the same bits
whatever else runs, so reusing them changes nothing (see prefix_cache).

There are more KV streams (slots) than sequences may run: the ones no
sequence holds keep finished sequences' cells for the cache.

The decode batch lists the decoding sequences in slot order, and they are
kept in one run of consecutive slots: llama.cpp decodes a run of
consecutive seq_ids in one graph, and a gap would split the step in two.
Which slot a new request takes, what its prefix reuses and how a gap left
by a departure closes (once no request waits that could fill it) are the
KV streams' books (engine_proc/kv/slots.py).

Steady steps (on with GPU layers): llama.cpp reuses the step before's
compute graph (and a GPU replays it as a CUDA graph) only when the decode
batch keeps its shape: the same sequences, tokens and outputs, and no other
llama_decode in between. So a sequence that finishes in the decode is
parked there (its last token fed again at the same position, its row
ignored) and requests wait, until a wave: once a quarter of the slots would
change (or a change has waited MAX_HOLD steps, or fewer than HOLD_MIN
sequences decode while a request waits), the parked leave and the waiting start in their slots,
right after the step's decode; their prefill and the next decode's new shape
cost the one rebuild a wave makes.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass

from engine_proc.kv.disk_cache import DiskCache
from engine_proc.kv.prefix_cache import PrefixCache
from engine_proc.kv.slots import KvStreams, Slots
from engine_proc.sequence import SCORED_ROWS, Chunk, Sequence

# Prefill block of exact mode, in tokens: small blocks let the cache reuse
# more of a prompt, large ones prefill a cold prompt faster. Outside exact
# mode, also the least a step prefills however many sequences decode.
PREFILL_BLOCK = 128
# Steps a request may wait beyond admit_per_step's bound before it is started anyway.
MAX_WAIT = 4
# Steady steps: below this many decoding sequences the batch changes at once; above, in waves, once
# 1/WAVE_SHARE of the slots would change or a change has waited MAX_HOLD steps.
HOLD_MIN = 8
WAVE_SHARE = 4
MAX_HOLD = 16
# Steady steps: steps a request waits while fewer than HOLD_MIN decode (one: another arriving may start with it).
RAMP_WAIT = 2


@dataclass(slots=True)
class Step:
    decode: list[Chunk]  # one token of each decoding sequence, in slot order: one llama_decode
    prefill: list[Chunk]  # prompt blocks, a llama_decode each, in order


@dataclass(frozen=True, slots=True)
class SchedulerSettings:
    parallel: int  # sequences that may run at once
    slots: int  # KV streams: one for each running sequence, and those that only keep cache entries
    token_budget: int  # tokens a step decodes (n_batch)
    seq_ctx: int  # KV cells a sequence may fill
    prefix_cache: bool = True
    exact: bool = False  # --prefix-cache-exact: fixed prefill blocks (see the module's docstring)
    host_bytes: int = 0  # host RAM the cache may keep entries in (--cache-ram)
    admit_per_step: int = 0  # new requests a step may start; 0: see the module's docstring
    steady: bool = False  # steady steps (see the module's docstring)


class Scheduler:
    def __init__(self, settings: SchedulerSettings, kv: KvStreams, disk: DiskCache | None = None):
        self.parallel = settings.parallel
        self.admit_per_step = settings.admit_per_step
        self.token_budget = settings.token_budget
        self.seq_ctx = settings.seq_ctx
        self.block = min(PREFILL_BLOCK, settings.token_budget)
        # Fixed prefill blocks without the cache too: a server with it off is
        # what exact mode must match bit for bit.
        self.exact = settings.exact or not settings.prefix_cache
        self.kv = kv
        self.cache = (
            PrefixCache(self.block if settings.exact else 1, settings.host_bytes, disk)
            if settings.prefix_cache
            else None
        )
        self.slots = Slots(settings.slots, kv, self.cache, self.exact, self.block)
        self.steps = 0  # schedule() calls
        self.waiting: deque[Sequence] = deque()
        self.running: list[Sequence] = []  # in slot order after every schedule()
        self._ordered = True  # running is in slot order
        # Steady steps (see the module's docstring): finished sequences parked in the decode batch until a wave.
        self.steady = settings.steady
        self.parked = 0
        self.left: list[Sequence] = []  # parked sequences that left, whose chains on the device the engine frees
        # Admitted with all their prompt's cells and the logits after it from the cache (PrefixCache.lookup): their
        # first token is picked from those, before this step's runs (Recorder.recall), which the engine drains.
        self.recalled: list[Sequence] = []
        self._pending_since: int | None = None  # the step since which a wave has had something to do

    def has_work(self) -> bool:
        return bool(self.running or self.waiting)

    def warm(self) -> bool:
        """The idle engine's: a file the disk cache found at the start into an empty stream (Slots.warm)."""
        return self.slots.warm(self.steps)

    def add(self, seq: Sequence) -> None:
        seq.arrived = self.steps
        self.waiting.append(seq)

    def remove(self, ids: set[int]) -> list[Sequence]:
        """Take the given sequences out, waiting or running; their slots are free.

        A running sequence's reusable cells stay in its stream as a cache entry.
        """
        gone = [s for s in self.waiting if s.id in ids]
        if gone:
            self.waiting = deque(s for s in self.waiting if s.id not in ids)
        running = [s for s in self.running if s.id in ids]
        if running:
            self.running = [s for s in self.running if s.id not in ids]
            self.parked -= sum(s.parked for s in running)
            for seq in running:
                self.slots.release(seq)
        return gone + running

    def schedule(self) -> Step:
        self.steps += 1
        self.slots.new_step()
        if self.steady and self.parked and not self.waiting and self._wave_due():  # nothing to pair their leaving with
            self._leave()
        decode = self.decode_batch()
        budget = self.token_budget - len(decode)
        prefill: list[Chunk] = []
        for seq in self.running:
            if seq.prefilling and (budget > 0 or not prefill):
                budget = self._prefill(seq, budget, prefill)
        if not self.steady and self._admit_waiting(budget, prefill):  # slots moved: the batch goes in slot order
            decode.sort(key=lambda c: c.seq.slot)
        return Step(decode, prefill)

    def decode_batch(self) -> list[Chunk]:
        """A token of every decoding sequence, in slot order."""
        if self.parked:
            for seq in self.running:
                if seq.parked:  # the cell its last decode wrote goes: it decodes at the same position again
                    self.kv.trim(seq.slot, seq.position(seq.n_cached))
        return [Chunk(seq, seq.n_cached, seq.n_cached + 1) for seq in self.running if not seq.prefilling]

    def go_on(self, chunks: list[Chunk]) -> list[Chunk] | None:
        """Steady steps one ahead (engine_proc/step/ahead.py): the next decode batch from ``chunks``, the decode whose
        tokens are not recorded yet: the same sequences, each a position on, the parked where they are. None when
        the batch must change first: a wave is due, or a sequence would pass its context."""
        if len(chunks) != len(self.running) or self._wave_due():
            return None
        if any(not c.seq.parked and c.end >= self.seq_ctx for c in chunks):
            return None
        self.steps += 1
        nxt = []
        for c in chunks:
            seq = c.seq
            if seq.parked:
                self.kv.trim(seq.slot, seq.position(seq.n_cached))
                nxt.append(Chunk(seq, seq.n_cached, seq.n_cached + 1))
            else:
                nxt.append(Chunk(seq, c.end, c.end + 1))
        return nxt

    def park(self, seq: Sequence) -> None:
        """A steady step's finished sequence: it stays in the decode batch, its token fed again at the same
        position (its output was sent), until the next wave, so that the batch keeps its shape."""
        seq.parked = True
        self.parked += 1
        if not seq.output:  # finished on its first token: the prompt's last one fills its row (an image's is no token)
            seq.output.append(0 if seq.images and seq.images[-1].end == len(seq.prompt) else int(seq.prompt[-1]))

    def wave(self, step: Step) -> None:
        """After a steady step's decode, when one is due: the parked sequences leave and waiting requests start
        in their slots, their first chunks into ``step.prefill`` in what its chunks left of the budget: they
        share a llama_decode with them (engine_proc/run/prefill_runs.py)."""
        if self._wave_due():
            self._leave()
            budget = self.token_budget - len(step.decode) - sum(c.end - c.start for c in step.prefill)
            self._admit_waiting(budget, step.prefill)

    def _leave(self) -> None:
        self.left += self.remove({s.id for s in self.running if s.parked})
        self._pending_since = None
        if not self.waiting:  # no request takes their slots: the gaps close (a gap splits the decode in two)
            self._compact()
            self._sort()

    def _wave_due(self) -> bool:
        """Whether the decode batch changes now: when nothing decodes but parked sequences, or it is small and a
        request has waited RAMP_WAIT steps (its first token does); else once a quarter of the slots would change,
        or a request has waited for a change MAX_HOLD steps.

        Every change costs a rebuild of the graph (a joining request's
        prefill is a llama_decode of its own), so requests arriving a step
        apart while few decode start in pairs, and parked sequences with no
        request to take their slots wait for a quarter of the slots (at most
        that many rows decode for nothing): as a run drains, every departure
        at once would rebuild the graph at each (staggered c = 32: 80% of
        decode steps reused it; 89% with the ramp's requests started one by
        one and departures let go after MAX_HOLD steps).
        """
        decoding = len(self.running) - self.parked
        changes = max(self.parked, min(len(self.waiting), self.parallel - decoding))
        if not changes:
            return False
        if self._pending_since is None:
            self._pending_since = self.steps
        if not decoding or changes * WAVE_SHARE >= self.parallel:
            return True
        if not self.waiting:
            return False
        return (
            decoding < HOLD_MIN
            and self.steps - self.waiting[0].arrived >= RAMP_WAIT
            or self.steps - self._pending_since >= MAX_HOLD
        )

    def _admit_waiting(self, budget: int, prefill: list[Chunk]) -> bool:
        """Start waiting requests, their first chunks into ``prefill``; whether running sequences changed slots."""
        # A request is admitted when its first block can go in this step: one
        # that waits a step may find more of its prompt in a running sequence.
        admitted, continued = 0, False  # continued: a request that continues a cache entry started
        while (
            self.waiting
            and len(self.running) < self.parallel
            and (budget >= self.block or not prefill)
            and (
                (admitted < self.admit_per_step if self.admit_per_step else not continued)
                or self.steps - self.waiting[0].arrived > MAX_WAIT
            )
        ):
            admitted += 1
            seq = self.waiting.popleft()
            continued = self.slots.admit(seq, self.running) or continued
            self.running.append(seq)
            self._ordered = False
            if seq.prefilling or seq.end_logits is None:
                budget = self._prefill(seq, budget, prefill)
            else:
                self.recalled.append(seq)
        self._compact()
        return self._sort()

    def _compact(self) -> None:
        """Close the gaps in the running sequences' slots (Slots.compact), unless requests wait: the gaps are
        theirs to fill (they could not all be admitted this step)."""
        if not self.waiting and self.slots.compact(self.running):
            self._ordered = False

    def _sort(self) -> bool:
        """Running sequences in slot order again; whether they had moved."""
        if self._ordered:
            return False
        self.running.sort(key=lambda s: s.slot)  # slots moved, or sequences came in
        self._ordered = True
        return True

    def _prefill(self, seq: Sequence, budget: int, chunks: list[Chunk]) -> int:
        """Add the sequence's next prompt chunks while they fit ``budget``; what is left of it.

        The step's first chunk goes in even if it does not fit, a block of
        it at least, so prompts get on however many sequences decode.
        """
        start, end = seq.n_cached, len(seq.prompt)
        while start < end:
            # In exact mode up to the next block boundary (start is one, or an image's edge).
            size = (start // self.block + 1) * self.block - start if self.exact else max(budget, self.block)
            stop = min(start + (min(size, SCORED_ROWS) if seq.scored else size), end)
            image = seq.image_over(start, stop) if seq.images else None
            if image is not None and image.start > start:  # the text before it
                stop, image = image.start, None
            elif image is not None:  # a non-causal image whole (its start is one: the cache keeps images whole)
                stop = image.end if image.non_causal else min(stop, image.end)
            if stop - start > budget and chunks:
                break
            chunks.append(Chunk(seq, start, stop, image=image))
            budget -= stop - start
            start = stop
            if (
                image is not None
            ):  # its own llama_decode, after the step's text (engine_proc/run/prefill_runs.py): the rest
                break  # of the prompt waits for the next step, so that its cells come after the image's
        return budget

    def finish_reason(self, seq: Sequence, token: int, is_eog: bool) -> str | None:
        """Record the sampled token; say why the sequence ends, if it does."""
        if is_eog and not seq.params.ignore_eos:
            return "stop"
        seq.append(token)
        if len(seq.output) >= seq.params.max_tokens or seq.n_cached >= self.seq_ctx:
            return "length"
        return None
