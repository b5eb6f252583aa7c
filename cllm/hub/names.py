"""Hugging Face model names (`org/repo[:QUANT]`) and the GGUF files a name picks in a repo.

The rules are llama-server's for `-hf` (llama.cpp common/download.cpp), so its users' commands pick the same
files: a tag matches a file whose path holds it followed by `.` or `-`, case-insensitively; without a tag the
preference is Q4_K_M, then Q8_0, then the repo's first model file. Split files (`-00001-of-00003.gguf`) are
one model, named by their first part; `mmproj`, `imatrix` and draft-head files are never the model. Where
llama-server takes the first of several files a tag matches, this refuses and lists them: a name must mean
one model. Nothing here touches the network or the disk.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from cllm.core.config import HF_QUANT, HF_REPO

DEFAULT_TAGS = ("Q4_K_M", "Q8_0")
_SIDECARS = ("mmproj", "imatrix", "mtp-", "eagle3-", "dflash-", "dspark-")  # GGUFs that are not a model
_SPLIT = re.compile(r"^(.+)-([0-9]{5})-of-([0-9]{5})$", re.IGNORECASE)
_TAG = re.compile(r"[-.]([A-Z0-9_]+)$", re.IGNORECASE)
# Hub repo ids: word characters, with single '.', '-' or '/' between them; exactly one '/'.
_REPO = re.compile(f"^{HF_REPO}$")
_QUANT = re.compile(f"^{HF_QUANT}$")


class HubNameError(ValueError):
    """A name or a repo's files that do not give one model: the message says what the repo has."""


@dataclass(frozen=True)
class RepoFile:
    """A file of a repo, as the hub lists it (sha256 for LFS files, which GGUFs are)."""

    path: str
    size: int | None = None
    sha256: str | None = None


@dataclass(frozen=True)
class Choice:
    """What a name downloads: the model's files (all parts of a split one, first part first) and its mmproj."""

    repo: str
    tag: str  # the quantization of the file chosen, upper case ("" where its name has none)
    files: tuple[RepoFile, ...]
    mmproj: RepoFile | None

    @property
    def name(self) -> str:
        """The model's name in the registry: `org/repo:QUANT`."""
        return f"{self.repo}:{self.tag}" if self.tag else self.repo


def parse_name(text: str) -> tuple[str, str | None]:
    """`org/repo[:QUANT]` as (repo, quant or None); HubNameError for anything else."""
    repo, _, quant = text.partition(":")
    if not _REPO.match(repo) or len(repo) > 256:
        raise HubNameError(
            f"{text!r} is not a Hugging Face model name: expected org/repo or org/repo:QUANT "
            "(as unsloth/phi-4-GGUF:Q4_K_M)"
        )
    if quant and not _QUANT.match(quant):
        raise HubNameError(f"{text!r}: the quantization after ':' is letters, digits and '_' (as Q4_K_M)")
    return repo, quant or None


def is_hub_name(text: str) -> bool:
    """Whether a string reads as a hub name rather than a path (which ends in .gguf or names a file)."""
    try:
        parse_name(text)
    except HubNameError:
        return False
    return not text.lower().endswith(".gguf")


@dataclass(frozen=True)
class _Split:
    prefix: str  # the path without `-0000i-of-0000n.gguf` (or `.gguf`)
    tag: str
    index: int
    count: int


def _split(path: str) -> _Split:
    """A GGUF path's model prefix, quantization tag and split part (1 of 1 unless split)."""
    prefix, index, count = path.removesuffix(".gguf").removesuffix(".GGUF"), 1, 1
    m = _SPLIT.match(prefix)
    if m:
        prefix, index, count = m.group(1), int(m.group(2)), int(m.group(3))
    t = _TAG.search(prefix)
    return _Split(prefix, t.group(1).upper() if t else "", index, count)


def _is_gguf(path: str) -> bool:
    return path.lower().endswith(".gguf")


def _is_model(path: str) -> bool:
    name = path.rsplit("/", 1)[-1]
    return _is_gguf(name) and not any(s in name for s in _SIDECARS)


def _bits(tag: str) -> int:
    """Q4_K_M -> 4, F16 -> 16: the number a quantization starts with."""
    m = re.search(r"[0-9]+", tag)
    return int(m.group()) if m else 0


def _first_parts(files: list[RepoFile]) -> list[RepoFile]:
    """The repo's model files, a split model by its first part only."""
    return [f for f in files if _is_model(f.path) and _split(f.path).index == 1]


def _matching(files: list[RepoFile], tag: str) -> list[RepoFile]:
    pattern = re.compile(re.escape(tag) + r"[.-]", re.IGNORECASE)
    return [f for f in _first_parts(files) if pattern.search(f.path)]


def _parts(files: list[RepoFile], first: RepoFile) -> tuple[RepoFile, ...]:
    s = _split(first.path)
    if s.count == 1:
        return (first,)
    by_index = {}
    for f in files:
        o = _split(f.path)
        if _is_gguf(f.path) and o.prefix == s.prefix and o.count == s.count:
            by_index[o.index] = f
    missing = [i for i in range(1, s.count + 1) if i not in by_index]
    if missing:
        raise HubNameError(
            f"{first.path} is split in {s.count} parts but the repo lacks part(s) {', '.join(map(str, missing))}"
        )
    return tuple(by_index[i] for i in range(1, s.count + 1))


def _mmproj(files: list[RepoFile], model: RepoFile) -> RepoFile | None:
    """llama-server's pick: an mmproj GGUF in the model's folder or one above it, the deepest, then the
    quantization closest to the model's."""
    model_dir = model.path.split("/")[:-1]
    bits = _bits(_split(model.path).tag)
    best, best_key = None, None
    for f in files:
        if not _is_gguf(f.path) or "mmproj" not in f.path:
            continue
        d = f.path.split("/")[:-1]
        if model_dir[: len(d)] != d:
            continue
        key = (-len(d), abs(_bits(_split(f.path).tag) - bits))
        if best_key is None or key < best_key:
            best, best_key = f, key
    return best


def listing(files: list[RepoFile]) -> str:
    """The repo's models as a name's tags pick them, for an error message."""
    tags = []
    for f in _first_parts(files):
        s = _split(f.path)
        parts = f" ({s.count} parts)" if s.count > 1 else ""
        tags.append(f"{s.tag or '(no tag)'}: {f.path}{parts}")
    return "; ".join(tags) if tags else "no GGUF model file"


def choose(repo: str, quant: str | None, files: list[RepoFile]) -> Choice:
    """The files `repo[:quant]` means among a repo's files; HubNameError listing the repo's models if none or
    several."""
    if quant:
        found = _matching(files, quant)
        if not found:
            raise HubNameError(f"{repo} has no GGUF file for quantization {quant}; it has {listing(files)}")
    else:
        found = []
        for tag in DEFAULT_TAGS:
            found = _matching(files, tag)
            if found:
                break
        else:
            found = _first_parts(files)[:1]  # llama-server's fallback: the first model file
            if not found:
                raise HubNameError(f"{repo} has no GGUF model file ({len(files)} files in it)")
    if len(found) > 1:
        raise HubNameError(
            f"{repo}: quantization {quant or _split(found[0].path).tag} is ambiguous, it matches "
            f"{', '.join(f.path for f in found)}; the repo has {listing(files)}"
        )
    first = found[0]
    return Choice(repo=repo, tag=_split(first.path).tag, files=_parts(files, first), mmproj=_mmproj(files, first))


def models(repo: str, files: list[RepoFile]) -> list[Choice]:
    """Every whole model among a repo's files (a split one missing parts is none)."""
    out = []
    for first in _first_parts(files):
        try:
            out.append(
                Choice(repo=repo, tag=_split(first.path).tag, files=_parts(files, first), mmproj=_mmproj(files, first))
            )
        except HubNameError:
            continue
    return out
