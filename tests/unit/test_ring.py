import os
import random
import select
import subprocess
import sys
import threading

import msgspec
import pytest

from cllm.core.ring import RecordTooLarge, Ring


def record(i: int) -> bytes:
    """Record i of a reproducible stream: sizes from 0 to ~3 KiB, content from i."""
    rng = random.Random(i)
    return rng.randbytes(rng.choice((0, 1, 3, 17, 255, 1024, 3000, rng.randrange(4000))))


@pytest.fixture
def ring():
    r = Ring.create(4096)
    yield r
    r.close()
    r.close_fds()


def test_records_of_many_sizes_come_back_in_order(ring):
    sent, got = [], []
    for i in range(2000):
        rec = record(i)
        while not ring.try_put(rec):
            got += ring.drain()
        sent.append(rec)
    got += ring.drain()
    assert got == sent


def test_wrap_around_splits_length_and_payload(ring):
    # Walk the write position over every offset near the end of the ring, so
    # both the 4-byte length and the payload get split across the boundary.
    for size in range(1, 12):
        for _ in range(ring.capacity // (size + 4) + 8):
            payload = bytes(range(size))
            assert ring.try_put(payload)
            assert ring.drain() == [payload]


def test_full_ring_refuses_then_accepts_after_drain(ring):
    payload = b"x" * 1000
    n = 0
    while ring.try_put(payload):
        n += 1
    assert n == ring.capacity // (len(payload) + 4)
    assert not ring.try_put(payload)  # full: refused, nothing overwritten
    assert ring.drain() == [payload] * n
    assert ring.try_put(payload)


def test_exact_fit_record(ring):
    payload = b"y" * (ring.capacity - 4)
    assert ring.try_put(payload)
    assert not ring.try_put(b"")
    assert ring.drain() == [payload]


def test_record_larger_than_ring_is_a_clear_error(ring):
    with pytest.raises(RecordTooLarge, match="does not fit a ring of 4096 bytes"):
        ring.try_put(b"z" * 4093)
    assert ring.try_put(b"still usable")
    assert ring.drain() == [b"still usable"]


def test_blocking_put_waits_for_space_and_wait_wakes_reader(ring):
    payload = b"p" * 2000
    assert ring.try_put(payload)
    assert ring.try_put(payload)
    done = threading.Event()

    def producer():
        ring.put(payload)  # ring is full: must block until the consumer drains
        done.set()

    t = threading.Thread(target=producer)
    t.start()
    assert not done.wait(0.2)
    assert ring.drain() == [payload, payload]
    assert done.wait(5)
    t.join()
    assert ring.wait(timeout=5) == []
    assert ring.drain() == [payload]


def test_wait_returns_other_ready_fds(ring):
    r, w = os.pipe()
    os.write(w, b"!")
    assert ring.wait((r,), timeout=5) == [r]
    os.close(r)
    os.close(w)


CONSUMER = """
import random, sys
sys.path.insert(0, {root!r})
from cllm.core.ring import Ring, RingSpec
from tests.unit.test_ring import record
import msgspec
ring = Ring(msgspec.json.decode(sys.argv[1], type=RingSpec))
i = 0
while i < {count}:
    for rec in ring.drain():
        if rec != record(i):
            print("mismatch at", i, flush=True)
            sys.exit(1)
        i += 1
    if i < {count}:
        ring.wait()
print("ok", i, flush=True)
"""


def test_two_processes_exchange_100k_records_byte_exact():
    count = 100_000
    ring = Ring.create(64 * 1024)
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    child = subprocess.Popen(
        [sys.executable, "-c", CONSUMER.format(root=root, count=count), msgspec.json.encode(ring.spec)],
        pass_fds=ring.spec.fds(),
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        for i in range(count):  # a consumer that died ends its output: the put gives up instead of waiting forever
            assert ring.put(record(i), (child.stdout.fileno(),)) == [], child.stdout.read()
        out, _ = child.communicate(timeout=120)
    finally:
        child.kill()
        ring.close()
        ring.close_fds()
    assert child.returncode == 0, out
    assert out.split() == ["ok", str(count)]


def test_blocking_put_gives_up_when_another_fd_is_readable(ring):
    payload = b"q" * 3000
    assert ring.try_put(payload)  # too full for another
    r, w = os.pipe()
    result = []
    t = threading.Thread(target=lambda: result.append(ring.put(payload, (r,))))
    t.start()
    t.join(0.2)
    assert t.is_alive()  # waiting for room
    os.write(w, b"!")
    t.join(5)
    assert result == [[r]]
    assert ring.drain() == [payload]  # nothing was appended
    os.close(r)
    os.close(w)


def _woken(ring) -> bool:
    """Whether the consumer's wake-up pipe holds a wake-up now."""
    return bool(select.select([ring.data_fd], [], [], 0)[0])


def test_record_put_without_wake_waits_for_the_next_that_wakes(ring):
    assert ring.arm_wait()  # the consumer is about to sleep
    assert ring.try_put(b"quiet", wake=False)
    assert not _woken(ring)  # it sleeps on
    assert ring.try_put(b"loud")
    assert _woken(ring)
    ring.end_wait()
    assert ring.drain() == [b"quiet", b"loud"]  # the quiet one comes with it, in order


def test_ring_wakes_a_sleeping_consumer_once_a_quarter_full(ring):
    assert ring.arm_wait()
    payload = b"x" * 100
    used = 0
    while 4 * (used + 104) < ring.capacity:
        assert ring.try_put(payload, wake=False)
        used += 104
        assert not _woken(ring)
    assert ring.try_put(payload, wake=False)  # this one fills a quarter: the producer never fills it unseen
    assert _woken(ring)
    ring.end_wait()
    assert len(ring.drain()) == used // 104 + 1
