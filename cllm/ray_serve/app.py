"""cllm as a Ray Serve application: one builder for `serve run` and for `cllm serve --ray`.

    serve run cllm.ray_serve:app_builder config=cllm.yaml [replicas=N | min-replicas=A max-replicas=B] [router=cllm]
    cllm serve --ray ADDRESS|local --replicas N [any `cllm serve` option]

Both build the same application: an ingress deployment (HTTP, see ingress.py)
in front of N engine replicas (replica.py), each one engine process with the
settings `cllm serve` takes (`replicas` counts Ray replicas here, each with one
engine; `threads` unset means every core of the replica's node). `router`
picks the request router of the engine deployment: cllm's (router.py), Ray's
default power-of-two choices, or Ray's PrefixCacheAffinityRouter (from its
internal module: the public one imports vLLM or SGLang; its prefix tree is a
detached actor that needs a free Ray CPU).
"""

from __future__ import annotations

import os
import shutil
import signal
import tempfile
import threading
from typing import Any, Literal

import msgspec
from ray import serve
from ray.serve.config import RequestRouterConfig

from cllm.core.config import ServeConfig
from cllm.core.config_load import load_config
from cllm.core.registry import build_registry
from cllm.core.settings import ConfigError
from cllm.ray_serve.ingress import Ingress
from cllm.ray_serve.replica import EngineReplica

Router = Literal["cllm", "power-of-two", "ray-prefix"]
ROUTER_CLASSES = {
    "cllm": "cllm.ray_serve.router:CllmRouter",
    # Its public name (ray.serve.llm.request_router) needs vLLM or SGLang installed; the class itself does not.
    "ray-prefix": "ray.llm._internal.serve.routing_policies.prefix_aware.prefix_aware_router:PrefixCacheAffinityRouter",
}
APP_NAME = "cllm"


class AppArgs(msgspec.Struct, kw_only=True, forbid_unknown_fields=True, rename="kebab"):
    """`serve run` arguments beyond cllm's own settings (which may be given there too, as `threads=1`)."""

    config: str | None = None  # a `cllm serve` YAML file
    min_replicas: int | None = None  # with max-replicas: autoscale on requests in flight instead of `replicas`
    max_replicas: int | None = None
    router: Router = "cllm"
    num_cpus: float | None = None  # Ray CPUs each engine replica reserves (default: its threads, else 1)


def app_builder(args: dict[str, str]) -> serve.Application:
    """`serve run cllm.ray_serve:app_builder config=cllm.yaml replicas=2`: Ray's application-builder convention."""
    own = {k.replace("_", "-"): v for k, v in args.items() if k.replace("_", "-") in AppArgs.__struct_encode_fields__}
    try:
        app_args = msgspec.convert(own, AppArgs, strict=False)
    except msgspec.ValidationError as e:
        raise ConfigError(f"invalid argument: {e}") from None
    # The rest are `cllm serve` settings, as the YAML file would write them (threads=1 is the number 1).
    overrides = {
        k.replace("-", "_"): _scalar(v)
        for k, v in args.items()
        if k.replace("_", "-") not in AppArgs.__struct_encode_fields__
    }
    config = load_config(app_args.config, overrides, os.environ)
    return application(config, app_args.router, app_args.min_replicas, app_args.max_replicas, app_args.num_cpus)


def _scalar(value):
    return msgspec.yaml.decode(value) if isinstance(value, str) else value


def application(
    config: ServeConfig,
    router: Router = "cllm",
    min_replicas: int | None = None,
    max_replicas: int | None = None,
    num_cpus: float | None = None,
) -> serve.Application:
    specs = build_registry(msgspec.structs.replace(config, replicas=1))  # each Ray replica runs one engine
    if len(specs) > 1:
        raise ConfigError("a Ray Serve application serves one model: give --model (or none), not a registry")
    scale = (
        {
            "autoscaling_config": {
                "min_replicas": min_replicas,
                "max_replicas": max_replicas,
                "target_ongoing_requests": config.parallel,
            }
        }
        if min_replicas is not None and max_replicas is not None
        else {"num_replicas": config.replicas}
    )
    chosen: dict[str, Any] = {"request_router_class": ROUTER_CLASSES[router]} if router in ROUTER_CLASSES else {}
    if router == "cllm":  # the engine pool's settings: half a batch of slack, about what an engine's cells hold
        chosen["request_router_kwargs"] = {
            "slack": max(2, config.parallel // 2),
            "max_blocks": 2 * config.ctx_size // 32,
        }
    routing = RequestRouterConfig(request_routing_stats_period_s=1.0, request_routing_stats_timeout_s=5.0, **chosen)
    engines = serve.deployment(
        EngineReplica,
        name="cllm-engine",
        **scale,
        # One more than cllm's own bound, so that its 429 answers an overload, not Ray's queue.
        max_ongoing_requests=config.parallel + config.max_waiting + 1,
        health_check_period_s=1.0,
        health_check_timeout_s=10.0,
        graceful_shutdown_timeout_s=config.shutdown_timeout,
        ray_actor_options={"num_cpus": num_cpus if num_cpus is not None else (config.threads or 1)},
        request_router_config=routing,
    )
    ingress = serve.deployment(
        Ingress, name="cllm-ingress", max_ongoing_requests=100_000, ray_actor_options={"num_cpus": 0}
    )
    return ingress.bind(engines.bind(specs[0], config.api_key), config.body_bytes(bool(specs[0].config.mmproj)))


def run(config: ServeConfig, address: str) -> int:
    """`cllm serve --ray ADDRESS|local`: deploy, print the URL, serve until SIGINT/SIGTERM, then tear down."""
    import ray

    local = address == "local"
    temp = tempfile.mkdtemp(prefix="cllm-ray-") if local else None
    app = application(config)
    ray.init(
        address=None if local else address,
        num_cpus=os.cpu_count() if local else None,
        include_dashboard=False,
        _temp_dir=temp,
        log_to_driver=False,
    )
    stop = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):  # after ray.init, which sets its own
        signal.signal(sig, lambda *_: stop.set())
    try:
        serve.start(http_options={"host": config.host, "port": config.port})
        serve.run(app, name=APP_NAME, route_prefix="/")
        model = os.path.basename(build_registry(msgspec.structs.replace(config, replicas=1))[0].path)
        print(
            f"cllm: serving {model} through Ray Serve ({config.replicas} replicas) at "
            f"http://{config.host}:{config.port}",
            flush=True,
        )
        stop.wait()
        return 0
    finally:
        serve.delete(APP_NAME)
        if local:
            serve.shutdown()
        ray.shutdown()
        if temp is not None:
            shutil.rmtree(temp, ignore_errors=True)
