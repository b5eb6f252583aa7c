"""engine_proc/run/host_pages.py: a stream's bytes go into pages faulted in at once where the OS can."""

from __future__ import annotations

import mmap

import numpy as np
import pytest

from engine_proc.run.host_pages import new_pages


@pytest.mark.parametrize("size", [100, (1 << 20) + 3, 5_200_000])
def test_a_buffer_of_the_size_asked_that_can_be_written(size):
    data = new_pages(size)
    assert data.dtype == np.uint8 and data.nbytes == size and data.flags.writeable
    data[:] = 7
    assert int(data[-1]) == 7


@pytest.mark.skipif(not hasattr(mmap, "MAP_POPULATE"), reason="Linux's MAP_POPULATE: elsewhere a plain array")
def test_on_linux_a_large_buffer_is_mapped_with_its_pages_in():
    assert isinstance(new_pages(5_200_000).base.obj, mmap.mmap)  # a memoryview of the mapping
    assert new_pages(4096).base is None  # small: a plain array


def test_elsewhere_a_plain_array(monkeypatch):
    monkeypatch.delattr(mmap, "MAP_POPULATE", raising=False)
    assert new_pages(5_200_000).base is None
