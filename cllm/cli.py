"""The `cllm` command."""

from __future__ import annotations

import argparse
import importlib
import os
import socket
import sys
from typing import Annotated, Any

import msgspec

from cllm.core.config import GROUPS, LISTEN, PROCESS, ServeConfig
from cllm.core.config_load import load_config
from cllm.core.model_file import ModelFileError
from cllm.core.registry import asks_hub, build_registry, is_pool
from cllm.core.settings import ConfigError, Setting, default_words, meaning, names, plain, setting, settings


class ServeCommand(msgspec.Struct, kw_only=True):
    """`cllm serve`'s own options: where its settings come from and where it runs (no variable, no file key)."""

    # fmt: off
    config: Annotated[str | None, setting(
        "YAML file with any of the settings here (`ctx-size: 4096`); the environment's CLLM_ variables and then the "
        "command line win over it", LISTEN, metavar="FILE",
    )] = None
    ray: Annotated[str | None, setting(
        "run as a Ray Serve application on that Ray cluster, `--replicas` Ray replicas of one engine each (`local` "
        "starts one here and stops it on exit; needs the `ray` extra; `--host`/`--port` are then Serve's HTTP "
        "proxy's; docs/deployment.md: Ray Serve)", PROCESS, metavar="ADDRESS|local",
    )] = None
    # fmt: on


def serve_settings() -> list[Setting]:
    """`cllm serve`'s options and settings, by group (the order of --help and docs/configuration.md)."""
    every = settings(ServeCommand) + settings(ServeConfig)
    return [s for group in GROUPS for s in every if s.group == group]


def _add_setting(group: argparse._ArgumentGroup, s: Setting) -> None:
    """One setting as an option; its value stays None unless given, so that the file and environment show through."""
    default = default_words(s)
    text = plain(meaning(s)) + (f" (default: {plain(default)})" if default else "")
    if s.env is not None:
        text += f" [${s.env}]"
    kwargs: dict[str, Any] = {"dest": s.attr, "default": None, "help": text.replace("%", "%%")}
    if s.kind is bool:
        kwargs["action"] = argparse.BooleanOptionalAction
    else:
        # Choices are checked with the rest of the settings: a bad one is one line that names it.
        kwargs["metavar"] = s.metavar or ("|".join(s.kind) if isinstance(s.kind, tuple) else None)
        kwargs["type"] = names if s.kind is list else s.kind if s.kind in (int, float) else str
    group.add_argument(*s.options, **kwargs)


def _serve_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "serve",
        help="serve a GGUF model over HTTP",
        description="Serve a GGUF model over HTTP: an engine process runs llama.cpp, a frontend process speaks HTTP. "
        "Each setting also comes from its environment variable [$CLLM_...] or the --config file; the command line "
        "wins, then the environment, then the file (docs/configuration.md).",
    )
    groups = {title: p.add_argument_group(title) for title in GROUPS}
    for s in serve_settings():
        if s.options:
            _add_setting(groups[s.group], s)
    # llama-server's name for --no-mmproj-auto
    groups[LISTEN].add_argument(
        "--no-mmproj", dest="mmproj_auto", action="store_false", default=None, help=argparse.SUPPRESS
    )


def _bench_parser(sub) -> None:
    p = sub.add_parser(
        "bench",
        help="benchmarks: the engine in-process, or HTTP load on a server",
        description="Benchmarks (cllm.bench; 'cllm bench engine --help' and 'cllm bench http --help' list their "
        "options).",
    )
    p.add_argument(
        "target",
        choices=["engine", "http"],
        help="engine: the step loop in-process, no HTTP; http: load on a server's URL",
    )
    p.add_argument("args", nargs=argparse.REMAINDER, help="the benchmark's own options")


def _hub_parsers(sub) -> None:
    """`cllm pull`, `cllm models` (`ls`), `cllm rm`: the Hugging Face cache by model name (docs/hub.md)."""
    name = "ORG/REPO[:QUANT]"
    p = sub.add_parser(
        "pull",
        help="download GGUF models from the Hugging Face hub by name, into its cache",
        description="Download GGUF models by name (llama-server's -hf spelling) into the Hugging Face cache, with "
        "progress, resume and checksum checks; HF_ENDPOINT, HF_TOKEN and HF_HOME apply (docs/hub.md).",
    )
    p.add_argument("names", nargs="+", metavar=name, help="without :QUANT: Q4_K_M, else Q8_0, else the repo's first")
    sub.add_parser(
        "models", aliases=["ls"], help="list the models in the Hugging Face cache: name, quantization, size, path"
    )
    p = sub.add_parser("rm", help="remove pulled models from the Hugging Face cache")
    p.add_argument("names", nargs="+", metavar=name, help="as `cllm models` lists them")


def parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="cllm", description="cllm: llama.cpp behind an HTTP API")
    sub = parser.add_subparsers(dest="command", required=True)
    _serve_parser(sub)
    _hub_parsers(sub)
    _bench_parser(sub)
    return parser


def serve_overrides(args: argparse.Namespace) -> dict[str, Any]:
    """The settings `cllm serve`'s command line gave (None: not given)."""
    return {s.attr: getattr(args, s.attr) for s in settings(ServeConfig) if s.options}


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)

    if args.command == "bench":
        bench = importlib.import_module("cllm.bench." + ("engine_bench" if args.target == "engine" else "http_load"))
        return bench.main(args.args, prog=f"cllm bench {args.target}")

    if args.command in ("pull", "models", "ls", "rm"):
        from cllm.hub import commands

        if args.command == "pull":
            return commands.pull(args.names)
        if args.command == "rm":
            return commands.rm(args.names)
        return commands.models()

    if args.command == "serve":
        try:
            config = load_config(args.config, serve_overrides(args), os.environ)
            hub = None
            if args.ray is None and asks_hub(config):
                from cllm.hub.commands import HubModels

                hub = HubModels(offline=config.offline)
            models = build_registry(config, hub)
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
