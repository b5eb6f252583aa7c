"""Every message that crosses the frontend/engine boundary.

Structs are array-like (encoded as msgpack arrays, no field names) and
untracked by the garbage collector: small to encode, cheap to decode.
"""

from __future__ import annotations

import msgspec

from cllm.core.registry import ModelSpec


class SamplingParams(msgspec.Struct, array_like=True, omit_defaults=True, gc=False):
    max_tokens: int = 100
    temperature: float = 0.7  # 0 means greedy
    top_p: float = 0.9
    top_k: int = 40  # 0 disables
    min_p: float = 0.0
    repetition_penalty: float = 1.0
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    seed: int | None = None  # None: a random seed
    ignore_eos: bool = False
    logit_bias: dict[int, float] | None = None  # token id -> added to its logit
    grammar: str | None = None  # GBNF (start symbol "root") the output must match
    # Lazy grammar: None applies it from the first token; else regexes over the text generated so far,
    # and the grammar applies from the first match on (from its first capturing group), as llama-server's
    # tool calls under tool_choice auto.
    grammar_triggers: list[str] | None = None
    logprobs: int | None = None  # None: no logprobs; n: the chosen token's and the n likeliest
    # None: none; n: each prompt token's after the first, and the n likeliest there. Scored
    # tokens are prefilled afresh (not taken from the prefix cache), and max_tokens may be 0.
    prompt_logprobs: int | None = None
    speculative: bool = True  # False: this request decodes one token a step even when the engine drafts
    # LoRA adapters it decodes under: (adapter id, scale) pairs, as the frontend resolved them from the request and
    # the model's scales (engine_proc/run/lora.py). None: none.
    lora: list[tuple[int, float]] | None = None


# ---- frontend -> engine ------------------------------------------------------


class ImageInput(msgspec.Struct, array_like=True, gc=False):
    """One image of a prompt: its file's bytes, which the frontend checked with cllm.core.images.check, and where it
    goes: its positions come before prompt[at] (at == len(prompt): after the last token)."""

    at: int
    data: bytes
    width: int = 0  # its size as its header gives it (cllm.core.images.check): what sizes it for some projectors
    height: int = 0


class Submit(msgspec.Struct, tag=1, array_like=True, gc=False):
    id: int
    prompt: list[int]
    sampling: SamplingParams
    # The frontend reads every step's token (a stream, stop strings); else only the
    # first and the last wake it, and the tokens between wait in the ring for them.
    per_step: bool = True
    images: list[ImageInput] = []  # in prompt order; only to an engine whose ModelInfo.image_tokens > 0
    # Whose earlier answers may draft for it, and whose its answer may draft for: a hash of the client's API key
    # (frontend_proc/http/guard.py; 0 without one), so one client's text never steers another's drafts.
    scope: int = 0


class Abort(msgspec.Struct, tag=2, array_like=True, gc=False):
    ids: list[int]


class Hello(msgspec.Struct, tag=3, array_like=True, gc=False):
    """A frontend starts a session: the engine drops every sequence it has and
    answers EngineReady(session). Records before the first Hello are stale
    (left by a frontend or engine that died) and are skipped."""

    session: int


class Embed(msgspec.Struct, tag=4, array_like=True, gc=False):
    """Embed each input (token ids; the frontend checked their count and length), or with ``rank`` score each
    (a rerank prompt: query and document) through the model's classification head."""

    id: int
    inputs: list[list[int]]
    rank: bool = False


class SlotAction(msgspec.Struct, tag=5, array_like=True, gc=False):
    """llama-server's /slots/{id}?action=...: save a KV stream's cache entry to ``path``, restore one from it, or erase
    it.
    Answered with SlotDone once the stream runs no sequence."""

    id: int
    slot: int  # the engine's KV stream, 0..parallel-1
    action: str  # save, restore or erase
    path: str = ""  # the file (save, restore): the frontend checked its name


class LoraLoad(msgspec.Struct, tag=6, array_like=True, gc=False):
    """Load an adapter file at run time as adapter ``adapter`` (--allow-lora-load; the frontend checked the path
    is a file of --lora-dir), or with ``unload`` free it: the sequences under it end with finish="error". LoraDone
    answers."""

    id: int
    adapter: int
    path: str = ""
    unload: bool = False


ToEngine = Submit | Abort | Hello | Embed | SlotAction | LoraLoad


# ---- engine -> frontend ------------------------------------------------------


class ImageGrid(msgspec.Struct, frozen=True, gc=False):
    """How a projector that takes images at about their own size sizes one (cllm/core/image_grid.py counts)."""

    align: int  # pixels on a side of one image token: each side is rounded to a multiple of it
    min_pixels: int  # the area an image is scaled up or down into
    max_pixels: int


class ModelInfo(msgspec.Struct, gc=False):
    """Also the body of GET /model/info: two fields go by their public names."""

    model_path: str
    model_name: str
    model_family: str
    quantization: str
    vocab_size: int
    num_layers: int
    n_params: int
    model_bytes: int  # size of the weights
    n_ctx_train: int
    ctx_size: int  # KV cells of the running sequences
    kv_bytes: int  # memory the KV cache reserves: the prefix cache's slots and a GPU's scratch stream included
    seq_ctx: int = msgspec.field(name="max_sequence_length")  # KV cells one sequence may use
    parallel: int
    batch_size: int
    threads: int = msgspec.field(name="num_threads")
    gpu_layers: int  # layers offloaded to the GPU
    use_mmap: bool
    cache_slots: int = 0  # KV streams of seq_ctx cells beyond parallel, for the prefix cache
    cache_type_k: str = "f16"
    cache_type_v: str = "f16"
    compute_bytes: int = 0  # llama.cpp's compute buffers for the context, as it reports them (on the GPU with layers)
    embedding_dim: int = 0  # length of an /v1/embeddings vector
    max_embedding_tokens: int = 0  # most tokens of one embeddings input: what one embeddings decode holds
    rerank: bool = False  # the engine scores rerank prompts (--rerank): its model has a classification head
    spec_type: str = "none"  # speculative decoding: none, or --spec-type's kinds (ngram, draft-simple), comma-separated
    draft_max: int = 0  # most tokens a sequence drafts in a step
    mmproj: str = ""  # the projector's file: the engine takes images
    # Prompt tokens (KV cells) one image takes, its projector's begin/end text included; with an image_grid, those
    # of the begin/end text, the grid's tokens for the image's size added to them (cllm/core/image_grid.py).
    image_tokens: int = 0
    image_grid: ImageGrid | None = None  # a projector that sizes each image (Qwen2-VL's): its grid


class EngineReady(msgspec.Struct, tag=1, array_like=True, gc=False):
    info: ModelInfo
    session: int  # the Hello it answers: an older session's answer is stale
    generation: int  # engine restarts before this one


class TokenLogprobs(msgspec.Struct, array_like=True, gc=False):
    """Log-probabilities of one sampled token under the model (raw logits, before sampling)."""

    logprob: float  # the sampled token's
    top_ids: list[int]  # the likeliest tokens, likeliest first
    top_logprobs: list[float]


class SeqOutput(msgspec.Struct, array_like=True, omit_defaults=True, gc=False):
    id: int
    token: int | None = None  # None when the step ended the sequence without text (EOS)
    # "stop" or "length" once the sequence is done; "error" when the engine
    # gave up on it: a grammar llama.cpp cannot parse, or one that allows no next token
    finish: str | None = None
    logprobs: TokenLogprobs | None = None  # only for sequences that ask
    prompt_logprobs: list[TokenLogprobs] | None = None  # with the first output of a sequence that asks
    cached_tokens: int = 0  # with a sequence's first output: its prompt tokens the prefix cache served
    error: str = ""  # with finish "error": why, for the client (empty: its grammar allowed no next token)
    # With a sequence's last output: its speculative tokens drafted and accepted (llama-server's draft_n and
    # draft_n_accepted).
    drafted: int = 0
    accepted: int = 0


class StepOutputs(msgspec.Struct, tag=2, array_like=True, gc=False):
    """Everything one engine step produced: one ring record per step."""

    outputs: list[SeqOutput]


class PrefixCacheStats(msgspec.Struct, array_like=True, gc=False):
    """The prefix cache's counts since the engine started, and the cells it holds now."""

    hits: int = 0  # admissions that reused cached KV cells
    misses: int = 0  # admissions that found nothing to reuse (none while the cache is off)
    hit_tokens: int = 0  # prompt tokens not prefilled thanks to the cache
    cells: int = 0  # KV cells held by cache entries
    restored: int = 0  # hits served from host RAM (--cache-ram)
    host_cells: int = 0  # KV cells held in host RAM
    host_bytes: int = 0
    disk_hits: int = 0  # hits served from files (--cache-dir)
    disk_entries: int = 0  # entries in files now
    disk_bytes: int = 0  # their cells' bytes
    disk_load_seconds: float = 0.0  # spent reading files for hits
    disk_rejected: int = 0  # files dropped as damaged or not of this format: their cells never used


class EngineStats(msgspec.Struct, tag=3, array_like=True, gc=False):
    """The engine's figures: sent when it goes idle and at most once a second while busy."""

    running: int
    waiting: int
    kv_used: int  # KV cells held by running sequences
    steps: int
    generated_tokens: int
    # One entry per step since the previous EngineStats: its duration and its
    # number of sequences (a few dozen numbers a second, never per token).
    step_seconds: list[float] = []
    batch_sizes: list[int] = []
    prefix_cache: PrefixCacheStats = msgspec.field(default_factory=PrefixCacheStats)
    # Speculative decoding since the engine started: tokens drafted, and those the sampler agreed with.
    drafted_tokens: int = 0
    accepted_tokens: int = 0
    drafts: int = 0  # drafts verified: one a sequence a step that drafted (llama-server's spec_decode_num_drafts)
    # Per step that verified drafts, since the previous EngineStats: its drafted and accepted tokens.
    step_drafted: list[int] = []
    step_accepted: list[int] = []
    threads: int = 0  # llama.cpp threads decoding now: fewer than set while other programs take the CPUs
    # Since the engine started: llama_decode calls of decoding sequences' tokens, and those of them that reused
    # the call before's compute graph (llama.cpp does when the batch keeps its shape; docs/internals.md).
    decode_steps: int = 0
    reused_steps: int = 0


class Embeddings(msgspec.Struct, tag=4, array_like=True, gc=False):
    """Vectors of an Embed's inputs [first, first + k), L2-normalised: k x dim float32s in native
    byte order (bytes keep msgspec cheap); a rank Embed's scores, k float32s. A request's come in order, over one
    step or several."""

    id: int
    first: int
    vectors: bytes
    error: str = ""  # set: the engine cannot embed (no vectors follow), and the request fails with it


class SlotDone(msgspec.Struct, tag=5, array_like=True, gc=False):
    """A SlotAction's answer: the tokens saved, restored or erased, the file's bytes, the milliseconds it took."""

    id: int
    n_tokens: int = 0
    n_bytes: int = 0
    ms: float = 0.0
    status: int = 200  # else the HTTP status of ``error``
    error: str = ""


class LoraDone(msgspec.Struct, tag=6, array_like=True, gc=False):
    """A LoraLoad's answer: ``error`` empty, or why llama.cpp refused the file."""

    id: int
    error: str = ""


FromEngine = EngineReady | StepOutputs | EngineStats | Embeddings | SlotDone | LoraDone


# ---- supervisor -> frontend (one JSON line each, on the frontend's lifeline) --


class EngineExited(msgspec.Struct, tag="exited"):
    """The engine of this generation died (or was stopped); restarting: the supervisor starts the next."""

    generation: int
    model: str = ""
    replica: int = 0
    restarting: bool = True
    reason: str = ""  # why it is not restarted: unloaded, could not load its model, crash loop


class PullProgress(msgspec.Struct, tag="progress"):
    """Bytes of one file of a pull the frontend asked for (at most every 0.1 s a file)."""

    name: str  # as the frontend asked for it
    path: str  # the file in the repo
    digest: str  # its sha256
    total: int
    completed: int


class PullEnded(msgspec.Struct, tag="pulled"):
    """A pull ended: the registry's name of the model, or why it failed; with --pulled the model's spec and the
    spare rings it joined on."""

    name: str
    model: str = ""
    error: str = ""
    spec: ModelSpec | None = None
    spare: int = -1


class DeleteEnded(msgspec.Struct, tag="deleted"):
    """A deletion ended; error: why not, missing: the cache had no such model."""

    name: str
    error: str = ""
    missing: bool = False


Notice = EngineExited | PullProgress | PullEnded | DeleteEnded


# ---- frontend -> supervisor (one JSON line each, on the frontend's control pipe)


class LoadModel(msgspec.Struct, tag="load"):
    """Start every replica of a registry model; the frontend has said Hello on their rings."""

    model: str


class UnloadModel(msgspec.Struct, tag="unload"):
    """Stop a model's engines; the frontend gets EngineExited(restarting=False) for each. A model put to sleep
    (--sleep-idle-seconds) carries what its engines said: the supervisor hands it to a frontend started while the
    model sleeps, whose /props and /slots answer with it rather than wake the model."""

    model: str
    asleep: ModelInfo | None = None


class PullModel(msgspec.Struct, tag="pull"):
    """Pull `org/repo[:QUANT]` into the Hugging Face cache (the supervisor runs `cllm pull`'s code); with --pulled the
    model joins the registry. PullProgress and PullEnded answer."""

    name: str


class DeleteModel(msgspec.Struct, tag="delete"):
    """Remove a pulled model from the registry (its engines are gone: the frontend unloaded it first) and from the
    cache. DeleteEnded answers."""

    name: str


Control = LoadModel | UnloadModel | PullModel | DeleteModel
