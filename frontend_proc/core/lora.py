"""A model's LoRA adapters as the frontend keeps them: ids, names, files and scales, and what a request decodes under.

The engines hold the adapters' weights (engine_proc/run/lora.py); the frontend holds their scales, which
`POST /lora-adapters` changes, and resolves each request's adapters into the (id, scale) pairs its Submit
carries (SamplingParams.lora), as llama-server does:

- a request's ``lora`` list sets every adapter's scale, those it leaves out at 0;
- a request that names an adapter as its ``model`` (``adapter`` or ``base:adapter``, vLLM's way) decodes under
  that adapter at scale 1 alone;
- any other request decodes under the adapters at their scales (`--lora` 1, `--lora-scaled`'s, 0 with
  `--lora-init-without-apply`, or what `POST /lora-adapters` set).

An adapter's name is its file's, without `.gguf` (or the name a run-time load gave it); its id is its place at the
start, or the next free number for a run-time load (ids are never given twice).
"""

from __future__ import annotations

import math
import os
from collections.abc import Callable
from dataclasses import dataclass
from typing import Annotated

import msgspec
from msgspec import Meta

from cllm.core.errors import invalid

# llama.cpp multiplies the adapter's update by it in float32; a request may also give a negative one (llama-server's)
Scale = Annotated[float, Meta(ge=-1000, le=1000)]


class LoraScale(msgspec.Struct, forbid_unknown_fields=True):
    """One adapter of a request's ``lora`` list, or of `POST /lora-adapters`' body."""

    id: Annotated[int, Meta(ge=0)]
    scale: Scale


@dataclass(slots=True)
class Adapter:
    id: int
    name: str
    path: str
    scale: float


class LoraAdapters:
    def __init__(self, files: list[tuple[str, float]], count: Callable[[str], None] | None = None):
        """``count``: called with an adapter's name for each request that decodes under it (/metrics)."""
        self.items: list[Adapter] = [Adapter(i, _name(p), p, s) for i, (p, s) in enumerate(files)]
        self.next_id = len(self.items)
        self._count = count

    def listed(self) -> list[dict]:
        """`GET /lora-adapters`: llama-server's list."""
        return [{"id": a.id, "path": a.path, "scale": a.scale} for a in self.items]

    def by_id(self, id: int) -> Adapter | None:
        return next((a for a in self.items if a.id == id), None)

    def by_name(self, name: str) -> Adapter | None:
        return next((a for a in self.items if a.name == name), None)

    def add(self, id: int, name: str, path: str) -> None:
        """A run-time load: at scale 0, so that only requests that ask decode under it."""
        self.items.append(Adapter(id, name, path, 0.0))

    def remove(self, adapter: Adapter) -> None:
        self.items.remove(adapter)

    def rescale(self, scales: list[LoraScale], field: str) -> None:
        """`POST /lora-adapters`: every adapter's scale, those not listed at 0; 400 naming ``field`` for an id no
        adapter has."""
        new = self._scales(scales, field)
        for a in self.items:
            a.scale = new.get(a.id, 0.0)

    def resolve(self, asked: list[tuple[int, float]] | None, named: int | None) -> list[tuple[int, float]] | None:
        """The (id, scale) pairs a request decodes under (None: no adapter): ``asked``, its own ``lora`` list; else
        ``named``, the adapter its ``model`` names; else the adapters' scales. 400 for an id no adapter has."""
        if asked is not None:
            pairs = list(self._scales([LoraScale(i, s) for i, s in asked], "lora").items())
        elif named is not None:
            pairs = [(named, 1.0)]
        else:
            pairs = [(a.id, a.scale) for a in self.items]
        pairs = [(i, s) for i, s in pairs if s != 0.0]
        if self._count is not None:
            for i, _ in pairs:
                if (a := self.by_id(i)) is not None:
                    self._count(a.name)
        return pairs or None

    def _scales(self, scales: list[LoraScale], field: str) -> dict[int, float]:
        new: dict[int, float] = {}
        for k, item in enumerate(scales):
            if self.by_id(item.id) is None:
                known = ", ".join(str(a.id) for a in self.items) or "none"
                raise invalid(f"{field}[{k}].id {item.id} is no adapter of this model (its adapters: {known})", field)
            if not math.isfinite(item.scale):
                raise invalid(f"{field}[{k}].scale must be a finite number", field)
            new[item.id] = item.scale
        return new


def _name(path: str) -> str:
    base = os.path.basename(path)
    return base[: -len(".gguf")] if base.endswith(".gguf") else base
