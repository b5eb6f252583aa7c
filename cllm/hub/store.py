"""The models in the Hugging Face cache, by name: found without the network, listed, removed.

The cache is the standard one (https://huggingface.co/docs/hub/local-cache): a folder per repo,
`models--{org}--{name}`, its commits' files under snapshots/{commit}/ as links to blobs/, and refs/main
naming the commit of `main`. Whatever put a GGUF there (`cllm pull`, llama.cpp, huggingface_hub) makes a
model of it; a name means the same files here as on the hub (cllm/hub/names.py).
"""

from __future__ import annotations

import os
import shutil
from dataclasses import dataclass

from cllm.hub.names import Choice, HubNameError, RepoFile, choose, models, parse_name

REVISION = "main"


class StoreError(Exception):
    """A name the cache cannot answer: one sentence saying what it has."""


@dataclass(frozen=True)
class Model:
    name: str  # org/repo:QUANT, the model's name in the registry
    path: str  # the model's file (a split model's first part: llama.cpp finds the others beside it)
    files: tuple[str, ...]  # every part
    mmproj: str | None  # the repo's vision projector, served with the model (--mmproj-auto)
    fetched: int = 0  # bytes the pull that gave it downloaded

    @property
    def size(self) -> int:
        return sum(os.path.getsize(p) for p in self.files)


def default_cache() -> str:
    """huggingface_hub's cache folder: HF_HUB_CACHE, else HF_HOME/hub, else ~/.cache/huggingface/hub."""
    from huggingface_hub import constants

    return constants.HF_HUB_CACHE


def repo_folder(cache_dir: str, repo: str) -> str:
    return os.path.join(cache_dir, "models--" + repo.replace("/", "--"))


def snapshots(folder: str) -> list[str]:
    """A repo's cached commits: refs/main's first, then the newest."""
    root = os.path.join(folder, "snapshots")
    if not os.path.isdir(root):
        return []
    commits = sorted(os.listdir(root), key=lambda c: -os.path.getmtime(os.path.join(root, c)))
    try:
        with open(os.path.join(folder, "refs", REVISION)) as f:
            main = f.read().strip()
    except OSError:
        main = None
    return sorted(commits, key=lambda c: c != main)


def _files(root: str) -> list[RepoFile]:
    """A snapshot's files (links that lead nowhere left out), by repo path."""
    out = []
    for here, _, names in os.walk(root):
        for name in names:
            full = os.path.join(here, name)
            if os.path.exists(full):
                out.append(RepoFile(os.path.relpath(full, root).replace(os.sep, "/")))
    return sorted(out, key=lambda f: f.path)


def _local(root: str, choice: Choice) -> Model:
    def at(f: RepoFile) -> str:
        return os.path.join(root, *f.path.split("/"))

    return Model(
        choice.name,
        at(choice.files[0]),
        tuple(at(f) for f in choice.files),
        at(choice.mmproj) if choice.mmproj else None,
    )


def find(cache_dir: str, name: str) -> Model:
    """The cached model `name` means; StoreError saying what the cache has if none."""
    repo, quant = parse_name(name)
    folder = repo_folder(cache_dir, repo)
    problem = None
    for commit in snapshots(folder):
        root = os.path.join(folder, "snapshots", commit)
        try:
            return _local(root, choose(repo, quant, _files(root)))
        except HubNameError as e:
            problem = e
    raise StoreError(
        f"{cache_dir} holds {repo} but not {name}: {problem}" if problem else f"{cache_dir} has no copy of {name}"
    )


def listed(cache_dir: str) -> list[Model]:
    """Every whole GGUF model in the cache, by name (the newest commit's where several hold one)."""
    out: dict[str, Model] = {}
    if not os.path.isdir(cache_dir):
        return []
    for entry in sorted(os.listdir(cache_dir)):
        if not entry.startswith("models--") or "--" not in entry[len("models--") :]:
            continue
        repo = entry[len("models--") :].replace("--", "/", 1)
        try:
            parse_name(repo)
        except HubNameError:
            continue
        folder = os.path.join(cache_dir, entry)
        for commit in snapshots(folder):
            root = os.path.join(folder, "snapshots", commit)
            for choice in models(repo, _files(root)):
                out.setdefault(choice.name, _local(root, choice))
    return list(out.values())


def remove(cache_dir: str, name: str) -> int:
    """Delete a model's files from the cache (every commit's), and the repo's folder once no model is left in it;
    the bytes freed. Blobs another link still uses stay."""
    model = find(cache_dir, name)
    repo = parse_name(name)[0]
    folder = repo_folder(cache_dir, repo)
    wanted = {os.path.relpath(p, _snapshot_of(p)) for p in model.files}
    freed = 0
    doomed_blobs = set()
    for commit in snapshots(folder):
        root = os.path.join(folder, "snapshots", commit)
        for path in wanted:
            full = os.path.join(root, path)
            if os.path.lexists(full):
                if os.path.islink(full):
                    doomed_blobs.add(os.path.realpath(full))
                else:
                    freed += os.path.getsize(full)
                os.remove(full)
    kept = {
        os.path.realpath(os.path.join(here, n))
        for here, _, names in os.walk(os.path.join(folder, "snapshots"))
        for n in names
    }
    for blob in doomed_blobs - kept:
        if os.path.exists(blob):
            freed += os.path.getsize(blob)
            os.remove(blob)
    if not any(m.name.startswith(repo + ":") or m.name == repo for m in listed(cache_dir)):
        freed += _tree_size(folder)
        shutil.rmtree(folder, ignore_errors=True)
        shutil.rmtree(os.path.join(cache_dir, ".locks", os.path.basename(folder)), ignore_errors=True)
    return freed


def _snapshot_of(path: str) -> str:
    """The snapshots/{commit} folder a cached file is under."""
    head, commit_and_rest = path.split(os.sep + "snapshots" + os.sep, 1)
    return os.path.join(head, "snapshots", commit_and_rest.split(os.sep, 1)[0])


def _tree_size(folder: str) -> int:
    return sum(
        os.path.getsize(os.path.join(here, n))
        for here, _, names in os.walk(folder)
        for n in names
        if not os.path.islink(os.path.join(here, n)) and os.path.exists(os.path.join(here, n))
    )
