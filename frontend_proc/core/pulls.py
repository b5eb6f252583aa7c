"""Models pulled, deleted and aliased over HTTP: the one place the doors' management routes call (Ollama's
/api/pull, /api/delete, /api/copy; /models and /models/load).

The supervisor runs a pull (`cllm pull`'s code: the Hugging Face cache, resume, checksums, the GGUF check) when
asked on the control pipe, and tells each file's bytes and the end on the lifeline (cllm/hub/jobs.py); what it
said is kept here for every request that follows the pull. One pull of a repo runs at a time: a request for the
same name follows the one under way, one for another quantization of the repo waits for it. With --pulled a
pulled model joins the registry at once, on rings made at start-up for that (cllm/core/launch.py: PULL_SLOTS),
and can be chatted with. Nothing here runs unless --allow-pull says so; a name is a hub repo's
(`org/repo[:QUANT]`, `hf.co/org/repo[:QUANT]` as Ollama spells one), never a URL or a path.
"""

from __future__ import annotations

import asyncio
import logging
import os
import re
from dataclasses import dataclass, field

from cllm.core.config import HF_QUANT, HF_REPO, ServeConfig
from cllm.core.errors import ApiError, invalid
from cllm.core.launch import ModelSlot, SpareSlot
from cllm.core.protocol import DeleteEnded, DeleteModel, PullEnded, PullModel, PullProgress
from frontend_proc.core.pool import Model, ModelPool

OFF = (
    "pulling, deleting and copying models over HTTP is off: start cllm with --allow-pull "
    "(or `allow-pull: true` in its config file)"
)
_PREFIXES = ("hf.co/", "huggingface.co/")  # how Ollama names a Hugging Face model
_NAME = re.compile(f"({HF_REPO})(?::{HF_QUANT})?")

log = logging.getLogger("cllm.frontend")


def hub_name(text: str) -> str:
    """`org/repo[:QUANT]` from what a client sent; a 400 for anything else (a URL, a path, a file name)."""
    name = text.strip()
    for prefix in _PREFIXES:
        name = name.removeprefix(prefix)
    name = name.removesuffix(":latest")
    if not _NAME.fullmatch(name) or len(name) > 300 or name.lower().endswith(".gguf"):
        raise invalid(
            f"{text!r} is not a Hugging Face model name (org/repo or org/repo:QUANT, as unsloth/phi-4-GGUF:Q4_K_M): "
            "a pull names a hub repo, never a URL or a path",
            "model",
        )
    return name


@dataclass
class FileProgress:
    path: str  # the file's name in the repo
    digest: str  # its sha256
    total: int
    completed: int


@dataclass
class Pull:
    """One pull, under way or ended; what every request that follows it reads."""

    name: str
    repo: str
    files: dict[str, FileProgress] = field(default_factory=dict)  # by digest, in the order they started
    status: str = "downloading"  # then done or failed
    error: str = ""
    model: str = ""  # the registry's name of what it pulled
    changed: asyncio.Event = field(default_factory=asyncio.Event)  # set and replaced at every change
    ended: asyncio.Event = field(default_factory=asyncio.Event)

    def bump(self) -> None:
        self.changed.set()
        self.changed = asyncio.Event()

    def end(self, error: str = "") -> None:
        self.status, self.error = ("failed", error) if error else ("done", "")
        self.ended.set()
        self.bump()

    async def updates(self):
        """Yields once now and after every change, until the pull ends."""
        while True:
            changed = self.changed
            yield
            if self.ended.is_set():
                return
            await changed.wait()

    def progress(self) -> dict:
        return {
            "completed": sum(f.completed for f in self.files.values()),
            "total": sum(f.total for f in self.files.values()),
        }


class Pulls:
    def __init__(self, config: ServeConfig, pool: ModelPool, spare: list[SpareSlot], cache: str):
        self.allowed = config.allow_pull
        self._config = config
        self._pool = pool
        self._spare = {s.index: s for s in spare}
        self._cache = cache  # where the models a client may delete are
        self._running: dict[str, Pull] = {}  # by repo
        self._asked: dict[str, Pull] = {}  # by name, the pulls the supervisor runs for this frontend
        self.failed: dict[str, Pull] = {}  # the last failed pull of each name, until one succeeds
        self._deleting: dict[str, asyncio.Future[DeleteEnded]] = {}
        self._tasks: set[asyncio.Task] = set()

    def allow(self) -> None:
        """A 403 naming the option unless the operator allowed pulls."""
        if not self.allowed:
            raise ApiError(403, "forbidden", OFF)

    def running(self) -> list[Pull]:
        return list(self._running.values())

    def pull(self, text: str) -> Pull:
        """The pull of `text`: the one under way for that name, or a new one."""
        self.allow()
        name = hub_name(text)
        repo = name.partition(":")[0]
        before = self._running.get(repo)
        if before is not None and before.name == name:
            return before
        pull = self._running[repo] = Pull(name, repo)
        task = asyncio.get_running_loop().create_task(self._run(pull, before))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return pull

    async def _run(self, pull: Pull, before: Pull | None) -> None:
        if before is not None:
            await before.ended.wait()
        while pull.name in self._asked:  # the same name asked before the first ended: one at a time
            await self._asked[pull.name].ended.wait()
        self._asked[pull.name] = pull
        log.info("pulling %s", pull.name, extra={"fields": {"model": pull.name}})
        self._pool.send(PullModel(pull.name))
        await pull.ended.wait()

    def on_notice(self, notice: PullProgress | PullEnded | DeleteEnded) -> None:
        """The supervisor's word on a pull or a deletion this frontend asked for."""
        if isinstance(notice, PullProgress):
            self.on_progress(notice)
        elif isinstance(notice, PullEnded):
            self.on_pulled(notice)
        else:
            self.on_deleted(notice)

    def on_progress(self, notice: PullProgress) -> None:
        pull = self._asked.get(notice.name)
        if pull is not None:
            pull.files[notice.digest] = FileProgress(notice.path, notice.digest, notice.total, notice.completed)
            pull.bump()

    def on_pulled(self, notice: PullEnded) -> None:
        pull = self._asked.pop(notice.name, None)
        spare = self._spare.pop(notice.spare, None)
        if notice.spec is not None and spare is not None:  # (a frontend launched since has it among its models)
            self._pool.add(ModelSlot(spec=notice.spec, rings=spare.rings))
        if pull is None:
            return  # asked by a frontend before this one
        pull.model = notice.model
        if self._running.get(pull.repo) is pull:
            del self._running[pull.repo]
        if notice.error:
            log.error("the pull of %s failed: %s", pull.name, notice.error, extra={"fields": {"model": pull.name}})
            self.failed[pull.name] = pull
        else:
            log.info("pulled %s", notice.model, extra={"fields": {"model": notice.model}})
            self.failed.pop(pull.name, None)
        pull.end(notice.error)

    def on_deleted(self, notice: DeleteEnded) -> None:
        waiting = self._deleting.pop(notice.name, None)
        if waiting is not None and not waiting.done():
            waiting.set_result(notice)

    async def model(self, name: str) -> Model:
        """The registry's model of that name; one not there yet is pulled first when pulls are allowed."""
        try:
            return self._pool.find(name)
        except ApiError as e:
            if not self.allowed or not self._config.pulled or e.status != 404:
                raise
        pull = self.pull(name)
        await pull.ended.wait()
        if pull.status == "failed":
            raise ApiError(400, "pull failed", pull.error, param="model")
        return self._pool.find(pull.model)

    async def delete(self, text: str) -> str:
        """Remove a pulled model from the registry and the cache; its name."""
        self.allow()
        model = self._pool.by_name.get(text) or self._pool.by_name.get(text.removesuffix(":latest"))
        if model is not None and not os.path.abspath(model.spec.path).startswith(os.path.abspath(self._cache) + os.sep):
            raise invalid(
                f"the model {text} is served from {model.spec.path}; cllm deletes only models it pulled", "model"
            )
        name = model.id if model is not None else hub_name(text)
        if model is not None:
            if model is self._pool.default:
                raise invalid(
                    f"{name} is the default model of this server; it cannot be deleted while it serves", "model"
                )
            await self._pool.unload(model, "deleted")
            self._pool.remove(model)
        done = self._deleting.setdefault(name, asyncio.get_running_loop().create_future())
        self._pool.send(DeleteModel(name))
        ended = await done
        if ended.error:
            status, error = (404, "model not found") if ended.missing else (400, "not deleted")
            raise ApiError(status, error, ended.error, param="model")
        log.info("deleted %s", name, extra={"fields": {"model": name}})
        return name

    def copy(self, source: str, destination: str) -> None:
        """Another name for a model (Ollama's copy), while this server runs."""
        self.allow()
        model = self._pool.find(source)
        name = destination.strip().removesuffix(":latest")
        if not name:
            raise invalid("destination is required", "destination")
        if name in self._pool.by_name:
            raise invalid(f"{name} already names a model", "destination")
        model.spec.aliases.append(name)
        self._pool.by_name[name] = model
