"""Browsers: a web page must not drive a cllm on the user's machine (DNS rebinding, cross-origin requests, CORS)."""

from __future__ import annotations

import socket

import pytest

from cllm.core.config import ServeConfig
from cllm.core.config_load import load_config
from frontend_proc.http.guard import host_name, is_loopback
from tests.conftest import start_server

ROUTES = [
    ("GET", "/"),
    ("GET", "/v1/models"),
    ("GET", "/openapi.json"),
    ("GET", "/metrics"),
    ("GET", "/model/info"),
    ("POST", "/generate"),
    ("POST", "/v1/chat/completions"),
    ("POST", "/v1/messages"),
    ("POST", "/v1/responses"),
    ("GET", "/nope"),
]
CHAT = {"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 1}


@pytest.fixture(scope="module")
def opened():
    """A server that lets a name and a web page in."""
    with start_server(
        "--parallel",
        "2",
        "--ctx-size",
        "1024",
        "--allowed-hosts",
        "my.box,Other.Box.",
        "--allowed-origins",
        "https://app.example,http://localhost:3000",
    ) as srv:
        yield srv


def test_a_foreign_host_gets_403_on_every_route_but_health(http, server):
    port = server.url.rsplit(":", 1)[1]
    for host in (
        "evil.example",
        f"evil.example:{port}",
        "127.0.0.1.evil.example",
        "localhost.evil.example",
        "10.0.0.1",
        "0.0.0.0",
    ):
        for method, path in ROUTES:
            r = http.request(method, path, headers={"host": host}, json=CHAT)
            assert r.status_code == 403, (host, method, path, r.text)
            body = r.json()
            if path.startswith("/v1/messages"):
                assert body["type"] == "error" and body["error"]["type"] == "permission_error"
            elif path.startswith("/v1/"):
                assert (
                    body["error"]["type"] == "invalid_request_error" and "--allowed-hosts" in body["error"]["message"]
                )
            else:
                assert body["error"] == "forbidden" and host.split(":")[0] in body["message"]
        assert http.get("/health", headers={"host": host}).status_code == 200


def test_loopback_names_and_this_machine_are_answered(http, server):
    port = server.url.rsplit(":", 1)[1]
    for host in (
        f"127.0.0.1:{port}",
        "127.0.0.1",
        f"localhost:{port}",
        "LocalHost.",
        f"[::1]:{port}",
        "127.1.2.3",
        f"{socket.gethostname()}:{port}",
        "app.localhost",
        "[::ffff:127.0.0.1]",
    ):
        assert http.get("/v1/models", headers={"host": host}).status_code == 200, host


def test_allowed_hosts_adds_names(opened):
    with opened.client() as http:
        for host, status in (
            ("my.box", 200),
            ("MY.BOX:8080", 200),
            ("other.box", 200),
            ("your.box", 403),
            ("localhost", 200),
        ):
            assert http.get("/v1/models", headers={"host": host}).status_code == status, host


def test_a_server_on_every_interface_answers_any_host():
    assert not is_loopback("0.0.0.0") and not is_loopback("192.168.1.5") and not is_loopback("::")
    assert is_loopback("127.0.0.1") and is_loopback("localhost") and is_loopback("::1") and is_loopback("127.0.1.1")
    with start_server("--host", "0.0.0.0", "--parallel", "1", "--ctx-size", "256") as srv, srv.client() as http:
        assert http.get("/v1/models", headers={"host": "cllm.example.com"}).status_code == 200


def test_host_names_are_read_as_browsers_send_them():
    assert host_name("127.0.0.1:8080") == "127.0.0.1"
    assert host_name("[::1]:8080") == "::1" and host_name("[::1]") == "::1"
    assert host_name("LocalHost.:80") == "localhost" and host_name(" evil.example ") == "evil.example"


def test_without_allowed_origins_no_page_is_granted(http, server):
    foreign = {"origin": "https://evil.example"}
    # The preflight a page's JSON POST needs: nothing grants it, so the browser never sends the POST.
    r = http.options(
        "/v1/chat/completions",
        headers={**foreign, "access-control-request-method": "POST", "access-control-request-headers": "content-type"},
    )
    assert r.status_code == 405 and not any(h.startswith("access-control-") for h in r.headers)
    # A GET is answered (the page cannot read it), with no grant.
    r = http.get("/v1/models", headers=foreign)
    assert r.status_code == 200 and "access-control-allow-origin" not in r.headers
    # What a page sends without a preflight: a form's POST is refused, text/plain is no JSON.
    for kind in ("application/x-www-form-urlencoded", "text/plain", "multipart/form-data; boundary=x"):
        r = http.post("/v1/chat/completions", headers={**foreign, "content-type": kind}, content=b'{"messages": []}')
        assert r.status_code == 403 and "--allowed-origins" in r.json()["error"]["message"], kind
    r = http.post("/v1/chat/completions", headers={"content-type": "text/plain"}, json=CHAT)
    assert r.status_code == 415


def test_the_chat_page_of_this_server_may_post(http, server):
    r = http.post("/v1/chat/completions", headers={"origin": server.url, "content-type": "application/json"}, json=CHAT)
    assert r.status_code == 200 and "access-control-allow-origin" not in r.headers


def test_allowed_origins_are_granted_and_no_other(opened):
    with opened.client() as http:
        for origin in ("https://app.example", "http://localhost:3000"):
            r = http.options(
                "/v1/chat/completions",
                headers={
                    "origin": origin,
                    "access-control-request-method": "POST",
                    "access-control-request-headers": "content-type,authorization",
                },
            )
            assert r.status_code == 204 and r.headers["access-control-allow-origin"] == origin
            assert "POST" in r.headers["access-control-allow-methods"]
            assert (
                r.headers["access-control-allow-headers"] == "content-type,authorization"
                and r.headers["vary"] == "Origin"
            )
            r = http.post("/v1/chat/completions", headers={"origin": origin}, json=CHAT)
            assert r.status_code == 200 and r.headers["access-control-allow-origin"] == origin
        for origin in ("https://evil.example", "https://app.example.evil", "http://localhost:3001", "null"):
            r = http.options(
                "/v1/chat/completions", headers={"origin": origin, "access-control-request-method": "POST"}
            )
            assert "access-control-allow-origin" not in r.headers, origin
            r = http.post("/v1/chat/completions", headers={"origin": origin}, json=CHAT)
            assert r.status_code == 403 and "access-control-allow-origin" not in r.headers, origin


def test_the_options_are_read_from_the_command_line_and_yaml(tmp_path):
    from cllm.core.settings import names

    assert names("a.b, c ,,d") == ["a.b", "c", "d"]
    path = tmp_path / "c.yaml"
    path.write_text("allowed-hosts: [my.box]\nallowed-origins: ['https://app.example']\n")
    config = load_config(str(path), {})
    assert config.allowed_hosts == ["my.box"] and config.allowed_origins == ["https://app.example"]
    assert ServeConfig().allowed_origins == []
    for bad in (
        {"allowed_origins": ["app.example"]},
        {"allowed_origins": ["https://app.example/path"]},
        {"allowed_hosts": ["a b"]},
    ):
        with pytest.raises(ValueError):
            load_config(None, bad)
