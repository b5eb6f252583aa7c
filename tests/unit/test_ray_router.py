"""cllm's Ray Serve request router (cllm/ray_serve/router.py), its rule on fake replicas: no cluster, no model."""

from __future__ import annotations

import asyncio
import importlib.util
from types import SimpleNamespace

import pytest

pytestmark = [
    pytest.mark.ray,
    pytest.mark.skipif(
        importlib.util.find_spec("ray") is None, reason="the ray extra is not installed (make test-ray)"
    ),
]


def make_router(slack: int = 2):
    from cllm.ray_serve.router import CllmRouter

    router = object.__new__(CllmRouter)  # the rule alone: Ray's own state is not used by it
    router.initialize_state(slack=slack, max_blocks=1000)
    return router


def replica(name: str, **stats) -> SimpleNamespace:
    return SimpleNamespace(replica_id=name, routing_stats=stats)


def request(text: str, rid: str) -> SimpleNamespace:
    from cllm.ray_serve.call import HttpCall, text_blocks

    call = HttpCall("POST", "/v1/completions", b"", [], b"", text, text_blocks(text))
    return SimpleNamespace(args=[call], metadata=SimpleNamespace(internal_request_id=rid))


def route(router, replicas, req) -> str:
    ranks = asyncio.run(router.choose_replicas(replicas, req))
    return ranks[0][0].replica_id


PREFIX = "You are a helpful assistant who answers in one sentence. " * 10


def test_a_shared_prefix_goes_where_it_went_and_unrelated_prompts_spread():
    router, replicas = make_router(), [replica("a"), replica("b")]
    first = route(router, replicas, request(PREFIX + "Q1", "1"))
    router.on_request_completed(first, "1")
    for i in range(2, 8):
        assert route(router, replicas, request(PREFIX + f"Q{i}", str(i))) == first
        router.on_request_completed(first, str(i))
    # While the first runs, an unrelated prompt goes to the idle replica.
    busy = route(router, replicas, request("x" * 400, "8"))
    assert route(router, replicas, request("y" * 400, "9")) != busy


def test_a_much_busier_cached_replica_loses_to_the_least_loaded():
    router, replicas = make_router(slack=2), [replica("a"), replica("b")]
    cached = route(router, replicas, request(PREFIX + "Q0", "0"))
    for i in range(1, 3):  # within the slack: still the cached one
        assert route(router, replicas, request(PREFIX + f"Q{i}", str(i))) == cached
    assert route(router, replicas, request(PREFIX + "Q3", "3")) != cached  # 3 more in flight than the other


def test_what_a_replica_reports_counts_like_what_was_routed():
    from cllm.ray_serve.call import text_blocks

    router = make_router()
    replicas = [replica("a"), replica("b", prefixes=frozenset(text_blocks(PREFIX)))]
    for i in range(5):
        assert route(router, replicas, request(PREFIX + f"from another router {i}", str(i))) == "b"
        router.on_request_completed("b", str(i))
