"""A single-producer, single-consumer ring of byte records in shared memory.

The memory is an anonymous file (memfd on Linux, an unlinked temporary file
elsewhere) handed to the other process as a file descriptor: it has no name,
so nothing can be guessed, opened by others, or left behind after a crash.

Layout: a header of four 64-byte lines, then ``capacity`` data bytes.
  line 0: tail, total bytes ever written (stored by the producer only)
  line 1: head, total bytes ever consumed (stored by the consumer only)
  line 2: reader_waiting, the consumer is about to block on the data pipe
  line 3: writer_waiting, the producer is about to block on the space pipe
A record is a little-endian u32 length and the payload; either may wrap.

Wake-ups go through pipes, and only when the other side said it is going to
block, so a busy producer or consumer makes no system call per record. A
record nobody waits for may also be put without a wake-up (``wake=False``):
the consumer finds it with the next record that wakes it, and the ring wakes
it anyway once it is a quarter full, so the producer never fills it while
the consumer sleeps.
"""

from __future__ import annotations

import errno
import mmap
import os
import select
import struct
import tempfile
import threading

import msgspec

_HEADER = 256
_TAIL, _HEAD, _READER_WAITING, _WRITER_WAITING = 0, 8, 16, 24  # u64 slots
_LEN = struct.Struct("<I")

_fence_lock = threading.Lock()


def _fence() -> None:
    # CPython has no atomics. Taking and releasing a lock executes a locked
    # read-modify-write, which keeps our store of one header field ordered
    # before our load of the other (the store-load order the flags rely on).
    _fence_lock.acquire()
    _fence_lock.release()


class RecordTooLarge(ValueError):
    pass


class RingSpec(msgspec.Struct, frozen=True):
    """What another process needs to attach to a ring: inherited descriptors."""

    mem_fd: int
    capacity: int
    data_r: int
    data_w: int
    space_r: int
    space_w: int

    def fds(self) -> tuple[int, ...]:
        return (self.mem_fd, self.data_r, self.data_w, self.space_r, self.space_w)


def _anonymous_memory(size: int) -> int:
    """Owner-only (0600) memory with no name: it goes when its last descriptor does."""
    if hasattr(os, "memfd_create"):
        fd = os.memfd_create("cllm-ring", os.MFD_CLOEXEC)
        os.fchmod(fd, 0o600)  # only reachable through /proc/<pid>/fd, but owner-only all the same
    else:  # macOS: a temporary file (mkstemp: random name, O_EXCL, 0600), unlinked at once
        fd, path = tempfile.mkstemp(prefix="cllm-ring-")
        os.unlink(path)
    os.ftruncate(fd, size)
    return fd


def _pipe() -> tuple[int, int]:
    # Both ends non-blocking: waits go through select, and a full pipe
    # already holds a pending wake-up.
    r, w = os.pipe()
    os.set_blocking(r, False)
    os.set_blocking(w, False)
    return r, w


def _poke(fd: int) -> None:
    try:
        os.write(fd, b"\0")
    except BlockingIOError:
        pass


def _drain_pipe(fd: int) -> None:
    # One read empties it in practice (a wake-up is a byte): a short read
    # means it is empty, which spares the per-record second read and its EAGAIN.
    try:
        while len(os.read(fd, 4096)) == 4096:
            pass
    except BlockingIOError:
        pass


class Ring:
    def __init__(self, spec: RingSpec):
        self.spec = spec
        self.capacity = spec.capacity
        self._mm = mmap.mmap(spec.mem_fd, _HEADER + spec.capacity)
        buf = memoryview(self._mm)
        self._hdr = buf[:_HEADER].cast("Q")
        self._data = buf[_HEADER:]

    @classmethod
    def create(cls, capacity: int) -> Ring:
        data_r, data_w = _pipe()
        space_r, space_w = _pipe()
        mem_fd = _anonymous_memory(_HEADER + capacity)
        return cls(RingSpec(mem_fd, capacity, data_r, data_w, space_r, space_w))

    @property
    def data_fd(self) -> int:
        """Readable when the producer woke a waiting consumer."""
        return self.spec.data_r

    @property
    def space_fd(self) -> int:
        """Readable when the consumer woke a waiting producer."""
        return self.spec.space_r

    def close(self) -> None:
        self._hdr.release()
        self._data.release()
        self._mm.close()

    def close_fds(self) -> None:
        for fd in self.spec.fds():
            try:
                os.close(fd)
            except OSError as e:
                if e.errno != errno.EBADF:
                    raise

    # ---- producer ---------------------------------------------------------

    def try_put(self, payload: bytes, wake: bool = True) -> bool:
        """Append one record; False if there is no room for it now. ``wake``: a
        waiting consumer needs it now (else it may sleep on until the next)."""
        need = _LEN.size + len(payload)
        if need > self.capacity:
            raise RecordTooLarge(f"record of {len(payload)} bytes does not fit a ring of {self.capacity} bytes")
        tail = self._hdr[_TAIL // 8]
        if self.capacity - (tail - self._hdr[_HEAD // 8]) < need:
            return False
        self._write(tail, _LEN.pack(len(payload)))
        self._write(tail + _LEN.size, payload)
        _fence()
        self._hdr[_TAIL // 8] = tail + need
        _fence()
        if self._hdr[_READER_WAITING // 8] and (wake or 4 * (tail + need - self._hdr[_HEAD // 8]) >= self.capacity):
            _poke(self.spec.data_w)
        return True

    def put(self, payload: bytes, other_fds: tuple[int, ...] = (), wake: bool = True) -> list[int]:
        """Append one record, blocking while the ring is full (backpressure).

        Gives up, without appending, as soon as one of ``other_fds`` is
        readable, and returns those that are; returns [] once appended.
        """
        while not self.try_put(payload, wake):
            if self.arm_space_wait(len(payload)):
                try:
                    ready, _, _ = select.select([self.spec.space_r, *other_fds], [], [])
                finally:
                    self.end_space_wait()
                others = [fd for fd in ready if fd != self.spec.space_r]
                if others:
                    return others
        return []

    def arm_space_wait(self, size: int) -> bool:
        """Declare the producer is about to wait; False if room appeared meanwhile."""
        self._hdr[_WRITER_WAITING // 8] = 1
        _fence()
        used = self._hdr[_TAIL // 8] - self._hdr[_HEAD // 8]
        if self.capacity - used >= _LEN.size + size:
            self._hdr[_WRITER_WAITING // 8] = 0
            return False
        return True

    def end_space_wait(self) -> None:
        self._hdr[_WRITER_WAITING // 8] = 0
        _drain_pipe(self.spec.space_r)

    # ---- consumer ---------------------------------------------------------

    def drain(self) -> list[bytes]:
        """Take every record written so far, without blocking."""
        head = self._hdr[_HEAD // 8]
        tail = self._hdr[_TAIL // 8]
        if head == tail:
            return []
        _fence()
        out = []
        while head < tail:
            (n,) = _LEN.unpack(self._read(head, _LEN.size))
            out.append(self._read(head + _LEN.size, n))
            head += _LEN.size + n
        self._hdr[_HEAD // 8] = head
        _fence()
        if self._hdr[_WRITER_WAITING // 8]:
            _poke(self.spec.space_w)
        return out

    def arm_wait(self) -> bool:
        """Declare the consumer is about to wait; False if a record arrived meanwhile."""
        self._hdr[_READER_WAITING // 8] = 1
        _fence()
        if self._hdr[_TAIL // 8] != self._hdr[_HEAD // 8]:
            self._hdr[_READER_WAITING // 8] = 0
            return False
        return True

    def end_wait(self) -> None:
        self._hdr[_READER_WAITING // 8] = 0
        _drain_pipe(self.spec.data_r)

    def wait(self, other_fds: tuple[int, ...] = (), timeout: float | None = None) -> list[int]:
        """Block until a record is available or one of ``other_fds`` is readable."""
        if not self.arm_wait():
            return []
        try:
            ready, _, _ = select.select([self.spec.data_r, *other_fds], [], [], timeout)
        finally:
            self.end_wait()
        return [fd for fd in ready if fd != self.spec.data_r]

    # ---- raw bytes, wrapping around the end -------------------------------

    def _write(self, pos: int, data: bytes) -> None:
        off = pos % self.capacity
        first = min(len(data), self.capacity - off)
        self._data[off : off + first] = data[:first]
        if first < len(data):
            self._data[: len(data) - first] = data[first:]

    def _read(self, pos: int, n: int) -> bytes:
        off = pos % self.capacity
        if off + n <= self.capacity:
            return bytes(self._data[off : off + n])
        first = self.capacity - off
        return bytes(self._data[off:]) + bytes(self._data[: n - first])
