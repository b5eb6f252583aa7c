"""llama.cpp model and context, and the one batch every step is decoded from.

Each running sequence owns one KV stream (``kv_unified`` off); its seq_id is
its slot. Separate streams keep a sequence's cells at the same indices
whatever else runs (with one unified cache, 5 of 16 greedy outputs changed
when run together), and let the prefix cache copy a stream whole. With
flash attention a one-token query's result still depends on the other
streams in its ubatch, so decoding together can change greedy output;
prefill is kept exact by the scheduler. llama.cpp puts only consecutive
seq_ids in one ubatch, so the scheduler keeps running sequences in one run of consecutive slots.
"""

from __future__ import annotations

import ctypes
import os
import re
import time

import llama_cpp as L
import numpy as np

from cllm.core.config import ServeConfig
from cllm.core.llama_log import reported, silence_llama_logs
from cllm.core.model_meta import gpu_layers, kv_cache_bytes
from cllm.core.model_meta import meta as _meta
from cllm.core.protocol import ModelInfo
from engine_proc.run.batch import Batch, EmbdBatch
from engine_proc.run.decode_thread import DecodeThread
from engine_proc.run.host_pages import new_pages
from engine_proc.run.threads import Threads, server_cpu
from engine_proc.sequence import DRAFT_ROWS, SCORED_ROWS, Chunk

FLASH_ATTN = {
    "auto": L.LLAMA_FLASH_ATTN_TYPE_AUTO,
    "on": L.LLAMA_FLASH_ATTN_TYPE_ENABLED,
    "off": L.LLAMA_FLASH_ATTN_TYPE_DISABLED,
}


# Cells the start's warm-up prompt fills (at most a stream's): the conversation turns that meet first-use costs
# after a restart reach a few thousand (perf/restart_cache.py's 4,000).
WARMUP_TOKENS = 4096

CACHE_TYPES = {"f32": L.GGML_TYPE_F32, "f16": L.GGML_TYPE_F16, "q8_0": L.GGML_TYPE_Q8_0, "q4_0": L.GGML_TYPE_Q4_0}


_BYTES = ctypes.POINTER(ctypes.c_ubyte)


class ModelLoadError(RuntimeError):
    pass


def context_params(config: ServeConfig, token_budget: int, n_ubatch: int, n_streams: int):
    cparams = L.llama_context_default_params()
    cparams.n_ctx = config.ctx_size // config.parallel * n_streams
    cparams.n_batch = token_budget
    cparams.n_ubatch = n_ubatch
    cparams.n_seq_max = n_streams
    cparams.n_threads = cparams.n_threads_batch = config.n_threads
    cparams.kv_unified = False
    cparams.flash_attn_type = FLASH_ATTN[config.flash_attn]
    cparams.type_k, cparams.type_v = CACHE_TYPES[config.cache_type_k], CACHE_TYPES[config.cache_type_v]
    cparams.no_perf = True
    return cparams


class ModelRunner:
    def __init__(self, model_path: str, config: ServeConfig, server: int | None = None):
        """``server``: the pid of the process that started this one; it and its other children are the server's
        own, not other programs, to the thread probe (Threads.probe). None: the engine runs in its caller's process."""
        silence_llama_logs()
        L.llama_backend_init()
        mparams = L.llama_model_default_params()
        mparams.n_gpu_layers = gpu_layers(config)
        self.model = L.llama_model_load_from_file(model_path.encode(), mparams)
        if not self.model:
            raise ModelLoadError(f"llama.cpp could not load {model_path}")
        self.vocab = L.llama_model_get_vocab(self.model)
        self.n_vocab = L.llama_vocab_n_tokens(self.vocab)
        # A step always has room for one token of every running sequence.
        self.token_budget = max(config.batch_size, config.parallel)

        # --ctx-size is shared by the running sequences; the cache's slots get as much each, and so does the
        # stream that streams in device memory trade places through (swap), where there is one.
        on_device = mparams.n_gpu_layers > 0
        self.n_streams = config.n_streams(on_device)
        self.scratch = config.kv_streams if self.n_streams > config.kv_streams else None
        self.n_ubatch = min(self.token_budget, 512)
        cparams = context_params(config, self.token_budget, self.n_ubatch, self.n_streams)
        # The most logits rows a decode asks: a row a stream, and a step's scored prompt rows or drafts
        # (engine_proc/sequence.py); llama.cpp's default, n_batch, reserved them for every token of a step.
        extra = DRAFT_ROWS if config.spec_types else SCORED_ROWS
        cparams.n_outputs_max = max(min(self.n_streams + extra, self.token_budget), self.n_streams)
        with reported() as said:
            self.ctx = L.llama_init_from_model(self.model, cparams)
        if not self.ctx:
            L.llama_model_free(self.model)
            raise ModelLoadError(f"llama.cpp could not create a context of {cparams.n_ctx} cells for {model_path}")
        self.memory = L.llama_get_memory(self.ctx)
        self.seq_ctx = L.llama_n_ctx_seq(self.ctx)
        self.eog_tokens = frozenset(t for t in range(self.n_vocab) if L.llama_vocab_is_eog(self.vocab, t))
        # The contexts that decode on the engine's threads (new_context adds the embedder's).
        self.contexts = [self.ctx]
        follow = not config.fixed_threads and not on_device  # a GPU's layers do not meet at CPU barriers
        self.threads = Threads(config.n_threads, self.set_threads, follow)

        self._b = Batch(self.token_budget, cparams.n_outputs_max)
        self._e: EmbdBatch | None = None  # an image's rows, made at the first
        self._n = 0  # tokens in the batch
        self._thread = DecodeThread(self.decode)  # launch() and wait(): decode() while the engine's Python runs
        self._moving: set[int] = set()  # streams a copy asked since the last llama_decode reads or writes
        # The host buffers at-once copies go through, kept from one to the next: a new
        # one's pages fault in as they are written, which costs many times the copy into a used one.
        # Each grows to the largest stream copied at once: at most one stream's cells, and a quarter.
        self._scratch = [np.empty(0, np.uint8), np.empty(0, np.uint8)]
        self._positions = np.arange(self.seq_ctx, dtype=np.int32)
        # Streams in host memory move at once, through host bytes (copy, swap); streams in device memory are
        # copied on the device, in the next llama_decode's order: a save and restore through host bytes would wait
        # for the device and cross the bus twice.
        self.moves_at_once = not on_device
        self.threads.probe(server=server_cpu(server))
        # llama.cpp's count of ubatches that reused the previous one's compute graph (PR 14482: same token
        # count, seq ids, outputs and KV mask shape), and whether the last decode() did.
        self._n_reused = L.llama_perf_context(self.ctx).n_reused
        self.reused = False
        self.warmed: tuple[int, float] | None = None  # the start's warm-up: tokens decoded, seconds
        if config.warmup == "on" or (config.warmup == "auto" and on_device):
            try:
                self.warm_up(WARMUP_TOKENS)
            except RuntimeError:  # a decode that failed here is no reason not to serve: the cells go all the same
                L.llama_memory_clear(self.memory, True)

        self.info = ModelInfo(
            model_path=model_path,
            model_name=_meta(self.model, "general.name") or os.path.basename(model_path),
            model_family=_meta(self.model, "general.architecture"),
            quantization=_quantization(self.model),
            vocab_size=self.n_vocab,
            num_layers=L.llama_model_n_layer(self.model),
            n_params=L.llama_model_n_params(self.model),
            model_bytes=L.llama_model_size(self.model),
            n_ctx_train=L.llama_model_n_ctx_train(self.model),
            ctx_size=self.seq_ctx * config.parallel,
            kv_bytes=kv_cache_bytes(self.model, L.llama_n_ctx(self.ctx), config.cache_type_k, config.cache_type_v),
            compute_bytes=compute_bytes("".join(said)),
            seq_ctx=self.seq_ctx,
            parallel=config.parallel,
            cache_slots=config.kv_streams - config.parallel,
            batch_size=self.token_budget,
            threads=config.n_threads,
            gpu_layers=min(mparams.n_gpu_layers, L.llama_model_n_layer(self.model)),
            use_mmap=mparams.load_mode
            in (L.LLAMA_LOAD_MODE_AUTO, L.LLAMA_LOAD_MODE_MMAP, L.LLAMA_LOAD_MODE_MMAP_MLOCK),
            cache_type_k=config.cache_type_k,
            cache_type_v=config.cache_type_v,
        )

    def warm_up(self, n_tokens: int) -> None:
        """Decode a prompt of up to ``n_tokens`` (any ids) in stream 0, a step's budget at a time, then one token
        after it, and clear the cache: llama.cpp's first decodes of prompt-sized batches and of a long stream load
        their kernels and grow their buffers now, not in the first request that needs them."""
        t, n = time.perf_counter(), min(n_tokens, self.seq_ctx - 1)
        for start in range(0, n, self.token_budget):
            self.decode_tokens(np.arange(start, min(start + self.token_budget, n)) % self.n_vocab, start, 0, False)
        self.decode_tokens([n % self.n_vocab], n, 0, True)  # a decode step's shape, its logits read
        L.llama_memory_clear(self.memory, True)
        self._n_reused = L.llama_perf_context(self.ctx).n_reused
        self.warmed = n + 1, time.perf_counter() - t

    def fill(self, chunks: list[Chunk], plain: bool = False, tokens: list[int] | None = None) -> list[int | None]:
        """Put the chunks in the batch the next decode() runs; each one's last logits row (see Batch.fill)."""
        self._n, rows = self._b.fill(chunks, self._positions, plain, tokens)
        return rows

    def positions_lag(self, lag: bool) -> None:
        """Whether a sequence's positions may lag its cells (an M-RoPE projector's images: Sequence.position)."""
        self._b.shifted = lag

    def launch(self) -> None:
        """decode() on the decode thread; nothing may use the context until wait() returns."""
        self._thread.launch()

    def wait(self) -> None:
        """The decode launch() started has ended (on a GPU: llama_decode returned, as decode() does)."""
        self._thread.wait()

    def decode(self) -> None:
        """One llama_decode of the batch fill() wrote."""
        cpu, wall = time.process_time(), time.perf_counter()
        self._b.decode(self.ctx, self._n)
        self._decoded(wall, cpu)

    def decode_rows(
        self, rows: np.ndarray, pos: int | np.ndarray, slot: int, logits: bool, non_causal: bool = False
    ) -> None:
        """One llama_decode of an image's embeddings (``rows``, at most a step's budget) at positions ``pos`` (the
        first, or M-RoPE's: see EmbdBatch.decode) of stream ``slot``; ``logits``: the last row's, for the sampler
        (row -1). ``non_causal``: the rows are a whole image whose rows see each other (at most n_ubatch): the causal
        mask is off for this call alone, which holds no other sequence's tokens (mtmd_helper_decode_image_chunk does
        the same)."""
        if self._e is None:
            self._e = EmbdBatch(self.token_budget, L.llama_model_n_embd_inp(self.model))
        cpu, wall = time.process_time(), time.perf_counter()
        if non_causal:
            L.llama_set_causal_attn(self.ctx, False)
        try:
            self._e.decode(self.ctx, rows, pos, slot, logits)
        finally:
            if non_causal:
                L.llama_set_causal_attn(self.ctx, True)
        self._decoded(wall, cpu)

    def _decoded(self, wall: float, cpu: float) -> None:
        self.threads.decoded(time.perf_counter() - wall, time.process_time() - cpu)
        self._moving.clear()
        n_reused = L.llama_perf_context(self.ctx).n_reused  # counted with no_perf too
        self.reused, self._n_reused = n_reused > self._n_reused, n_reused

    def synchronize(self) -> None:
        """Wait for the device to finish the last decode (a GPU's llama_decode returns before it does)."""
        L.llama_synchronize(self.ctx)

    def new_context(self, cparams):
        """Another context on the model (the embedder's), decoding on the engine's threads; None if llama.cpp cannot
        make it."""
        cparams.n_threads = cparams.n_threads_batch = self.threads.n
        ctx = L.llama_init_from_model(self.model, cparams)
        if not ctx:
            return None
        self.contexts.append(ctx)
        return ctx

    def set_threads(self, n: int) -> None:
        for ctx in self.contexts:
            L.llama_set_n_threads(ctx, n, n)

    # The scheduler's KvStreams: one stream per slot.

    def copy(self, src: int, dst: int, keep: int) -> None:
        """Stream ``dst`` := the first ``keep`` cells of ``src``, at the same indices.

        Streams in host memory: at once, through host bytes, so that every such stream is always settled and
        none needs a scratch stream to trade places (swap). A stream's cells saved and restored pass through
        memory twice where llama.cpp's whole-stream copy moves every cell once, used or not: dearer only for a
        stream more than half full. Streams in device memory: llama.cpp copies the whole stream on the device at
        the start of the next llama_decode, after the copies asked before this one.
        """
        if self.moves_at_once:
            self._restore(dst, self.save(src, scratch=0))
        else:
            L.llama_memory_seq_cp(self.memory, src, dst, -1, -1)
            self._moving.update((src, dst))
        L.llama_memory_seq_rm(self.memory, dst, keep, -1)

    def swap(self, a: int, b: int) -> None:
        """Trade two streams' cells: through host bytes at once (streams in host memory), else through the
        scratch stream."""
        if self.moves_at_once:
            data_a, data_b = self.save(a, scratch=0), self.save(b, scratch=1)
            self._restore(a, data_b)
            self._restore(b, data_a)
            return
        assert self.scratch is not None  # one stream alone trades places with none
        for src, dst in ((a, self.scratch), (b, a), (self.scratch, b)):
            L.llama_memory_seq_cp(self.memory, src, dst, -1, -1)
        self.clear(self.scratch)
        self._moving.update((a, b))

    def _restore(self, slot: int, data: np.ndarray) -> None:
        # A stream's cells always fit another stream of the same size: not fitting is llama.cpp's failure.
        if not self.restore(slot, data):
            raise RuntimeError(f"llama.cpp could not restore {data.nbytes} bytes of cells into KV stream {slot}")

    def settled(self, slot: int) -> bool:
        """Whether the stream's data is what its cells say: no copy from or to it waits for the next decode."""
        return slot not in self._moving

    def save(self, slot: int, scratch: int | None = None) -> np.ndarray:
        """The stream's cells, as host bytes (a settled stream's only: see settled).

        With ``scratch`` (0 or 1) they go into that kept buffer, which the next
        save into it overwrites, rather than into a new array.
        """
        size = L.llama_state_seq_get_size(self.ctx, slot)
        if scratch is None:
            data = new_pages(size)
        else:
            if self._scratch[scratch].nbytes < size:  # grown with room: streams grow by a few cells a step
                self._scratch[scratch] = np.empty(size + size // 4, np.uint8)
            data = self._scratch[scratch]
        n = L.llama_state_seq_get_data(self.ctx, data.ctypes.data_as(_BYTES), data.nbytes, slot)
        return data[:n]

    def restore(self, slot: int, data: np.ndarray) -> bool:
        """Stream ``slot`` := the cells ``save`` took (at once, not at the next decode); False if they do not fit."""
        return L.llama_state_seq_set_data(self.ctx, data.ctypes.data_as(_BYTES), data.nbytes, slot) == data.nbytes

    def decode_tokens(self, tokens: list[int], start: int, slot: int, logits: bool) -> np.ndarray | None:
        """One llama_decode of ``tokens`` at positions start.. of stream ``slot`` outside any step; ``logits``: each
        token's logits row, copied (n_tokens x n_vocab)."""
        n, b = len(tokens), self._b
        b.token[:n], b.pos[:n], b.seq_id[:n], b.logits[:n] = tokens, range(start, start + n), slot, logits
        b.decode(self.ctx, n)
        if not logits:
            return None
        return np.array([np.ctypeslib.as_array(L.llama_get_logits_ith(self.ctx, k), (self.n_vocab,)) for k in range(n)])

    def trim(self, slot: int, keep: int) -> None:
        L.llama_memory_seq_rm(self.memory, slot, keep, -1)

    def clear(self, slot: int) -> None:
        L.llama_memory_seq_rm(self.memory, slot, -1, -1)

    def close(self) -> None:
        self._thread.close()
        L.llama_free(self.ctx)
        L.llama_model_free(self.model)


def compute_bytes(said: str) -> int:
    """The compute buffers llama.cpp says it allocated for a context (every device's), in bytes."""
    return int(sum(float(m) for m in re.findall(r"compute buffer size =\s*([\d.]+) MiB", said)) * (1 << 20))


def _quantization(model) -> str:
    desc = ctypes.create_string_buffer(256)
    L.llama_model_desc(model, desc, len(desc))
    # "llama 135M Q4_1" -> "Q4_1"
    return desc.value.decode(errors="replace").split()[-1] if desc.value else ""
