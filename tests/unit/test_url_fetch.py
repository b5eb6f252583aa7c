"""frontend_proc/chat/url_fetch.py's rule for --image-urls: every address a URL's host resolves to must be public,
and the connection goes to an address that was checked (name resolution faked: no network here; the served
refusals are tests/test_image_input.py's)."""

from __future__ import annotations

import http.server
import socket
import threading

import pytest

from frontend_proc.chat import url_fetch
from frontend_proc.chat.url_fetch import PrivateAddress, refused

NOT_PUBLIC = [
    "127.0.0.1",  # loopback
    "127.8.9.10",
    "::1",
    "10.1.2.3",  # private
    "172.16.0.1",
    "192.168.1.1",
    "fc00::1",  # unique local
    "169.254.169.254",  # link-local: a cloud's metadata service
    "fe80::1",
    "fe80::1%en0",  # scoped, as macOS's getaddrinfo gives link-local IPv6
    "100.64.0.1",  # shared (carrier-grade NAT)
    "0.0.0.0",
    "::",
    "::ffff:127.0.0.1",  # IPv4-mapped loopback
    "::ffff:10.0.0.1",
    "2002:7f00:1::",  # 6to4 of 127.0.0.1
    "224.0.0.1",  # multicast
    "192.0.2.1",  # documentation
]
PUBLIC = ["8.8.8.8", "1.1.1.1", "2001:4860:4860::8888", "::ffff:8.8.8.8"]


@pytest.mark.parametrize("address", NOT_PUBLIC)
def test_non_public_addresses_are_refused(address):
    assert refused(address)


@pytest.mark.parametrize("address", PUBLIC)
def test_public_addresses_are_not(address):
    assert not refused(address)


def fake_dns(monkeypatch, addresses: list[str]) -> list[tuple]:
    """getaddrinfo gives ``addresses``; socket.socket's connections are recorded, not made."""
    connected: list[tuple] = []

    def getaddrinfo(host, port, *args, **kwargs):
        return [
            (socket.AF_INET6 if ":" in a else socket.AF_INET, socket.SOCK_STREAM, 6, "", (a, port)) for a in addresses
        ]

    class Socket:
        def __init__(self, *args):
            pass

        def settimeout(self, t):
            pass

        def connect(self, sockaddr):
            connected.append(sockaddr)

        def close(self):
            pass

    monkeypatch.setattr(url_fetch.socket, "getaddrinfo", getaddrinfo)
    monkeypatch.setattr(url_fetch.socket, "socket", Socket)
    return connected


def test_one_private_address_among_a_hosts_addresses_refuses_it_before_connecting(monkeypatch):
    connected = fake_dns(monkeypatch, ["8.8.8.8", "10.0.0.7"])
    with pytest.raises(PrivateAddress, match="images.example is at 10.0.0.7.*--image-urls-private"):
        url_fetch._public_connection(("images.example", 80), 5)
    assert connected == []


def test_the_connection_goes_to_the_checked_address_not_the_name_again(monkeypatch):
    connected = fake_dns(monkeypatch, ["8.8.8.8"])
    url_fetch._public_connection(("images.example", 443), 5)
    assert connected == [("8.8.8.8", 443)]  # a second lookup (DNS rebinding) is never asked


def test_a_refused_url_is_refused_through_urllib_with_the_reason(monkeypatch):
    fake_dns(monkeypatch, ["127.0.0.1"])
    with pytest.raises(OSError) as e:
        url_fetch.download("http://images.example/cat.png", 1000, 5)
    assert isinstance(getattr(e.value, "reason", None), PrivateAddress)
    assert "images.example is at 127.0.0.1" in str(e.value.reason)


def test_a_redirect_is_checked_again(monkeypatch):
    """The first host passes (the check made to let it), its redirect's host does not: the redirect is refused."""

    class Redirect(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            self.send_response(302)
            self.send_header("Location", f"http://localhost:{self.server.server_address[1]}/cat.png")
            self.end_headers()

        def log_message(self, *args):
            pass

    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Redirect)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    checked: list[str] = []
    monkeypatch.setattr(url_fetch, "refused", lambda address: checked.append(address) or len(checked) > 1)
    try:
        with pytest.raises(OSError) as e:
            url_fetch.download(f"http://127.0.0.1:{httpd.server_address[1]}/start", 1000, 5)
    finally:
        httpd.shutdown()
    assert isinstance(getattr(e.value, "reason", None), PrivateAddress) and "localhost is at" in str(e.value.reason)
    assert checked[0] == "127.0.0.1" and len(checked) == 2
