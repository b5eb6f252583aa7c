"""`cllm pull`, `cllm models` (`cllm ls`), `cllm rm`, and what `cllm serve` asks of the hub for its registry."""

from __future__ import annotations

import sys

from cllm.core.settings import ConfigError
from cllm.hub.names import HubNameError
from cllm.hub.pull import Hub, HubError
from cllm.hub.store import StoreError, listed, remove


def _mib(n: int) -> str:
    return f"{n / (1 << 20):,.1f} MiB"


ERRORS = (HubNameError, HubError, StoreError)  # one sentence each: what the CLI prints before exiting 2


class HubModels:
    """The registry's view of the hub (cllm/core/registry.py asks it): a name's file, and every pulled model."""

    def __init__(self, offline: bool = False):
        self.hub = Hub(offline=True if offline else None)  # None: HF_HUB_OFFLINE decides

    def resolve(self, name: str) -> tuple[str, str, str | None]:
        """(the model's name, its local file, its projector if the repo has one): pulled unless cached, from the
        cache alone when offline."""
        try:
            model = self.hub.pull(name)
        except ERRORS as e:
            raise ConfigError(str(e)) from None
        if model.fetched:
            print(
                f"cllm: pulled {model.name} ({_mib(model.fetched)} downloaded) into {self.hub.cache_dir}",
                file=sys.stderr,
            )
        return model.name, model.path, model.mmproj

    def listed(self) -> list[tuple[str, str, str | None]]:
        return [(m.name, m.path, m.mmproj) for m in listed(self.hub.cache_dir)]


def pull(names: list[str]) -> int:
    hub = Hub()
    for name in names:
        try:
            model = hub.pull(name)
        except ERRORS as e:
            print(f"cllm: {e}", file=sys.stderr)
            return 2
        got = f"{_mib(model.fetched)} downloaded" if model.fetched else "already in the cache"
        extra = f", mmproj {model.mmproj}" if model.mmproj else ""
        print(f"{model.name}: {model.path} ({_mib(model.size)}, {got}{extra})")
    return 0


def models() -> int:
    """The pulled models: name, quantization, size, where."""
    hub = Hub(offline=True)
    rows = [
        (m.name, m.name.rpartition(":")[2] if ":" in m.name else "", _mib(m.size), m.path)
        for m in listed(hub.cache_dir)
    ]
    if not rows:
        print(f"no model in {hub.cache_dir}; `cllm pull org/repo:QUANT` fetches one", file=sys.stderr)
        return 0
    head = ("NAME", "QUANT", "SIZE", "PATH")
    widths = [max(len(r[i]) for r in (head, *rows)) for i in range(3)]
    for r in (head, *rows):
        print(f"{r[0]:<{widths[0]}}  {r[1]:<{widths[1]}}  {r[2]:>{widths[2]}}  {r[3]}")
    return 0


def rm(names: list[str]) -> int:
    cache = Hub(offline=True).cache_dir
    for name in names:
        try:
            freed = remove(cache, name)
        except ERRORS as e:
            print(f"cllm: {e}", file=sys.stderr)
            return 2
        print(f"removed {name} ({_mib(freed)} freed)")
    return 0
