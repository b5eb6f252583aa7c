"""The API key, where the server listens, and the shared memory's names and modes."""

from __future__ import annotations

import os
import stat
import tempfile

import psutil

from cllm.core import ring
from cllm.core.config import ServeConfig
from tests.conftest import API_KEY as KEY
from tests.conftest import child


def test_every_route_but_health_wants_the_key(keyed):
    with keyed.client() as http:
        assert http.get("/health").status_code == 200
        for method, path in (
            ("GET", "/"),
            ("GET", "/model/info"),
            ("GET", "/openapi.json"),
            ("POST", "/generate"),
            ("POST", "/encode"),
            ("GET", "/nope"),
            ("GET", "/v1/models"),
            ("POST", "/v1/chat/completions"),
        ):
            for auth in (None, "Bearer wrong", f"Basic {KEY}", KEY):
                r = http.request(method, path, headers={"authorization": auth} if auth else {}, json={"text": "x"})
                assert r.status_code == 401, (method, path, auth)
                assert r.headers["www-authenticate"] == "Bearer"
                body = r.json()
                assert (
                    body["error"]["code"] == "invalid_api_key"
                    if path.startswith("/v1/")
                    else body["error"] == "unauthorized"
                )
        good = {"authorization": f"Bearer {KEY}"}
        assert http.get("/", headers=good).status_code == 200
        assert http.get("/v1/models", headers=good).json()["data"][0]["object"] == "model"
        r = http.post("/generate", json={"prompt": "Hi", "max_tokens": 2}, headers=good)
        assert r.status_code == 200 and r.json()["data"]["generated_tokens"] == 2
        doc = http.get("/openapi.json", headers=good).json()
        assert doc["components"]["securitySchemes"] == {"bearer": {"type": "http", "scheme": "bearer"}}
        assert doc["paths"]["/health"]["get"]["security"] == []


def test_the_key_is_in_no_command_line_and_not_given_to_the_engine(keyed):
    procs = [psutil.Process(keyed.proc.pid), *psutil.Process(keyed.proc.pid).children()]
    assert all(KEY not in " ".join(p.cmdline()) for p in procs)
    assert "CLLM_API_KEY" not in child(keyed, "engine_proc").environ()


def test_listens_on_localhost_by_default(server):
    assert ServeConfig().host == "127.0.0.1"
    listening = [
        c.laddr for c in psutil.Process(server.proc.pid).net_connections("tcp") if c.status == psutil.CONN_LISTEN
    ]
    assert listening and all(addr.ip == "127.0.0.1" for addr in listening)


def test_ring_memory_is_owner_only_and_nameless():
    fd = ring._anonymous_memory(4096)
    try:
        st = os.fstat(fd)
        assert stat.S_IMODE(st.st_mode) == 0o600 and st.st_size == 4096
    finally:
        os.close(fd)


def test_without_memfd_the_file_is_0600_and_unlinked_at_once(monkeypatch, tmp_path):
    monkeypatch.delattr(os, "memfd_create", raising=False)
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    made = []
    real_mkstemp = tempfile.mkstemp

    def mkstemp(*args, **kwargs):
        fd, path = real_mkstemp(*args, **kwargs)
        made.append((path, stat.S_IMODE(os.fstat(fd).st_mode)))
        return fd, path

    monkeypatch.setattr(tempfile, "mkstemp", mkstemp)
    fd = ring._anonymous_memory(8192)
    try:
        ((path, mode_at_creation),) = made
        assert mode_at_creation == 0o600
        st = os.fstat(fd)
        assert st.st_nlink == 0 and not os.path.exists(path) and st.st_size == 8192
        assert os.listdir(tmp_path) == []
    finally:
        os.close(fd)
    # A ring on it works like any other.
    r = ring.Ring.create(1024)
    try:
        assert r.try_put(b"hello") and r.drain() == [b"hello"]
    finally:
        r.close()
        r.close_fds()
