"""Pulls and deletions a serving `cllm serve --allow-pull` runs for its clients (the frontend asks, the supervisor
runs them here: it alone owns the registry, the rings and the hub's client).

A pull is `cllm pull`'s (cllm/hub/pull.py) in a thread of its own; what it has to say (each file's bytes, at most
every 0.1 s, then the model or the reason it failed) goes on a queue the supervisor's loop drains when woken.
"""

from __future__ import annotations

import os
import queue
import threading
import time

from cllm.core.protocol import DeleteEnded, PullProgress
from cllm.hub.commands import ERRORS
from cllm.hub.pull import Hub
from cllm.hub.store import Model, StoreError, remove

_EVERY_S = 0.1


class Finished:
    """A pull that ended: the model, or why not."""

    def __init__(self, name: str, model: Model | None, error: str = ""):
        self.name, self.model, self.error = name, model, error


class HubJobs:
    def __init__(self, wake_fd: int, offline: bool):
        self._wake_fd = wake_fd  # a byte here makes the supervisor's select() return
        self._offline = offline
        self.cache_dir = Hub(offline=offline or None).cache_dir
        self._out: queue.SimpleQueue[PullProgress | Finished] = queue.SimpleQueue()

    def pull(self, name: str) -> None:
        threading.Thread(target=self._pull, args=(name,), name=f"pull {name}", daemon=True).start()

    def _pull(self, name: str) -> None:
        hub = Hub(offline=self._offline or None, progress=self._bars(name))
        try:
            self._put(Finished(name, hub.pull(name)))
        except ERRORS as e:
            self._put(Finished(name, None, str(e)))
        except Exception as e:  # whatever else breaks the pull ends it, with a reason, not the thread silently
            self._put(Finished(name, None, f"the pull of {name} failed: {type(e).__name__}: {e}"))

    def _put(self, item: PullProgress | Finished) -> None:
        self._out.put(item)
        try:
            os.write(self._wake_fd, b"\0")
        except OSError:
            pass  # the pipe is full: select() wakes anyway

    def drain(self) -> list[PullProgress | Finished]:
        items = []
        while True:
            try:
                items.append(self._out.get_nowait())
            except queue.Empty:
                return items

    def delete(self, name: str) -> DeleteEnded:
        try:
            remove(self.cache_dir, name)
        except StoreError as e:
            return DeleteEnded(name, str(e), missing=True)
        except (*ERRORS, OSError) as e:
            return DeleteEnded(name, str(e))
        return DeleteEnded(name)

    def _bars(self, name: str):
        """huggingface_hub's http_get draws progress through a tqdm class: here one per file, onto the queue."""
        jobs = self

        def for_file(digest: str) -> type:
            class Bar:
                def __init__(self, *, total: int | None = None, initial: int = 0, desc: str = "", **_):
                    self.n, self.total, self.desc, self.last = initial, total or 0, desc, 0.0
                    self._send()

                def _send(self) -> None:
                    self.last = time.monotonic()
                    jobs._put(PullProgress(name, self.desc, digest, self.total, self.n))

                def update(self, n: int) -> None:
                    self.n += n
                    if time.monotonic() - self.last >= _EVERY_S or self.n >= self.total:
                        self._send()

                def close(self) -> None:
                    pass

                def __enter__(self):
                    return self

                def __exit__(self, *exc) -> None:
                    pass

            return Bar

        return for_file
