"""How many KV streams and cells the engine asks of llama.cpp: a stream a sequence and a cache slot, and one more
that streams in device memory trade places through where there are two to trade (ModelRunner.swap)."""

from __future__ import annotations

import pytest

from cllm.core.config import ServeConfig


@pytest.mark.parametrize(
    ("settings", "host", "device"),
    [
        ({"parallel": 1}, 1, 1),  # one stream trades places with none
        ({"parallel": 8}, 8, 9),
        ({"parallel": 1, "cache_slots": 2}, 3, 4),
        ({"parallel": 8, "prefix_cache": False}, 8, 8),  # nothing trades places without the cache
    ],
)
def test_streams_in_host_memory_need_no_scratch_stream(settings, host, device):
    config = ServeConfig(ctx_size=8192, **settings)
    assert config.n_streams(on_device=False) == host and config.n_streams(on_device=True) == device
    share = 8192 // config.parallel
    assert config.kv_cells(False) == share * host and config.kv_cells(True) == share * device
