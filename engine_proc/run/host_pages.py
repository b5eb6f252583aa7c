"""Host buffers for a KV stream's bytes (ModelRunner.save), whose pages the OS faults in at once where it can."""

from __future__ import annotations

import mmap

import numpy as np


def new_pages(size: int) -> np.ndarray:
    """A new host buffer for a stream's bytes, its pages faulted in at once where the OS can (Linux's MAP_POPULATE):
    a copy into pages first touched one by one took 4-5x as long on this project's 2-core VM
    (perf/results/2026-12-04-stream-save-populated-pages-cpu.md). Elsewhere, or small, a plain array."""
    populate = getattr(mmap, "MAP_POPULATE", 0)
    if not populate or size < 1 << 20:
        return np.empty(size, np.uint8)
    return np.frombuffer(mmap.mmap(-1, size, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS | populate), np.uint8)
