"""`cllm serve` settings: defaults, a YAML file, then the command line."""

from __future__ import annotations

import os
from typing import Annotated, Literal

import msgspec
from msgspec import Meta


LogLevel = Literal["debug", "info", "warning", "error"]
LogFormat = Literal["text", "json"]
FlashAttn = Literal["auto", "on", "off"]
ReasoningFormat = Literal["auto", "none"]
MAX_DRAFT = 256  # tokens one sequence may draft in a step
MAX_STREAMS = 256  # llama.cpp's most sequences (LLAMA_MAX_SEQ); one is the prefix cache's scratch
CacheType = Literal["f32", "f16", "q8_0", "q4_0"]  # quantized caches hold more sequences in the same memory
DeviceSampling = Literal["auto", "on", "off"]  # auto: on with GPU layers (engine_proc/sampler.py)
SpecType = Literal["none", "ngram"]  # llama-server's --spec-type names; ngram: prompt lookup (engine_proc/drafter.py)
ReplicaRouting = Literal["prefix", "round-robin"]  # round-robin: the baseline prefix routing is measured against


class ModelEntry(msgspec.Struct, kw_only=True, forbid_unknown_fields=True, rename="kebab"):
    """One model of the `models:` list; unset engine settings take the top-level ones."""

    id: Annotated[str, Meta(pattern=r"^[A-Za-z0-9][A-Za-z0-9._:-]*$", max_length=128)]
    path: str
    aliases: list[str] = []
    ctx_size: Annotated[int, Meta(ge=64)] | None = None
    parallel: Annotated[int, Meta(ge=1, le=MAX_STREAMS - 1)] | None = None
    threads: Annotated[int, Meta(ge=0)] | None = None
    batch_size: Annotated[int, Meta(ge=1)] | None = None
    admit_per_step: Annotated[int, Meta(ge=0)] | None = None
    flash_attn: FlashAttn | None = None
    prefix_cache: bool | None = None
    cache_ram: Annotated[int, Meta(ge=0)] | None = None
    n_gpu_layers: Annotated[int, Meta(ge=0)] | None = None
    cache_type_k: CacheType | None = None
    cache_type_v: CacheType | None = None
    spec_type: SpecType | None = None
    draft_max: Annotated[int, Meta(ge=1, le=MAX_DRAFT)] | None = None
    replicas: Annotated[int, Meta(ge=1, le=64)] | None = None
    keep_alive: Annotated[float, Meta(ge=0)] | None = None


class ServeConfig(msgspec.Struct, kw_only=True, forbid_unknown_fields=True, rename="kebab"):
    host: str = "127.0.0.1"
    port: Annotated[int, Meta(ge=0, le=65535)] = 8080
    model: str | None = None  # None: the embedded SmolLM2-135M-Instruct
    ctx_size: Annotated[int, Meta(ge=64)] = 8192
    parallel: Annotated[int, Meta(ge=1, le=MAX_STREAMS - 1)] = 8
    threads: Annotated[int, Meta(ge=0)] = 0  # 0: one per CPU core
    # Decode on all threads even while other programs take the CPUs (default: on as many as get CPUs; engine_proc/threads.py).
    fixed_threads: bool = False
    batch_size: Annotated[int, Meta(ge=1)] = 512
    # New requests a step may start (and any that waited 4 steps); 0: as many as its token budget holds, in
    # arrival order up to and including one that continues a cache entry, so conversations drift apart (docs/internals.md: Scheduling).
    admit_per_step: Annotated[int, Meta(ge=0)] = 0
    shutdown_timeout: Annotated[float, Meta(ge=0)] = 10.0
    # A stream's tokens may wait in the engine's ring this long (ms) for the
    # ones after them, so that one wake-up of the frontend sends a few; 0: every token at once.
    stream_interval_ms: Annotated[float, Meta(ge=0, le=1000)] = 50.0
    prefix_cache: bool = True  # reuse the KV cells of earlier prompts that share a prefix
    # Reuse only whole prompt blocks, prefilled at fixed positions: with the
    # cache on, every cell is then the same bits as with it off.
    prefix_cache_exact: bool = False
    # KV streams beyond --parallel that keep finished sequences' cells for the cache, each as large as a
    # sequence's. By default none: entries wait in idle slots, then in host RAM (--cache-ram), which holds
    # only the cells they have and takes no GPU memory (perf/results/2026-11-26-memory.md).
    cache_slots: Annotated[int, Meta(ge=0, le=255)] = 0
    # MiB of host RAM for the cache's entries the streams have no room for; 0: none.
    cache_ram: Annotated[int, Meta(ge=0)] = 8192
    # A folder where the cache's entries also go, so that they outlive the engine (restarts, unloads); None: none.
    cache_dir: str | None = None
    cache_dir_max: Annotated[int, Meta(ge=1)] = 4096  # MiB the folder's files may take, all models together
    # llama-server's POST /slots/{id}?action=save|restore|erase: the folder its named files go in; None: refused (501).
    slot_save_path: str | None = None
    # llama.cpp's flash attention: faster, but then a decode step's logits
    # depend on the other sequences in the step (see docs/internals.md, "What is exact").
    flash_attn: FlashAttn = "auto"
    # Layers offloaded to the GPU; None: all of them when llama.cpp has a GPU backend, else 0.
    n_gpu_layers: Annotated[int, Meta(ge=0)] | None = None
    cache_type_k: CacheType = "f16"
    cache_type_v: CacheType = "f16"  # quantized V needs flash attention (llama.cpp's rule)
    # Sampling inside llama_decode (llama.cpp's backend samplers) where a request's chain allows; auto: with GPU layers.
    # Off: on an H100 the per-sequence device chains made a step slower than host sampling (perf/results/2026-11-26-gpu-h100.md).
    device_sampling: DeviceSampling = "off"
    # Speculative decoding: tokens drafted from the sequence's own text, verified in the step's batch.
    spec_type: SpecType = "none"  # on loses at 8 copy-type streams here: perf/results/2026-11-23-speculative.md
    draft_max: Annotated[int, Meta(ge=1, le=MAX_DRAFT)] = 64  # most tokens one sequence drafts in a step
    # Several models (see cllm/core/registry.py): a directory of GGUF files and/or a list.
    models_dir: str | None = None
    models: list[ModelEntry] = []
    default_model: str | None = None  # an id; default: --model, else the first of the registry
    models_max: Annotated[int, Meta(ge=0)] = 0  # models loaded at once; 0: no bound
    replicas: Annotated[int, Meta(ge=1, le=64)] = 1  # engines per model
    replica_routing: ReplicaRouting = "prefix"
    keep_alive: Annotated[float, Meta(ge=0)] = 0.0  # seconds idle before a model is unloaded; 0: never
    load_timeout: Annotated[float, Meta(gt=0)] = 120.0  # a request waits this long for its model to load
    # Chat: a Jinja template instead of the model file's; thinking split from the answer (auto) or left in it (none).
    chat_template_file: str | None = None
    reasoning_format: ReasoningFormat = "auto"
    log_level: LogLevel = "info"
    log_format: LogFormat = "text"
    # Requests: what each may ask and how long it may take, how many may wait.
    max_prompt_tokens: Annotated[int, Meta(ge=0)] = 0  # 0: what one sequence holds
    max_tokens: Annotated[int, Meta(ge=0)] = 0  # most tokens one request generates; 0: what its sequence holds
    max_body_bytes: Annotated[int, Meta(ge=1024)] = 1 << 20
    max_waiting: Annotated[int, Meta(ge=0)] = 256  # requests beyond --parallel; past that, 429
    request_timeout: Annotated[float, Meta(ge=0)] = 600.0  # seconds; 0: none
    # Every route but /health wants "Authorization: Bearer <key>". The frontend
    # gets it in its environment, never in argv (which `ps` shows).
    api_key: Annotated[str, Meta(min_length=1)] | None = None
    # Browsers: on a loopback --host, a request whose Host names neither a loopback address, localhost nor
    # this machine is refused (DNS rebinding, frontend_proc/http/guard.py); these names are let in too.
    allowed_hosts: list[Annotated[str, Meta(pattern=r"^[A-Za-z0-9._-]+$")]] = []
    # Web pages and apps (scheme://host[:port], as https://app.example or app://obsidian.md) whose scripts may call the API (CORS).
    allowed_origins: list[Annotated[str, Meta(pattern=r"^[A-Za-z][A-Za-z0-9+.-]*://[^/\s]+$")]] = []

    @property
    def n_threads(self) -> int:
        return self.threads or os.cpu_count() or 1

    @property
    def kv_streams(self) -> int:
        """KV streams the engine keeps: one per running sequence, and the cache's slots."""
        if not self.prefix_cache:
            return self.parallel
        return min(self.parallel + self.cache_slots, MAX_STREAMS - 1)  # and the scratch stream

    @property
    def kv_cells(self) -> int:
        """KV cells the engine allocates: a sequence's share for every stream and one scratch stream."""
        return self.ctx_size // self.parallel * (self.kv_streams + self.prefix_cache)


class ConfigError(ValueError):
    pass


def load_config(path: str | None, overrides: dict) -> ServeConfig:
    """Merge a YAML file (keys as on the command line) with command-line values."""
    values: dict = {}
    if path is not None:
        try:
            with open(path, "rb") as f:
                values = msgspec.yaml.decode(f.read()) or {}
        except OSError as e:
            raise ConfigError(f"cannot read config file {path}: {e.strerror}") from None
        except msgspec.DecodeError as e:
            raise ConfigError(f"config file {path} is not valid YAML: {e}") from None
        if not isinstance(values, dict):
            raise ConfigError(f"config file {path} must hold a mapping of option: value")
    values.update({k.replace("_", "-"): v for k, v in overrides.items() if v is not None})
    try:
        config = msgspec.convert(values, ServeConfig)
    except msgspec.ValidationError as e:
        raise ConfigError(f"invalid setting: {e}") from None
    check_engine(config, "")
    if config.cache_dir is not None:
        config.cache_dir = os.path.abspath(config.cache_dir)  # the engines find it wherever they run
    if config.slot_save_path is not None:
        config.slot_save_path = os.path.abspath(config.slot_save_path)
    if config.chat_template_file is not None:
        if not os.path.isfile(config.chat_template_file):
            raise ConfigError(f"--chat-template-file {config.chat_template_file}: no such file")
        config.chat_template_file = os.path.abspath(config.chat_template_file)  # the frontend reads it
    return config


def check_engine(config: ServeConfig, where: str) -> None:
    """Settings llama.cpp would refuse, said before any engine starts (``where``: which model)."""
    opt = "" if where else "--"
    if config.ctx_size < config.parallel * 16:
        raise ConfigError(f"{where}{opt}ctx-size {config.ctx_size} leaves under 16 KV cells for each of {opt}parallel {config.parallel} sequences")
    if config.cache_type_v not in ("f16", "f32") and config.flash_attn == "off":
        raise ConfigError(f"{where}cache-type-v {config.cache_type_v} needs flash attention (llama.cpp quantizes V only with it)")
