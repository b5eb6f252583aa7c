"""Pulling a model by name into the Hugging Face cache, with resume and checks, and finding it there offline.

Files land in the standard cache (HF_HUB_CACHE, else HF_HOME/hub, else ~/.cache/huggingface/hub) in its
layout (https://huggingface.co/docs/hub/local-cache): blobs/<sha256>, snapshots/<commit>/<file> linking to
it, refs/main holding the commit; other tools that use the cache (huggingface_hub, llama.cpp) find these
files, and cllm finds theirs. huggingface_hub does the talking: HF_ENDPOINT, HF_TOKEN, the hub's redirects,
error codes and ETags, retries that resume a cut download. cllm adds what its hf_hub_download does not do:
the partial file keeps one name between runs (blobs/<sha256>.incomplete), so a pull that was stopped resumes
where it stopped, and a finished file is hashed, and a GGUF checked (cllm/core/gguf_check.py), before it enters
the cache: one whose size or sha256 is not the hub's, or whose counts and offsets do not fit in it, is removed,
never served.
"""

from __future__ import annotations

import hashlib
import os
import re
import shutil
import sys
from collections.abc import Callable

import httpx2
from huggingface_hub import HfApi, constants, get_hf_file_metadata, hf_hub_url
from huggingface_hub.errors import (
    GatedRepoError,
    HfHubHTTPError,
    OfflineModeIsEnabled,
    RepositoryNotFoundError,
    RevisionNotFoundError,
)
from huggingface_hub.file_download import http_get
from huggingface_hub.utils import WeakFileLock, build_hf_headers

from cllm.core.gguf_check import GGUFError, check
from cllm.hub.names import RepoFile, choose, parse_name
from cllm.hub.progress import progress_class
from cllm.hub.store import REVISION, Model, StoreError, default_cache, find, repo_folder

_COMMIT = re.compile(r"^[0-9a-f]{40}$")
_OID = re.compile(r"^(?:[0-9a-f]{40}|[0-9a-f]{64})$")  # git's sha1 of a small file, sha256 of an LFS one
_CHUNK = 1 << 20


class HubError(Exception):
    """One sentence: what went wrong with which repo, and what to do."""


class Hub:
    """A hub and a cache; None takes huggingface_hub's own settings (HF_ENDPOINT, HF_HUB_CACHE or HF_HOME, HF_TOKEN,
    HF_HUB_OFFLINE)."""

    def __init__(
        self,
        *,
        endpoint: str | None = None,
        cache_dir: str | None = None,
        token: str | bool | None = None,
        offline: bool | None = None,
        progress: Callable[[str], type] | None = None,
    ):
        self.endpoint = (endpoint or constants.ENDPOINT).rstrip("/")
        self.cache_dir = cache_dir or default_cache()
        self.token = token  # None: HF_TOKEN, else the one `hf auth login` stored; False: none
        self.offline = constants.HF_HUB_OFFLINE if offline is None else offline
        # The sha256 of a file about to download -> what draws its progress (tqdm's face); None: a bar or lines
        self.progress = progress

    def pull(self, name: str) -> Model:
        """The model `name` means, downloaded unless the cache has it; HubNameError or HubError say why not."""
        repo, quant = parse_name(name)
        if self.offline:
            return self.cached(name)
        try:
            commit, files = self._listing(repo)
        except _Unreachable as e:
            try:
                found = find(self.cache_dir, name)
            except StoreError:
                raise HubError(
                    f"cannot reach {self.endpoint} for {repo} ({e}), and the cache has no copy of {name}"
                ) from None
            print(f"cllm: cannot reach {self.endpoint} ({e}); using the cached {found.name}", file=sys.stderr)
            return found
        choice = choose(repo, quant, files)
        fetched, paths = 0, []
        try:
            for f in (*choice.files, *([choice.mmproj] if choice.mmproj else [])):
                path, n = self._fetch(repo, commit, f)
                paths.append(path)
                fetched += n
        except _Unreachable as e:
            raise HubError(
                f"the download of {name} from {self.endpoint} broke off ({e}); the same command resumes it"
            ) from None
        self._write_ref(repo, commit)
        n = len(choice.files)
        return Model(choice.name, paths[0], tuple(paths[:n]), paths[n] if choice.mmproj else None, fetched)

    def cached(self, name: str) -> Model:
        """The model `name` means among the cached files, without the network."""
        try:
            return find(self.cache_dir, name)
        except StoreError as e:
            raise HubError(
                f"{name} cannot be fetched offline (--offline or HF_HUB_OFFLINE=1): {e}; "
                f"`cllm pull {name}` where the hub can be reached fetches it"
            ) from None

    def _listing(self, repo: str) -> tuple[str, list[RepoFile]]:
        """The commit `main` points at and its files (with sizes and sha256), from the hub's model info."""
        with self._errors(repo):
            info = HfApi(endpoint=self.endpoint, token=self.token).model_info(
                repo, revision=REVISION, files_metadata=True
            )
        commit = info.sha or ""
        if not _COMMIT.match(commit):
            raise HubError(f"the hub gave {repo} a commit id that is not one ({info.sha!r}); refused")
        files = []
        for s in info.siblings or []:
            _check_path(repo, s.rfilename)
            lfs = s.lfs
            files.append(RepoFile(s.rfilename, lfs.size if lfs else s.size, lfs.sha256 if lfs else None))
        return commit, files

    def _fetch(self, repo: str, commit: str, f: RepoFile) -> tuple[str, int]:
        """The file's path in the snapshot, downloaded (and checked) unless there; and the bytes fetched."""
        folder = repo_folder(self.cache_dir, repo)
        pointer = os.path.join(folder, "snapshots", commit, *f.path.split("/"))
        if os.path.exists(pointer) and (f.size is None or os.path.getsize(pointer) == f.size):
            return pointer, 0
        with self._errors(repo):
            meta = get_hf_file_metadata(
                hf_hub_url(repo, f.path, revision=commit, endpoint=self.endpoint),
                token=self.token,
                endpoint=self.endpoint,
            )
        etag = meta.etag or ""
        if not _OID.match(etag) or (f.sha256 and etag != f.sha256):
            raise HubError(
                f"{f.path} of {repo}: the hub lists sha256 {f.sha256} but its download has ETag {etag!r}; refused"
            )
        size = meta.size if meta.size is not None else f.size
        if f.size is not None and size != f.size:
            raise HubError(f"{f.path} of {repo}: the hub lists {f.size} bytes but its download has {size}; refused")
        blob = os.path.join(folder, "blobs", etag)
        fetched = 0
        if not os.path.exists(blob):
            with self._errors(repo):
                fetched = self._download(repo, meta.location, blob, etag, size, f.path)
        _link(blob, pointer)
        return pointer, fetched

    def _download(self, repo: str, url: str, blob: str, etag: str, size: int | None, label: str) -> int:
        os.makedirs(os.path.dirname(blob), exist_ok=True)
        lock = os.path.join(
            self.cache_dir, ".locks", os.path.basename(repo_folder(self.cache_dir, repo)), etag + ".lock"
        )
        os.makedirs(os.path.dirname(lock), exist_ok=True)
        with WeakFileLock(lock):  # the lock huggingface_hub takes for the same blob
            if os.path.exists(blob):
                return 0
            part = blob + ".incomplete"
            have = os.path.getsize(part) if os.path.exists(part) else 0
            if size is not None and have > size:
                os.remove(part)
                have = 0
            try:
                with open(part, "ab") as out:
                    http_get(
                        url,
                        out,
                        resume_size=have,
                        headers=build_hf_headers(token=self.token),
                        expected_size=size,
                        displayed_filename=label,
                        tqdm_class=self.progress(etag) if self.progress else progress_class(),
                    )
            except OSError as e:  # http_get's size check (no errno), or the disk
                if isinstance(e, HfHubHTTPError):
                    raise
                if e.errno is not None:
                    raise HubError(f"cannot write {part} for {repo}: {e.strerror}") from None
                got = os.path.getsize(part)
                _remove(part)
                raise HubError(
                    f"{label} of {repo} did not download whole ({got} of {size} bytes); the partial file was removed, "
                    "pull again"
                ) from None
            got = os.path.getsize(part)
            digest = _digest(part, etag)
            if (size is not None and got != size) or digest != etag:
                _remove(part)
                kind = "sha256" if len(etag) == 64 else "git sha1"
                raise HubError(
                    f"{label} of {repo} does not match the hub's checksum ({got} bytes, {kind} {digest}, expected "
                    f"{size} bytes, {etag}); it was removed and not served, pull again"
                )
            _check_gguf(repo, label, part)
            os.replace(part, blob)
            return got - have

    def _write_ref(self, repo: str, commit: str) -> None:
        ref = os.path.join(repo_folder(self.cache_dir, repo), "refs", REVISION)
        os.makedirs(os.path.dirname(ref), exist_ok=True)
        with open(ref + ".tmp", "w") as f:
            f.write(commit)
        os.replace(ref + ".tmp", ref)

    def _errors(self, repo: str) -> _HubErrors:
        return _HubErrors(self, repo)


class _Unreachable(Exception):
    """The hub could not be reached at all (not an answer from it)."""


class _HubErrors:
    """The hub's answers and failures as one sentence naming the repo and what to do."""

    def __init__(self, hub: Hub, repo: str):
        self.hub, self.repo = hub, repo

    def __enter__(self) -> None:
        return None

    def __exit__(self, kind, e, tb) -> None:
        if e is None or isinstance(e, (HubError, _Unreachable)):
            return
        repo, url = self.repo, f"{self.hub.endpoint}/{self.repo}"
        token = "set HF_TOKEN (or `hf auth login`) to a token that may read it"
        if isinstance(e, GatedRepoError):
            raise HubError(f"{repo} is a gated repo: accept its terms at {url}, then {token}") from None
        if isinstance(e, RepositoryNotFoundError):
            raise HubError(
                f"{repo} was not found on {self.hub.endpoint} (HTTP {e.response.status_code}): check the name, or, "
                f"if it is private or gated, {token}"
            ) from None
        if isinstance(e, RevisionNotFoundError):
            raise HubError(f"{repo} has no branch '{REVISION}' on {self.hub.endpoint}") from None
        if isinstance(e, HfHubHTTPError) and e.response is not None:
            status = e.response.status_code
            if status == 401:
                raise HubError(f"the hub refused the token for {repo} (HTTP 401): {token}") from None
            if status == 403:
                raise HubError(f"the token may not read {repo} (HTTP 403): {token}, with read access") from None
            raise HubError(f"the hub answered HTTP {status} for {repo} ({url}); try again later") from None
        if isinstance(e, (OfflineModeIsEnabled, httpx2.TransportError, ConnectionError)):
            raise _Unreachable(str(e) or type(e).__name__) from None


def _check_path(repo: str, path: str) -> None:
    """A file name from the hub becomes a path in the cache: nothing that climbs out of it."""
    parts = path.split("/")
    if path.startswith("/") or "\\" in path or any(p in ("", ".", "..") for p in parts):
        raise HubError(f"the hub lists a file of {repo} with an unsafe name ({path!r}); refused")


def _check_gguf(repo: str, label: str, part: str) -> None:
    """A GGUF from the network is held against its own counts and offsets before it enters the cache."""
    if not label.endswith(".gguf"):
        return
    try:
        check(part)
    except GGUFError as e:
        _remove(part)
        raise HubError(f"{label} of {repo} is not a sound GGUF file: {e}; it was removed and not served") from None


def _digest(path: str, etag: str) -> str:
    """The file's hash in the ETag's kind: sha256 (an LFS file), or git's blob sha1."""
    if len(etag) == 64:
        h = hashlib.sha256()
    else:
        h = hashlib.sha1()
        h.update(b"blob %d\0" % os.path.getsize(path))
    with open(path, "rb") as f:
        while chunk := f.read(_CHUNK):
            h.update(chunk)
    return h.hexdigest()


def _link(blob: str, pointer: str) -> None:
    """The snapshot's entry for a blob: a relative link as huggingface_hub makes, a copy where links fail."""
    os.makedirs(os.path.dirname(pointer), exist_ok=True)
    tmp = pointer + ".tmp"
    _remove(tmp)
    try:
        os.symlink(os.path.relpath(blob, os.path.dirname(pointer)), tmp)
    except OSError:
        shutil.copyfile(blob, tmp)
    os.replace(tmp, pointer)


def _remove(path: str) -> None:
    try:
        os.remove(path)
    except FileNotFoundError:
        pass
