"""Fetching an image URL (--image-urls): bounded in size and time, and only from public addresses.

A client's URL makes the server connect where the client names, so by default the server fetches nothing from its
own side of the network: a host name is resolved and every address it gives is checked before the connection is
made (one loopback, private, link-local or other non-public address refuses the URL), and the connection goes to
an address that was checked, so a name that resolves again to another address (DNS rebinding) cannot slip in. A
redirect opens a new connection and is checked the same way. An environment proxy is not used then (it would
reach the private address on our behalf). `--image-urls-private` lifts the check, for an operator whose images
live on a private network; fetching then is urllib's plain way.
"""

from __future__ import annotations

import http.client
import ipaddress
import socket
import time
import urllib.error
import urllib.request


class PrivateAddress(OSError):
    """The URL's host is, or resolves to, an address this server does not fetch from (urllib passes it on as a
    URLError's reason)."""


def refused(address: str) -> bool:
    """Whether an IP address is one the server does not fetch from: anything not publicly routable (loopback,
    private, link-local, shared, reserved, unspecified, multicast), an IPv4 one inside IPv6 too."""
    ip = ipaddress.ip_address(address.split("%", 1)[0])  # a scoped IPv6 (fe80::1%en0, as macOS gives them)
    if isinstance(ip, ipaddress.IPv6Address) and (inner := ip.ipv4_mapped or ip.sixtofour) is not None:
        ip = inner
    return not ip.is_global or ip.is_multicast


def _public_connection(address: tuple[str, int], timeout=socket._GLOBAL_DEFAULT_TIMEOUT, source_address=None):  # type: ignore[attr-defined]
    """socket.create_connection, to a host whose every address is public; PrivateAddress otherwise."""
    host, port = address
    infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    for *_, sockaddr in infos:
        if refused(str(sockaddr[0])):
            raise PrivateAddress(
                f"{host} is at {sockaddr[0]}, a loopback, private or link-local address, which this server does not "
                "fetch from (the operator may allow it with --image-urls-private)"
            )
    error: OSError | None = None
    for family, kind, proto, _, sockaddr in infos:
        sock = socket.socket(family, kind, proto)
        try:
            if timeout is not socket._GLOBAL_DEFAULT_TIMEOUT:  # type: ignore[attr-defined]
                sock.settimeout(timeout)
            if source_address:
                sock.bind(source_address)
            sock.connect(sockaddr)  # the checked address, not the name again
            return sock
        except OSError as e:
            sock.close()
            error = e
    raise error or OSError(f"{host} has no address")


class _PublicHTTP(http.client.HTTPConnection):
    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self._create_connection = _public_connection


class _PublicHTTPS(http.client.HTTPSConnection):  # the certificate is checked against the name, as usual
    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self._create_connection = _public_connection


class _PublicHTTPHandler(urllib.request.HTTPHandler):
    def http_open(self, req):
        return self.do_open(_PublicHTTP, req)


class _PublicHTTPSHandler(urllib.request.HTTPSHandler):
    def https_open(self, req):
        return self.do_open(_PublicHTTPS, req, context=self._context)


class _HttpOnly(urllib.request.HTTPRedirectHandler):
    def redirect_request(self, req, fp, code, msg, headers, newurl):
        if not newurl.lower().startswith(("http://", "https://")):
            raise urllib.error.URLError(f"a redirect to {newurl!r}, not an http(s) URL")
        return super().redirect_request(req, fp, code, msg, headers, newurl)


_anywhere = urllib.request.build_opener(_HttpOnly)
_public = urllib.request.build_opener(
    urllib.request.ProxyHandler({}), _PublicHTTPHandler, _PublicHTTPSHandler, _HttpOnly
)


def download(url: str, limit: int, timeout: float, private: bool = False) -> bytes:
    """At most limit + 1 bytes of url, within timeout seconds in all (a slow sender is cut off too); ``private``:
    fetch from non-public addresses too, else PrivateAddress for them."""
    deadline = time.monotonic() + timeout
    opener = _anywhere if private else _public
    with opener.open(urllib.request.Request(url, headers={"User-Agent": "cllm"}), timeout=timeout) as r:
        data = bytearray()
        while len(data) <= limit:
            if time.monotonic() > deadline:
                raise TimeoutError
            piece = r.read1(min(1 << 16, limit + 1 - len(data)))
            if not piece:
                break
            data += piece
        return bytes(data)
