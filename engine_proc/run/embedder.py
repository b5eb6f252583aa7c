"""Embeddings and rerank scores in the engine's step loop, from the model already loaded.

A second llama_context on the same llama_model, with embeddings on and the
GGUF's pooling (mean when it names none), shares the weights: it adds only
its own small KV cache and compute buffers (~26 MiB for the embedded model),
made on the first embeddings request, so that a server that never embeds
never holds them (on a GPU, they are its memory). Each engine step, after the
generation decodes, packs whole inputs into what is left of the step's token
budget (one input at least, so a full budget never starves them) and decodes
them together, one sequence each, from an empty cache. A big batch of inputs
thus delays running generations by at most one step's budget at a time.

With --rerank (--pooling rank) a third context, pooled as `rank`, scores
(query, document) prompts through the model's classification head
(llama.cpp's `cls`/`cls.output` tensors): the same queue, the same packing,
the same budget. A step decodes inputs of one kind, the oldest request's, so
a rerank batch delays generation exactly as an embeddings batch does.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterator
from dataclasses import dataclass

import llama_cpp as L
import numpy as np

from cllm.core.gguf_meta import tensor_names
from cllm.core.model_meta import meta
from cllm.core.protocol import Embed, Embeddings
from engine_proc.run.batch import Batch
from engine_proc.run.model_runner import ModelLoadError, ModelRunner

MAX_SEQS = 64  # most inputs in one decode
POOLINGS = (L.LLAMA_POOLING_TYPE_MEAN, L.LLAMA_POOLING_TYPE_CLS, L.LLAMA_POOLING_TYPE_LAST)
NO_CONTEXT = "llama.cpp could not create the embeddings context (out of memory?)"
NO_RANK = "this model serves no rerank: the server was started without --rerank"
HEADS = ("cls.weight", "cls.output.weight")  # llama.cpp's classification head (either is one)


@dataclass(slots=True)
class Job:
    id: int
    inputs: list[list[int]]
    rank: bool  # rerank prompts, scored; else inputs, embedded
    next: int = 0  # the first input not embedded yet


def check_rank_head(model_path: str) -> None:
    """ModelLoadError, in a sentence, where the model has no classification head to score with."""
    if not any(name in HEADS for name in tensor_names(model_path)):
        raise ModelLoadError(
            f"{model_path} has no classification head (no cls or cls.output tensor), so it cannot rerank: "
            "--rerank (--pooling rank) needs a reranker GGUF such as bge-reranker or Qwen3-Reranker"
        )


class Embedder:
    def __init__(self, runner: ModelRunner, rank: bool = False):
        model = runner.model
        pooling = int(meta(model, f"{meta(model, 'general.architecture')}.pooling_type") or 0)
        self.rank = rank  # rerank prompts are served
        self.max_tokens = min(runner.token_budget, L.llama_model_n_ctx_train(model))  # one input fits one decode
        self.max_seqs = min(MAX_SEQS, self.max_tokens)
        self.dim = L.llama_model_n_embd(model)
        self.jobs: deque[Job] = deque()
        self._runner = runner
        self._pooling = pooling if pooling in POOLINGS else L.LLAMA_POOLING_TYPE_MEAN
        self.ctx = None  # made by the first step: see the module's docstring
        self.rank_ctx = None  # likewise, by the first rerank step
        self._b: Batch | None = None
        self._positions = np.arange(self.max_tokens, dtype=np.int32)

    def _open(self, rank: bool):
        """The context of a kind, made if need be; None if llama.cpp cannot (out of memory): the waiting requests
        of that kind then fail."""
        ctx = self.rank_ctx if rank else self.ctx
        if ctx is not None:
            return ctx
        cparams = L.llama_context_default_params()
        cparams.embeddings = True
        cparams.pooling_type = L.LLAMA_POOLING_TYPE_RANK if rank else self._pooling
        # Every input of a decode in one ubatch: llama.cpp pools a sequence within its ubatch.
        cparams.n_ctx = cparams.n_batch = cparams.n_ubatch = self.max_tokens
        cparams.n_seq_max = self.max_seqs
        cparams.kv_unified = True
        # Without flash attention a vector does not depend on the other inputs of its decode
        # (with it, cosine 0.9999 to the input alone): an input gives the same vector in any batch.
        cparams.flash_attn_type = L.LLAMA_FLASH_ATTN_TYPE_DISABLED
        cparams.no_perf = True
        ctx = self._runner.new_context(cparams)
        if ctx is None:
            return None
        if rank:
            self.rank_ctx = ctx
        else:
            self.ctx = ctx
        if self._b is None:
            self._b = Batch(self.max_tokens)
        return ctx

    def add(self, msg: Embed) -> None:
        self.jobs.append(Job(msg.id, msg.inputs, msg.rank))

    def abort(self, ids: set[int]) -> None:
        if any(job.id in ids for job in self.jobs):
            self.jobs = deque(job for job in self.jobs if job.id not in ids)

    def _pending(self, rank: bool) -> Iterator[tuple[Job, int]]:
        for job in self.jobs:
            if job.rank == rank:
                for i in range(job.next, len(job.inputs)):
                    yield job, i

    def step(self, budget: int) -> list[Embeddings]:
        """One decode of the oldest inputs of the oldest request's kind that fit ``budget`` tokens; their vectors
        (or scores), a message per request."""
        rank = self.jobs[0].rank
        error = NO_RANK if rank and not self.rank else ""
        ctx = None if error else self._open(rank)
        if ctx is None:
            failed = [job for job in self.jobs if job.rank == rank]
            self.jobs = deque(job for job in self.jobs if job.rank != rank)
            return [Embeddings(job.id, job.next, b"", error or NO_CONTEXT) for job in failed]
        b = self._b
        assert b is not None  # made with the context
        n = n_seqs = 0
        runs: list[list] = []  # [job, first input, inputs] in the decode, in order
        for job, i in self._pending(rank):
            k = len(job.inputs[i])
            if n_seqs and (n + k > budget or n_seqs == self.max_seqs):
                break
            b.token[n : n + k] = job.inputs[i]
            b.pos[n : n + k] = self._positions[:k]
            b.seq_id[n : n + k] = n_seqs
            b.logits[n : n + k] = 1  # pooling reads every token's output
            if runs and runs[-1][0] is job:
                runs[-1][2] += 1
            else:
                runs.append([job, i, 1])
            job.next = i + 1
            n += k
            n_seqs += 1
        b.decode(ctx, n)
        vectors = self._rank_scores(ctx, n_seqs) if rank else self._vectors(ctx, n_seqs)
        L.llama_memory_clear(L.llama_get_memory(ctx), True)
        out, s = [], 0
        for job, first, count in runs:
            out.append(Embeddings(job.id, first, vectors[s : s + count].tobytes()))
            s += count
        if any(job.next == len(job.inputs) for job in self.jobs):
            self.jobs = deque(job for job in self.jobs if job.next < len(job.inputs))
        return out

    def _vectors(self, ctx, n_seqs: int) -> np.ndarray:
        vectors = np.empty((n_seqs, self.dim), np.float32)
        for s in range(n_seqs):
            vectors[s] = np.ctypeslib.as_array(L.llama_get_embeddings_seq(ctx, s), (self.dim,))
        vectors /= np.maximum(np.linalg.norm(vectors, axis=1, keepdims=True), 1e-12)
        return vectors

    @staticmethod
    def _rank_scores(ctx, n_seqs: int) -> np.ndarray:
        """The head's first output of each prompt, as llama-server's score (Qwen3's: P(yes), after a softmax)."""
        return np.array([L.llama_get_embeddings_seq(ctx, s)[0] for s in range(n_seqs)], np.float32)

    def close(self) -> None:
        for ctx in (self.ctx, self.rank_ctx):
            if ctx is not None:
                L.llama_free(ctx)
