"""The Responses API's store on its own: bounded by count and by age, least recently used first out, seen in
/metrics."""

from __future__ import annotations

import time

from prometheus_client import CollectorRegistry, generate_latest

from frontend_proc.doors.responses.store import ResponseStore, Stored


def stored(i: int) -> Stored:
    return Stored({"id": f"resp_{i}"}, [{"role": "user", "content": str(i)}])


def test_count_bound_drops_the_least_recently_used():
    store = ResponseStore(max_count=3)
    for i in range(3):
        store.put(f"r{i}", stored(i))
    assert store.get("r0") is not None  # r0 is now the most recently used
    store.put("r3", stored(3))
    assert store.get("r1") is None and len(store) == 3
    assert [store.get(f"r{i}") is not None for i in (0, 2, 3)] == [True, True, True]
    assert store.delete("r0") and not store.delete("r0") and len(store) == 2


def test_age_bound_and_metrics():
    registry = CollectorRegistry()
    store = ResponseStore(registry, max_age=1.0)
    store.put("old", stored(0))
    time.sleep(0.5)
    store.put("new", stored(1))
    assert store.get("old") is not None  # a use does not renew an entry's age
    assert "cllm_responses_stored 2.0" in generate_latest(registry).decode()
    time.sleep(0.6)
    assert store.get("old") is None and store.get("new") is not None
    assert 0.5 < store.oldest_age() < 1.0
    time.sleep(1.0)
    assert len(store) == 0 and store.oldest_age() == 0.0
    assert "cllm_responses_stored 0.0" in generate_latest(registry).decode()
