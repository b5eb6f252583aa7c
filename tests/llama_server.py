"""llama.cpp's own llama-server beside cllm in the tests: started on a model (skipped where `make llama-server` has
not built it, a failure under CI), its error shape, and a comparison of two answers' JSON shapes, with the keys
cLLM leaves out on purpose."""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator

import httpx
import pytest

from tests.conftest import ROOT, free_port

LLAMA_SERVER = os.path.join(ROOT, "perf", "cache", "bin", "llama-server")


def refused(r: httpx.Response, status: int, *words: str) -> dict:
    """llama-server's error shape: {"error": {"code", "message", "type"}}, the message naming what is wrong."""
    assert r.status_code == status, r.text
    error = r.json()["error"]
    assert error["code"] == status and isinstance(error["type"], str)
    for word in words:
        assert word in error["message"], error
    return error


# Keys llama-server has that cLLM leaves out on purpose (docs/llama-server-api.md says why).
ONLY_LLAMA_SERVER = {
    "props": set(),
    "settings": {"speculative.types"},  # cLLM drafts per engine (--spec-type), not per request
    "slot": set(),  # its prompt and generated text only with LLAMA_SERVER_SLOTS_DEBUG set
}


def same_shape(ours, theirs, where: str, skip: frozenset[str] | set[str] = frozenset()) -> None:
    """The same keys (less those skipped) and the same JSON types, all the way down (ints count as numbers)."""
    number = (int, float)
    if isinstance(theirs, dict):
        assert isinstance(ours, dict), where
        assert ours.keys() == theirs.keys() - skip, f"{where}: {sorted(ours.keys() ^ (theirs.keys() - skip))}"
        for k in ours:
            same_shape(ours[k], theirs[k], f"{where}.{k}")
    elif isinstance(theirs, list):
        assert isinstance(ours, list), where
        assert bool(ours) == bool(theirs), f"{where}: {len(ours)} items vs {len(theirs)}"
        # Every item on both sides; where one list is longer, its surplus against the other's last item.
        for i in range(max(len(ours), len(theirs))):
            same_shape(ours[min(i, len(ours) - 1)], theirs[min(i, len(theirs) - 1)], f"{where}[{i}]")
    elif isinstance(theirs, bool) or isinstance(ours, bool):
        assert type(ours) is type(theirs), where
    elif isinstance(theirs, number):
        assert isinstance(ours, number), where
    else:
        assert type(ours) is type(theirs), f"{where}: {type(ours).__name__} vs {type(theirs).__name__}"


@contextlib.contextmanager
def llama_server_on(
    model: str, tmp_path_factory, *args: str, env: dict[str, str] | None = None
) -> Iterator[httpx.Client]:
    """llama-server (perf/cache/bin) on ``model`` with ``args`` (``env``: added to its environment), a client of it;
    skipped where it is not built, but under CI."""
    if not os.path.exists(LLAMA_SERVER):
        # CI builds it (.ci/run): there a missing one is a failure, so the comparisons cannot silently stop running.
        built = os.path.relpath(LLAMA_SERVER, ROOT)
        why = f"llama-server is not built ({built}: `make llama-server`), so cllm is not compared with it"
        if os.environ.get("CI", "").lower() not in ("", "0", "false"):
            pytest.fail(f"{why}; CI is set, where the comparison must run")
        pytest.skip(why)
    from perf.servers import launch

    port = free_port()
    cmd = [
        LLAMA_SERVER,
        "--model",
        model,
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "--threads",
        "1",
        "--no-webui",
        *args,
    ]
    server = launch("llama-server", cmd, port, "/health", env, logs=str(tmp_path_factory.mktemp("llama-server")))
    try:
        # A new connection a request: llama-server closes an idle one after 5 s, which a request on a busy machine
        # could race ("Server disconnected without sending a response", seen once here).
        with httpx.Client(base_url=server.url, timeout=300, limits=httpx.Limits(max_keepalive_connections=0)) as c:
            yield c
    finally:
        server.stop()
