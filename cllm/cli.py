"""The `cllm` command."""

from __future__ import annotations

import argparse
import os
import socket
import sys
from typing import get_args

from cllm.core.config import (
    CacheType, ConfigError, DeviceSampling, FlashAttn, LogFormat, LogLevel, ReasoningFormat, ReplicaRouting, ServeConfig, SpecType, load_config,
)
from cllm.core.model_file import ModelFileError
from cllm.core.registry import build_registry, is_pool


def _serve_parser(sub) -> None:
    d = ServeConfig()
    p = sub.add_parser(
        "serve",
        help="serve a GGUF model over HTTP",
        description="Serve a GGUF model over HTTP: an engine process runs llama.cpp, a frontend process speaks HTTP.",
    )
    p.add_argument("--config", metavar="FILE", help="YAML file with any of the options below (as 'ctx-size: 4096'); the command line wins")
    p.add_argument("--host", help=f"address to listen on (default {d.host}; 0.0.0.0 for every interface)")
    p.add_argument("--port", type=int, help=f"TCP port (default {d.port}; 0 picks a free one)")
    p.add_argument("--model", metavar="PATH", help="GGUF file to serve (default: the embedded SmolLM2-135M-Instruct Q4_1)")
    p.add_argument("--ctx-size", type=int, help=f"KV cache cells in all, shared evenly by the --parallel sequences (default {d.ctx_size})")
    p.add_argument("--parallel", type=int, help=f"most sequences decoded together; more requests wait their turn (default {d.parallel})")
    p.add_argument("--threads", type=int, help="CPU threads for llama.cpp (default: one per core)")
    p.add_argument(
        "--fixed-threads", action="store_true", default=None,
        help="decode on all --threads even while other programs keep the CPUs busy (default: on as many as get CPUs, "
        "trying all again every few seconds; under flash attention the count can change output; docs/internals.md: Threads)",
    )
    p.add_argument("--batch-size", type=int, help=f"token budget of one engine step, prompt chunks included (default {d.batch_size})")
    p.add_argument(
        "--admit-per-step", type=int, metavar="N",
        help="new requests one engine step may start, besides any that waited 4 steps; 0: as many as the step's budget holds, "
        "in arrival order, up to and including one that continues a cache entry (a chat's next turn) "
        f"(docs/internals.md: Scheduling; default {d.admit_per_step})",
    )
    p.add_argument(
        "--stream-interval-ms", type=float, metavar="MS",
        help="how long a streamed token may wait for the next ones, so that one wake-up of the frontend sends a few; "
        f"0 sends every token as it comes (docs/internals.md: Streaming; default {d.stream_interval_ms:g})",
    )
    p.add_argument(
        "--no-prefix-cache", dest="prefix_cache", action="store_false", default=None,
        help="prefill every prompt in full instead of reusing the KV cells of earlier prompts that share its start",
    )
    p.add_argument(
        "--prefix-cache-exact", action="store_true", default=None,
        help="reuse only whole 128-token prompt blocks, so that the cache changes no bit of any KV cell (docs/internals.md: What is exact)",
    )
    p.add_argument(
        "--cache-slots", type=int,
        help="KV streams beyond --parallel that keep finished conversations for the prefix cache, each the size of a sequence's; "
        "without them, entries wait in idle slots and then in host RAM (--cache-ram), which takes no GPU memory (default 0)",
    )
    p.add_argument(
        "--cache-ram", type=int, metavar="MIB",
        help=f"host RAM for prefix-cache entries the KV streams have no room for, restored instead of prefilled again; 0 turns it off (default {d.cache_ram})",
    )
    p.add_argument(
        "--cache-dir", metavar="DIR",
        help="folder where prefix-cache entries are also written, so that a restarted engine finds them again (docs/internals.md: Prefix cache; default: none)",
    )
    p.add_argument(
        "--cache-dir-max", type=int, metavar="MIB",
        help=f"most MiB the --cache-dir files may take, every model's together; the least recently used go first (default {d.cache_dir_max})",
    )
    p.add_argument(
        "--slot-save-path", metavar="DIR",
        help="folder for llama-server's POST /slots/{id}?action=save|restore, files in the --cache-dir format "
        "(docs/llama-server-api.md: Slot files; default: none, and the route answers 501)",
    )
    p.add_argument(
        "--flash-attn", choices=get_args(FlashAttn),
        help=f"llama.cpp's flash attention; off is ~10%% slower here, but then the attention of a decode step does not depend on the other requests in it (docs/internals.md: What is exact; default {d.flash_attn})",
    )
    p.add_argument("--n-gpu-layers", type=int, help="layers offloaded to the GPU (default: all when llama.cpp has a GPU backend, else 0)")
    for kv in ("k", "v"):
        p.add_argument(
            f"--cache-type-{kv}", choices=get_args(CacheType),
            help=f"KV cache type of {kv.upper()}; q8_0 and q4_0 hold more sequences in the same memory"
            + (" (needs flash attention)" if kv == "v" else "") + " (default f16)",
        )
    p.add_argument(
        "--spec-type", choices=get_args(SpecType),
        help="speculative decoding: ngram drafts tokens by matching a sequence's last tokens against its own prompt and output, "
        f"and verifies them in the step's batch; none turns it off (docs/internals.md: Speculative decoding; default {d.spec_type})",
    )
    p.add_argument(
        "--device-sampling", choices=get_args(DeviceSampling),
        help="sample inside llama_decode where a request allows (no grammar, penalties, logit bias or logprobs), so only "
        f"token ids leave the device; auto: when layers are offloaded to a GPU (default {d.device_sampling})",
    )
    p.add_argument("--draft-max", type=int, help=f"most tokens one sequence drafts in a step (default {d.draft_max})")
    p.add_argument("--models-dir", metavar="DIR", help="serve every *.gguf in DIR too, by its file name without .gguf (docs/deployment.md: Several models)")
    p.add_argument("--default-model", metavar="ID", help="the model of requests that name none (default: --model, else the registry's first)")
    p.add_argument("--models-max", type=int, help="most models loaded at once; the least recently used idle one is unloaded to make room (default: no bound)")
    p.add_argument("--replicas", type=int, help="engine processes per model; they share the cores unless --threads is set (default 1)")
    p.add_argument(
        "--replica-routing", choices=get_args(ReplicaRouting),
        help="prefix: to the replica that likely caches the prompt's start, unless much busier; round-robin: to measure against (default prefix)",
    )
    p.add_argument("--keep-alive", type=float, help="seconds a model may stay idle before it is unloaded (default 0: never)")
    p.add_argument("--load-timeout", type=float, help=f"seconds a request waits for its model to load before 503 (default {d.load_timeout:g})")
    p.add_argument("--chat-template-file", metavar="FILE", help="Jinja chat template to use instead of the model file's own")
    p.add_argument(
        "--reasoning-format", choices=get_args(ReasoningFormat),
        help=f"auto: what a model writes between thinking markers (<think>...</think>) is returned apart from the answer; none: left in the text (default {d.reasoning_format})",
    )
    p.add_argument("--shutdown-timeout", type=float, help=f"seconds in-flight requests get to finish on SIGINT/SIGTERM (default {d.shutdown_timeout:g})")
    p.add_argument("--log-level", metavar="|".join(get_args(LogLevel)), help=f"least severe log records written to stderr; info logs one line per request (default {d.log_level})")
    p.add_argument("--log-format", metavar="|".join(get_args(LogFormat)), help=f"text, or json for log shippers: one object a line (default {d.log_format})")
    p.add_argument("--max-prompt-tokens", type=int, help="most tokens a prompt may have (default: what one sequence holds, ctx-size / parallel - 1)")
    p.add_argument(
        "--max-tokens", type=int,
        help="most tokens one request generates: one that names no limit, or a larger one, gets this many at most, as under llama-server's"
        " --n-predict (default: what its sequence holds)",
    )
    p.add_argument("--max-body-bytes", type=int, help=f"largest request body; larger ones get 413 (default {d.max_body_bytes})")
    p.add_argument("--max-waiting", type=int, help=f"requests that may wait beyond --parallel; more get 429 (default {d.max_waiting})")
    p.add_argument("--request-timeout", type=float, help=f"seconds a request may take before it is cancelled with 408; 0 for none (default {d.request_timeout:g})")
    p.add_argument(
        "--ray", metavar="ADDRESS|local",
        help="deploy on a Ray cluster as a Ray Serve application, --replicas Ray replicas of one engine each ('local' starts a cluster here and"
        " stops it on exit; needs the ray extra; --host/--port are Serve's HTTP proxy's; docs/deployment.md: Ray Serve)",
    )
    p.add_argument(
        "--allowed-hosts", type=_names, metavar="NAME[,NAME...]",
        help="on a loopback --host, Host names answered besides loopback addresses, localhost and this machine's name; "
        "others get 403, so that a web page cannot reach the server through a DNS name it controls (docs/operations.md: Security)",
    )
    p.add_argument(
        "--allowed-origins", type=_names, metavar="ORIGIN[,ORIGIN...]",
        help="web pages (as https://app.example:8443) whose scripts may call the API from a browser (CORS); default: none",
    )
    p.add_argument(
        "--api-key",
        metavar="KEY",
        default=os.environ.get("CLLM_API_KEY") or None,
        help="require 'Authorization: Bearer KEY' on every route but /health (default: $CLLM_API_KEY; "
        "prefer the variable, a command line is visible to every user)",
    )


def _names(value: str) -> list[str]:
    return [name.strip() for name in value.split(",") if name.strip()]


def _bench_parser(sub) -> None:
    p = sub.add_parser(
        "bench",
        help="benchmarks: the engine in-process, or HTTP load on a server",
        description="Benchmarks (cllm.bench; 'cllm bench engine --help' and 'cllm bench http --help' list their options).",
    )
    p.add_argument("target", choices=["engine", "http"], help="engine: the step loop in-process, no HTTP; http: load on a server's URL")
    p.add_argument("args", nargs=argparse.REMAINDER, help="the benchmark's own options")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="cllm", description="cllm: llama.cpp behind an HTTP API")
    sub = parser.add_subparsers(dest="command", required=True)
    _serve_parser(sub)
    _bench_parser(sub)
    args = parser.parse_args(argv)

    if args.command == "bench":
        if args.target == "engine":
            from cllm.bench import engine_bench as bench
        else:
            from cllm.bench import http_load as bench
        return bench.main(args.args, prog=f"cllm bench {args.target}")

    if args.command == "serve":
        overrides = {k: v for k, v in vars(args).items() if k not in ("command", "config", "ray")}
        try:
            config = load_config(args.config, overrides)
            models = build_registry(config)
        except (ConfigError, ModelFileError) as e:
            print(f"cllm: {e}", file=sys.stderr)
            return 2
        if args.ray is not None:
            return _serve_ray(config, args.ray)
        from cllm.supervisor import Supervisor

        return Supervisor(config, models, pool=is_pool(config)).run()
    return 2


def _serve_ray(config: ServeConfig, address: str) -> int:
    try:
        from cllm.ray_serve import run
    except ImportError as e:
        print(f"cllm: --ray needs Ray Serve: pip install 'cllm[ray]' ({e})", file=sys.stderr)
        return 2
    if config.port == 0:  # Serve's proxy takes a fixed port: pick a free one for it
        with socket.create_server((config.host, 0)) as s:
            config.port = s.getsockname()[1]
    try:
        return run(config, address)
    except ConfigError as e:
        print(f"cllm: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
