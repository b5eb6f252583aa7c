"""The prefix cache's entries on disk (``--cache-dir``): cells that outlive the engine.

KV streams and host RAM go with the engine process. A restart (a deploy, a
crash and the supervisor's restart, a model unloaded and loaded again) would
make every open conversation prefill its whole history again: ~25 s for
4,000 tokens here. So the cache's entries also go to files: an entry copied
to host RAM as it is stored there (its bytes are at hand), an entry still in
its KV stream once the engine has been idle a moment, or when it stops. A
new engine reads the files' tokens, not their cells; a prompt that a file
serves better than the streams and host RAM gets its cells from it
(llama_state_seq_set_data), as from host RAM. With streams in device memory,
idle before its first request, it also brings the newest files it found into
empty streams (found, Scheduler.warm): a
conversation's next turn then finds its cells in a stream, as it would
without the restart. On a GPU the copy from a file is most of that turn's
time, which warming takes off it.

- Never wrong cells: a file is kept under, and carries, the fingerprint of
  the model file and of every setting that changes cells (see identity).
  Another fingerprint's files are never read; they count only for the cap.
- Never a broken file: written under a temporary name, fsynced, renamed, with
  a hash of its tokens and one of its cells (kv_file). A file whose header,
  fingerprint, length or tokens are wrong is dropped at the start, one whose
  cells do not match their hash when they are loaded, before they go into a
  stream: removed, with one warning naming it, and counted (rejected, the
  frontend's cllm_prefix_cache_disk_rejected_total); the prompt is then
  served as if the file had never been there. A temporary file its dead
  writer left is removed with one line.
- Never in the way: a thread writes; a lookup reads one file. A full disk or
  a folder that cannot be written leaves the cache in RAM, with one warning.
- The cap holds for the whole folder, every fingerprint and every engine
  that shares it: before a write, the least recently used files go (a
  file's mtime is its last use: written or read).
"""

from __future__ import annotations

import hashlib
import json
import logging
import mmap
import os
import queue
import threading
import time
from dataclasses import dataclass

import llama_cpp as L
import msgspec
import numpy as np

from cllm.core.config import ServeConfig
from engine_proc.kv.kv_file import (
    TMP,
    check_cells,
    check_tokens,
    file_head,
    read_header,
    read_tokens,
    remove_quietly,
    write_file,
)
from engine_proc.sequence import common_prefix, starts_with

log = logging.getLogger("cllm.engine")

SUFFIX = ".kv"
# Entries are filed under their first HEAD tokens (as in host_cache).
HEAD = 32
# Shorter entries are not written: they prefill again in one block.
MIN_CELLS = 128
# Bytes handed to the writer and not written yet; past this, new entries are not
# written (a disk slower than the cache's turnover).
MAX_PENDING = 1 << 30
# Seconds the writer gets to finish when the engine stops (the supervisor waits 5).
CLOSE_WAIT = 3.0
# For tests only (read once, when the engine starts): while the file this names exists, the writer holds
# each whole temporary file before renaming it into place, so that a test can kill the engine mid-write.
HOLD_WRITES = "CLLM_TEST_HOLD_WRITES"


@dataclass(slots=True, eq=False)
class OnDisk:
    tokens: np.ndarray
    name: str  # the file's, in the fingerprint's folder
    n_bytes: int
    written: bool = False  # renamed into place (else still with the writer)


def open_disk_cache(model_path: str, config: ServeConfig, runner) -> DiskCache | None:
    """The engine's disk cache (``runner``: its ModelRunner), or None without --cache-dir or the prefix cache."""
    if config.cache_dir is None or not config.prefix_cache:
        return None
    ident = identity(model_path, config, runner.seq_ctx, runner.token_budget, runner.info.gpu_layers, runner.n_streams)
    return DiskCache(config.cache_dir, config.cache_dir_max << 20, ident)


def identity(
    model_path: str, config: ServeConfig, seq_ctx: int, token_budget: int, gpu_layers: int, streams: int
) -> dict:
    """What a KV cell's bits depend on, besides the tokens before it, and what a saved stream fits into.

    The model file (path, size, mtime) and the projector's, llama.cpp's build and
    this CPU's features, the KV types, flash attention, where layers run, a sequence's
    cells; in exact mode also the batch shapes, which fix the prefill blocks.
    And the context's KV streams: llama_state_seq_set_data refuses a stream
    saved from a context with another count ("n_stream mismatch").
    """
    st = os.stat(model_path)
    ident = {
        "model": [os.path.realpath(model_path), st.st_size, st.st_mtime_ns],
        "llama_cpp": [L.__version__, L.llama_print_system_info().decode(errors="replace")],
        "kv": [config.cache_type_k, config.cache_type_v, config.flash_attn, gpu_layers, seq_ctx, streams],
        "exact": config.prefix_cache_exact,
    }
    if config.prefix_cache_exact:
        ident["batch"] = [token_budget, min(token_budget, 512)]
    if config.mmproj:  # an image's cells: its positions' ids come from its pixels, its rows from the projector
        st = os.stat(config.mmproj)
        ident["mmproj"] = [os.path.realpath(config.mmproj), st.st_size, st.st_mtime_ns]
    return ident


def fingerprint(ident: dict) -> str:
    return hashlib.sha256(json.dumps(ident, sort_keys=True).encode()).hexdigest()[:24]


class DiskCache:
    def __init__(self, root: str, max_bytes: int, ident: dict):
        self.root, self.max_bytes = os.path.abspath(root), max_bytes
        self.fingerprint = fingerprint(ident)
        self.dir = os.path.join(self.root, self.fingerprint)
        self.entries: dict[str, OnDisk] = {}  # name -> entry: this fingerprint's files
        self.found: list[OnDisk] = []  # the files the engine found at its start, not yet warmed: the oldest first
        self._by_head: dict[bytes, dict[str, OnDisk]] = {}
        self.hits = 0  # lookups it served
        self.rejected = 0  # files dropped as damaged, foreign or of another format
        self.load_seconds = 0.0
        self.writable = True
        self._t_load = 0.0  # when the last load began
        self._gone: list[str] = []  # names the writer removed or could not write; the engine's thread drops them
        self._pending = 0  # bytes handed to the writer and not written yet
        self._pending_lock = threading.Lock()
        self._jobs: queue.Queue = queue.Queue()
        self._hold = os.environ.get(HOLD_WRITES)
        try:
            os.makedirs(self.dir, exist_ok=True)
            self._check_writable()
        except OSError as e:
            self._degrade(e)
        self._scan()
        self._writer = threading.Thread(target=self._write_loop, name="cllm-disk-cache", daemon=True)
        self._writer.start()

    # ---- the engine's thread ---------------------------------------------------

    def _alike(self, tokens: np.ndarray) -> list[OnDisk]:
        self._drop_gone()
        if len(tokens) < HEAD:
            return []
        return list(self._by_head.get(tokens[:HEAD].tobytes(), {}).values())

    def wants(self, tokens: np.ndarray) -> bool:
        """Whether ``put`` would write these tokens' cells: no file has them yet."""
        return (
            self.writable
            and len(tokens) >= MIN_CELLS
            and not any(starts_with(e.tokens, tokens) for e in self._alike(tokens))
        )

    def put(self, tokens: np.ndarray, data: np.ndarray) -> None:
        """Hand the cells to the writer (``data`` must not change after); files of a prefix of them go."""
        size = data.nbytes + tokens.nbytes + 4096  # the file's, its header at most a few hundred bytes
        if not self.wants(tokens) or size > self.max_bytes or self._pending + data.nbytes > MAX_PENDING:
            return
        drop = [e for e in self._alike(tokens) if starts_with(tokens, e.tokens)]
        for e in drop:
            self._forget(e.name)
        entry = OnDisk(tokens, hashlib.sha256(tokens.tobytes()).hexdigest()[:32] + SUFFIX, data.nbytes)
        self._add(entry)
        with self._pending_lock:
            self._pending += data.nbytes
        self._jobs.put((entry, data, [e.name for e in drop]))

    def lookup(self, prompt: np.ndarray, longest: int, unit: int) -> tuple[OnDisk | None, int]:
        """The file sharing the longest prefix with ``prompt`` (at most ``longest``, a multiple of ``unit``), and its
        length."""
        best, n_best = None, 0
        for e in self._alike(prompt):
            n = min(common_prefix(prompt, e.tokens), longest) // unit * unit
            if n > n_best and e.written:
                best, n_best = e, n
        return best, n_best

    def load(self, entry: OnDisk, use: bool = True) -> np.ndarray | None:
        """The entry's cells, the file mapped into memory and their hash checked; None (and the entry
        forgotten) if the file is gone or wrong (then dropped: see reject). ``use``: the load counts as the
        file's last use for the cap's LRU (warming one does not).

        Mapped, not read: the cells are hashed where they are and copied once, into the stream, from the
        page cache. Reading 92 MB into new memory took 150-1000 ms here, into a used buffer 95 ms; mapping
        it under 1 ms, and the copy costs the same.
        """
        self._t_load = time.perf_counter()
        path = os.path.join(self.dir, entry.name)
        try:
            with open(path, "rb") as f:
                header = read_header(f, self.fingerprint)
                if header.n_bytes != entry.n_bytes:
                    raise ValueError("it changed since the engine started")
                check_tokens(header, entry.tokens)  # the tokens the cells are taken for
                start = f.tell() + header.n_tokens * 4
                if os.fstat(f.fileno()).st_size != start + header.n_bytes:
                    raise ValueError("it is truncated")
                mapped = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
            data = np.frombuffer(mapped, np.uint8, header.n_bytes, start)
            check_cells(header, data)
        except (ValueError, msgspec.DecodeError) as e:
            self.reject(path, e)
            self._forget(entry.name)
            return None
        except OSError as e:
            if not isinstance(e, FileNotFoundError):  # another engine's cap took it: nothing to say
                log.warning("prefix cache file %s skipped: %s", path, e)
            self._forget(entry.name)
            return None
        try:
            if use:
                os.utime(path)  # its last use, for the cap's LRU
        except OSError:
            pass
        return data

    def reject(self, path: str, why: Exception) -> None:
        """A file of this folder that must never be used: removed, with a warning naming it, and counted."""
        log.warning("prefix cache file %s dropped: %s", path, why)
        remove_quietly(path)
        self.rejected += 1

    def served(self, loaded_now: bool = True) -> None:
        """A lookup was served from a file: a hit, and (``loaded_now``) the last load's time from the file's
        opening on, its cells now in a stream (else they went in while the engine was idle: see warmed)."""
        self.hits += 1
        if loaded_now:
            self.warmed()

    def warmed(self) -> None:
        """The last load's cells are in a stream: its time from the file's opening on."""
        self.load_seconds += time.perf_counter() - self._t_load

    def newest_found(self) -> OnDisk | None:
        """The newest file found at the start that is still there (and no longer in ``found``)."""
        self._drop_gone()
        while self.found:
            entry = self.found.pop()
            if self.entries.get(entry.name) is entry:
                return entry
        return None

    def writing(self) -> bool:
        """Whether the writer has entries it has not written yet."""
        return self._pending > 0

    def stats(self) -> tuple[int, int]:
        """(entries, bytes) in files, those the writer has still to write left out."""
        self._drop_gone()
        written = [e for e in self.entries.values() if e.written]
        return len(written), sum(e.n_bytes for e in written)

    def close(self) -> None:
        """Let the writer finish what it has (for at most CLOSE_WAIT seconds)."""
        self._jobs.put(None)
        self._writer.join(CLOSE_WAIT)

    def _add(self, entry: OnDisk) -> None:
        self.entries[entry.name] = entry
        self._by_head.setdefault(entry.tokens[:HEAD].tobytes(), {})[entry.name] = entry

    def _forget(self, name: str) -> None:
        entry = self.entries.pop(name, None)
        if entry is None:
            return
        head = entry.tokens[:HEAD].tobytes()
        alike = self._by_head[head]
        del alike[name]
        if not alike:
            del self._by_head[head]

    def _drop_gone(self) -> None:
        while self._gone:
            self._forget(self._gone.pop())

    def _scan(self) -> None:
        """Index this fingerprint's files by their tokens; drop (with a line each) the ones that are wrong."""
        try:
            names = os.listdir(self.dir)
        except OSError:
            return
        found = []
        for name in names:
            path = os.path.join(self.dir, name)
            if name.endswith(TMP):
                _remove_torn(path)
                continue
            if not name.endswith(SUFFIX):
                continue
            try:
                with open(path, "rb") as f:
                    header, tokens = read_tokens(f, self.fingerprint)
                    used = os.fstat(f.fileno()).st_mtime_ns
            except (ValueError, msgspec.DecodeError) as e:
                self.reject(path, e)
                continue
            except OSError as e:
                log.warning("prefix cache file %s skipped: %s", path, e)
                continue
            if len(tokens) >= HEAD:
                entry = OnDisk(tokens, name, header.n_bytes, written=True)
                self._add(entry)
                found.append((used, name, entry))
        self.found = [entry for _, _, entry in sorted(found)]
        if self.entries:
            log.info("prefix cache: %d entries on disk in %s", len(self.entries), self.dir)

    def _check_writable(self) -> None:
        probe = os.path.join(self.dir, f".probe.{os.getpid()}{TMP}")
        with open(probe, "wb"):
            pass
        os.remove(probe)

    def _degrade(self, error: OSError) -> None:
        """The folder cannot be written (read-only, full): the cache goes on in RAM, and reads what files it has."""
        if self.writable:
            log.warning(
                "prefix cache folder %s cannot be written (%s): new entries stay in RAM only",
                self.dir,
                error.strerror or error,
            )
        self.writable = False

    # ---- the writer's thread ---------------------------------------------------

    def _write_loop(self) -> None:
        while (job := self._jobs.get()) is not None:
            entry, data, drop = job
            try:
                if self.writable:
                    self._write(entry, data)
                    for name in drop:
                        remove_quietly(os.path.join(self.dir, name))
                else:
                    self._gone.append(entry.name)
            finally:
                with self._pending_lock:
                    self._pending -= data.nbytes

    def _write(self, entry: OnDisk, data: np.ndarray) -> None:
        head = file_head(self.fingerprint, entry.tokens, data)
        try:
            self._make_room(len(head) + entry.tokens.nbytes + data.nbytes)
            write_file(os.path.join(self.dir, entry.name), head, entry.tokens, data, self._held if self._hold else None)
        except OSError as e:
            self._gone.append(entry.name)
            self._degrade(e)
            return
        entry.written = True

    def _held(self) -> None:
        # HOLD_WRITES: a test's, which removes the file or kills the engine
        while self._hold and os.path.exists(self._hold):
            time.sleep(0.01)

    def _make_room(self, size: int) -> None:
        """Remove the least recently used files of the whole folder until ``size`` more bytes fit the cap."""
        files = []
        for sub in os.scandir(self.root):
            if not sub.is_dir(follow_symlinks=False):
                continue
            for f in os.scandir(sub.path):
                if f.name.endswith(SUFFIX):
                    try:
                        st = f.stat(follow_symlinks=False)
                    except OSError:
                        continue
                    files.append((st.st_mtime_ns, st.st_size, f.path))
        total = sum(size for _, size, _ in files)
        for _, n, path in sorted(files):
            if total + size <= self.max_bytes:
                break
            remove_quietly(path)
            total -= n
            if os.path.dirname(path) == self.dir:
                self._gone.append(os.path.basename(path))


def _remove_torn(path: str) -> None:
    """A temporary file whose writer died mid-write: removed (one still being written is left alone)."""
    try:
        pid = int(os.path.basename(path).rsplit(".", 2)[-2])
        os.kill(pid, 0)
        return  # its writer lives (another engine on the same folder)
    except ProcessLookupError:
        pass
    except PermissionError:
        return  # another user's process lives
    except (ValueError, IndexError):
        pass  # not a name the writer gives
    log.warning("prefix cache: removed %s, a file its writer did not finish", path)
    remove_quietly(path)
