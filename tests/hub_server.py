"""A small stand-in for the Hugging Face hub, for the real huggingface_hub client (no test here reaches the hub).

It answers the routes huggingface_hub 2.x requests for a pull, in the hub's shapes:
- GET /api/models/{org}/{name}/revision/{rev}?blobs=true: the model info, `sha` the commit, `siblings` with
  each file's size and, for LFS files, `lfs.sha256`;
- HEAD/GET /{org}/{name}/resolve/{rev}/{path}: for an LFS file a 302 to a download host of its own
  (`localhost` where the hub is `127.0.0.1`: huggingface_hub follows no redirect off the hub for metadata),
  carrying X-Repo-Commit, X-Linked-Etag (the sha256), X-Linked-Size and the pointer's ETag; for a small file
  a 200 with its git sha1 as ETag;
- GET /lfs/{sha256} on that host: the bytes, with Range requests (206 and Content-Range);
- GET /api/agent-harnesses: an empty list (huggingface_hub fetches it once a day for its User-Agent);
- errors as the hub gives them: 401 with X-Error-Code RepoNotFound for a private or missing repo asked
  without a token, 401 "Invalid credentials in Authorization header" for a bad token, 404 RepoNotFound for a
  missing repo asked with one, 404 EntryNotFound for a missing file.
Faults a test turns on: `cut_after` closes the first download after that many body bytes, `corrupt` flips
one byte of every download (same length), `short` sends one byte less (and says so in Content-Length), `pace`
spreads each download's body over that many seconds; a
`gated` repo refuses its files with 403 GatedRepo. `log` records every request (method, path, Range).
"""

from __future__ import annotations

import hashlib
import json
import re
import threading
import time
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import unquote, urlsplit

TOKEN = "hf_" + "t" * 34  # the one token the server accepts


def git_sha1(data: bytes) -> str:
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()


@dataclass
class Repo:
    files: dict[str, bytes | str]  # path -> bytes, or the path of a file on disk (large ones are read once, hashed)
    private: bool = False
    gated: bool = (
        False  # listed to all, its files refused (403 GatedRepo) as to an account that did not accept its terms
    )
    commit: str = "c0ffee" + "0" * 34
    _meta: dict = field(default_factory=dict)

    def meta(self, path: str) -> tuple[int, str, bool]:
        """(size, oid, lfs) of a file: GGUFs are LFS files (oid = sha256), small text ones are git blobs (sha1)."""
        if path not in self._meta:
            data = self.read(path)
            lfs = path.endswith(".gguf")
            self._meta[path] = (len(data), hashlib.sha256(data).hexdigest() if lfs else git_sha1(data), lfs)
        return self._meta[path]

    def read(self, path: str) -> bytes:
        src = self.files[path]
        if isinstance(src, str):
            with open(src, "rb") as f:
                return f.read()
        return src


class FakeHub:
    def __init__(self, repos: dict[str, Repo]):
        self.repos = repos
        self.log: list[tuple[str, str, str | None]] = []
        self.cut_after: int | None = None
        self.corrupt = False
        self.short = False  # downloads one byte short, with a Content-Length that agrees
        self.pace = 0.0  # seconds each download's body takes
        self.sent = 0  # body bytes of downloads sent
        self._blobs: dict[str, tuple[Repo, str]] = {}
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), _handler(self))
        self._server.daemon_threads = True
        self.port = self._server.server_address[1]
        self.endpoint = f"http://127.0.0.1:{self.port}"
        self.lfs_host = f"http://localhost:{self.port}"
        self._thread = threading.Thread(target=self._server.serve_forever, args=(0.05,), daemon=True)

    def __enter__(self) -> FakeHub:
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._server.shutdown()
        self._server.server_close()

    def downloads(self) -> list[tuple[str, str | None]]:
        """The byte downloads asked for: (path, Range header)."""
        return [(p, r) for m, p, r in self.log if m == "GET" and p.startswith("/lfs/")]

    def blob(self, sha: str) -> bytes | None:
        found = self._blobs.get(sha)
        return found[0].read(found[1]) if found else None


class _Handler(BaseHTTPRequestHandler):
    """The hub's HTTP side, for the FakeHub _handler gives it."""

    hub: FakeHub
    protocol_version = "HTTP/1.1"

    def log_message(self, *args) -> None:  # quiet: the tests read hub.log
        pass

    def do_HEAD(self) -> None:
        self._route(body=False)

    def do_GET(self) -> None:
        self._route(body=True)

    def _route(self, body: bool) -> None:
        path = unquote(urlsplit(self.path).path)
        self.hub.log.append((self.command, path, self.headers.get("Range")))
        if path == "/api/agent-harnesses":  # huggingface_hub's user-agent telemetry asks once a day (cached in HF_HOME)
            return self._send(
                200, b'{"standardEnvVars": [], "harnesses": {}}', {"Content-Type": "application/json"}, body
            )
        if m := re.fullmatch(r"/api/models/([^/]+/[^/]+)/revision/([^/]+)", path):
            return self._info(m.group(1), body)
        if m := re.fullmatch(r"/([^/]+/[^/]+)/resolve/([^/]+)/(.+)", path):
            return self._resolve(m.group(1), m.group(2), m.group(3), body)
        if m := re.fullmatch(r"/lfs/([0-9a-f]{64})", path):
            return self._lfs(m.group(1), body)
        self._send(404, b"not found", {"X-Error-Code": "EntryNotFound"}, body)

    def _repo(self, name: str, body: bool) -> Repo | None:
        auth = self.headers.get("Authorization")
        if auth is not None and auth != f"Bearer {TOKEN}":
            self._send(
                401,
                b'{"error":"Invalid credentials in Authorization header"}',
                {"X-Error-Message": "Invalid credentials in Authorization header"},
                body,
            )
            return None
        repo = self.hub.repos.get(name)
        if repo is None or (repo.private and auth is None):
            status = 404 if auth else 401  # the hub hides private repos: without a token, everything is 401
            self._send(
                status,
                b'{"error":"Repository not found"}',
                {"X-Error-Code": "RepoNotFound", "X-Error-Message": "Repository not found"},
                body,
            )
            return None
        return repo

    def _info(self, name: str, body: bool) -> None:
        repo = self._repo(name, body)
        if repo is None:
            return
        siblings = []
        for p in sorted(repo.files):
            size, oid, lfs = repo.meta(p)
            sib = {"rfilename": p, "size": size, "blobId": git_sha1(b"pointer " + oid.encode()) if lfs else oid}
            if lfs:
                sib["lfs"] = {"sha256": oid, "size": size, "pointerSize": 134}
            siblings.append(sib)
        info = {
            "_id": "x",
            "id": name,
            "modelId": name,
            "sha": repo.commit,
            "private": repo.private,
            "siblings": siblings,
        }
        self._send(200, json.dumps(info).encode(), {"Content-Type": "application/json"}, body)

    def _resolve(self, name: str, rev: str, path: str, body: bool) -> None:
        repo = self._repo(name, body)
        if repo is None:
            return
        if rev not in ("main", repo.commit):
            return self._send(404, b"", {"X-Error-Code": "RevisionNotFound"}, body)
        if path not in repo.files:
            return self._send(404, b"", {"X-Error-Code": "EntryNotFound"}, body)
        if repo.gated:
            msg = f"Access to model {name} is restricted. You must have access to it and be authenticated."
            return self._send(403, b"", {"X-Error-Code": "GatedRepo", "X-Error-Message": msg}, body)
        size, oid, lfs = repo.meta(path)
        headers = {"X-Repo-Commit": repo.commit}
        if lfs:
            self.hub._blobs[oid] = (repo, path)
            headers.update(
                {
                    "Location": f"{self.hub.lfs_host}/lfs/{oid}",
                    "X-Linked-Etag": f'"{oid}"',
                    "X-Linked-Size": str(size),
                    "ETag": f'"{git_sha1(oid.encode())}"',
                }
            )
            return self._send(302, b"", headers, body)
        headers["ETag"] = f'"{oid}"'
        self._send(200, repo.read(path), headers, body)

    def _lfs(self, sha: str, body: bool) -> None:
        data = self.hub.blob(sha)
        if data is None:
            return self._send(404, b"", {}, body)
        if self.hub.corrupt:
            data = data[:-100] + bytes([data[-100] ^ 0xFF]) + data[-99:]
        if self.hub.short:
            data = data[:-1]
        start, status = 0, 200
        headers = {"Accept-Ranges": "bytes", "ETag": f'"{hashlib.md5(sha.encode()).hexdigest()}"'}
        if m := re.fullmatch(r"bytes=(\d+)-", self.headers.get("Range") or ""):
            start, status = int(m.group(1)), 206
            if start >= len(data):
                return self._send(416, b"", {"Content-Range": f"bytes */{len(data)}"}, body)
            headers["Content-Range"] = f"bytes {start}-{len(data) - 1}/{len(data)}"
        part = data[start:]
        if not body:
            return self._send(status, b"", {**headers, "Content-Length": str(len(part))}, False)
        self.send_response(status)
        for k, v in {
            **headers,
            "Content-Length": str(len(part)),
            "Content-Type": "application/octet-stream",
        }.items():
            self.send_header(k, v)
        self.end_headers()
        cut, self.hub.cut_after = self.hub.cut_after, None
        if cut is not None:  # the connection drops after `cut` bytes: the client sees a short body
            self.wfile.write(part[:cut])
            self.hub.sent += min(cut, len(part))
            self.wfile.flush()
            self.close_connection = True
            return
        pieces = 20 if self.hub.pace else 1
        for i in range(pieces):  # `pace`: the body takes that many seconds, in even pieces
            self.wfile.write(part[i * len(part) // pieces : (i + 1) * len(part) // pieces])
            self.wfile.flush()
            time.sleep(self.hub.pace / pieces)
        self.hub.sent += len(part)

    def _send(self, status: int, data: bytes, headers: dict, body: bool) -> None:
        self.send_response(status)
        for k, v in headers.items():
            self.send_header(k, v)
        if "Content-Length" not in headers:
            self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        if body:
            self.wfile.write(data)


def _handler(hub: FakeHub) -> type[_Handler]:
    return type("Handler", (_Handler,), {"hub": hub})


def split_gguf(src: str, dest: str, parts: int) -> list[str]:
    """A copy of a GGUF file in llama.cpp's split format (gguf-split's: the first part holds every key, each part
    `split.no`, `split.count` and `split.tensors.count`, files named `{stem}-0000i-of-0000n.gguf`), written by the
    `gguf` package's writer; the paths of the parts."""
    import gguf
    from gguf.scripts.gguf_new_metadata import copy_with_new_metadata

    reader = gguf.GGUFReader(src, "r")
    arch = reader.fields[gguf.Keys.General.ARCHITECTURE].contents()
    per_part = -(-len(reader.tensors) // parts)
    writer = gguf.GGUFWriter(dest, arch=arch, endianess=reader.endianess, split_max_tensors=per_part)
    copy_with_new_metadata(reader, writer, {}, [])
    stem = dest[: -len(".gguf")]
    return [f"{stem}-{i:05d}-of-{parts:05d}.gguf" for i in range(1, parts + 1)]
