"""Images through every chat door on a server without a projector: each malformed image gets a 400 naming what is
wrong with it (and the field it came in), a good one a 400 naming --mmproj, a URL a 400 unless the operator lets
the server fetch it (then bounded in size and time, and from public addresses only unless --image-urls-private);
the server keeps serving text throughout.

The answers with a projector (each door's real client, the counts against llama-server's, the prefix cache) are
tests/test_vision_doors.py's.
"""

from __future__ import annotations

import base64
import http.server
import threading
import time
from collections.abc import Callable, Iterator

import httpx
import pytest

from perf import image_files
from tests.conftest import Server, start_server

OLLAMA_NAME = "SmolLM2-135M-Instruct.Q4_1:latest"
PNG = image_files.png(image_files.picture(64, 48))


def b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


def data_uri(data: bytes, kind: str = "image/png") -> str:
    return f"data:{kind};base64,{b64(data)}"


# Each door's request with one image given as its wire format carries it: (path, body, the image's field).
Request = tuple[str, dict, str]


def openai_chat(url: str) -> Request:
    content = [{"type": "text", "text": "What is this?"}, {"type": "image_url", "image_url": {"url": url}}]
    body = {"messages": [{"role": "user", "content": content}], "max_tokens": 4}
    return "/v1/chat/completions", body, "messages[0].content[1].image_url.url"


def anthropic_source(source: dict, in_tool_result: bool = False) -> Request:
    image = {"type": "image", "source": source}
    param = "messages[0].content[1].source"
    if in_tool_result:
        call = {"type": "tool_use", "id": "toolu_1", "name": "look", "input": {}}
        messages = [
            {"role": "assistant", "content": [call]},
            {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_1", "content": [image]}]},
        ]
        param = "messages[1].content[0].content[0].source"
    else:
        messages = [{"role": "user", "content": [{"type": "text", "text": "What is this?"}, image]}]
    return "/v1/messages", {"model": "m", "max_tokens": 4, "messages": messages}, param


def responses_input(part: dict) -> Request:
    content = [{"type": "input_text", "text": "What is this?"}, {"type": "input_image", "detail": "auto", **part}]
    body = {"input": [{"role": "user", "content": content}], "max_output_tokens": 4}
    return "/v1/responses", body, "input[0].content[1]"


def ollama_chat(image: str) -> Request:
    body = {"model": OLLAMA_NAME, "messages": [{"role": "user", "content": "What is this?", "images": [image]}]}
    return "/api/chat", {**body, "stream": False, "options": {"num_predict": 4}}, "messages[0].images[0]"


def ollama_generate(image: str, **more) -> Request:
    body = {"model": OLLAMA_NAME, "prompt": "What is this?", "images": [image], "stream": False, **more}
    return "/api/generate", {**body, "options": {"num_predict": 4}}, "images[0]"


def llama_completion(image: str, text: str = "What is <__media__> this?") -> Request:
    body = {"prompt": {"prompt_string": text, "multimodal_data": [image]}, "n_predict": 4}
    return "/completion", body, "prompt.multimodal_data[0]"


def document_block() -> Request:
    document = {"type": "document", "source": {"type": "text", "media_type": "text/plain", "data": "Hi"}}
    path, body, _ = anthropic_source({})
    body["messages"][0]["content"][1] = document
    return path, body, "messages[0].content[1]"


def input_file() -> Request:
    path, body, _ = responses_input({})
    body["input"][0]["content"][1] = {"type": "input_file", "file_id": "file-1"}
    return path, body, "input[0].content[1]"


def base64_source(data: bytes, media_type: str = "image/png") -> dict:
    return {"type": "base64", "media_type": media_type, "data": b64(data)}


def url_source(url: str) -> dict:
    return {"type": "url", "url": url}


# door -> a request carrying the image's bytes
BY_BYTES: dict[str, Callable[[bytes], Request]] = {
    "openai": lambda data: openai_chat(data_uri(data)),
    "anthropic": lambda data: anthropic_source(base64_source(data)),
    "anthropic tool_result": lambda data: anthropic_source(base64_source(data), in_tool_result=True),
    "responses": lambda data: responses_input({"image_url": data_uri(data)}),
    "ollama chat": lambda data: ollama_chat(b64(data)),
    "ollama generate": lambda data: ollama_generate(b64(data)),
    "llama-server completion": lambda data: llama_completion(b64(data)),
}
# door -> a request carrying a URL (data URI or http), where the door takes one
BY_URL: dict[str, Callable[[str], Request]] = {
    "openai": openai_chat,
    "anthropic": lambda url: anthropic_source(url_source(url)),
    "responses": lambda url: responses_input({"image_url": url}),
}
# door -> its own malformed images: (request, what the 400 says)
MALFORMED: dict[str, list[tuple[Request, str]]] = {
    "anthropic": [
        (anthropic_source({"type": "base64", "media_type": "image/png", "data": "iVBOR!!"}), "not valid base64"),
        (anthropic_source(base64_source(b"x", "text/plain")), "'text/plain' is not an image type"),
        (anthropic_source({"type": "base64", "data": b64(b"x")}), "None is not an image type"),
        (anthropic_source({"type": "base64", "media_type": "image/png", "data": 5}), "base64 string"),
        (anthropic_source({"type": "file", "file_id": "file_1"}), "of type 'file' cannot be read"),
        (document_block(), "document input is not supported"),
    ],
    "responses": [
        (responses_input({"file_id": "file-1"}), "no Files API"),
        (responses_input({}), "needs image_url"),
        (input_file(), "file input is not supported"),
    ],
    "llama-server": [
        (llama_completion("iVBOR!!w0K"), "not valid base64"),
        (llama_completion(data_uri(PNG)), "not valid base64"),  # llama-server's multimodal_data are bare base64
    ],
    "ollama": [
        (ollama_chat("iVBOR!!w0K"), "not valid base64"),
        (ollama_chat(data_uri(PNG)), "not valid base64"),  # Ollama's images are bare base64
        (ollama_generate("iVBOR"), "not valid base64"),
        (ollama_generate(b64(PNG), raw=True)[:2] + ("images",), "raw or suffix prompt"),
    ],
}


def ask(http: httpx.Client, request: tuple[str, dict, str]) -> tuple[httpx.Response, str]:
    path, body, param = request
    return http.post(path, json=body), param


def assert_400(r: httpx.Response, *words: str) -> str:
    assert r.status_code == 400, r.text
    text = r.text
    for word in words:
        assert word in text, text
    return text


def still_serves(http: httpx.Client) -> None:
    r = http.post("/v1/chat/completions", json={"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 2})
    assert r.status_code == 200 and r.json()["usage"]["completion_tokens"] >= 1, r.text


BAD_BYTES = {
    "not an image": (b"hello, this is text", "not an image in a supported format"),
    "webp": (b"RIFF\x10\x00\x00\x00WEBPVP8 " + bytes(8), "WebP images are not supported"),
    "truncated png": (PNG[: len(PNG) // 2], "the PNG is truncated"),
    "corrupted png": (PNG[:40] + bytes([PNG[40] ^ 1]) + PNG[41:], "the PNG is corrupted"),
    "too many pixels": (image_files.png_raw(60000, 60000, b"x"), "over the limit of"),
}


@pytest.mark.parametrize("door", BY_BYTES)
@pytest.mark.parametrize("case", BAD_BYTES)
def test_bytes_that_are_not_an_acceptable_image_get_a_400_naming_why(http, door, case):
    data, words = BAD_BYTES[case]
    r, param = ask(http, BY_BYTES[door](data))
    text = assert_400(r, words)
    assert param in text
    still_serves(http)


BAD_URIS = {
    "bad base64": ("data:image/png;base64,iVBOR!!w0K", "not valid base64"),
    "not base64": ("data:image/png,rawbytes", "must be base64 encoded"),
    "text media type": (data_uri(PNG, "text/plain"), "'text/plain' is not an image type"),
    "no comma": ("data:image/png;base64", "no comma"),
    "a file path": ("file:///etc/passwd", "data URI"),
    "an ftp url": ("ftp://example.com/cat.png", "data URI"),
}


@pytest.mark.parametrize("door", BY_URL)
@pytest.mark.parametrize("case", BAD_URIS)
def test_a_malformed_data_uri_gets_a_400_naming_it(http, door, case):
    uri, words = BAD_URIS[case]
    r, param = ask(http, BY_URL[door](uri))
    assert param in assert_400(r, words)
    still_serves(http)


@pytest.mark.parametrize("door, case", [(door, i) for door, cases in MALFORMED.items() for i in range(len(cases))])
def test_each_doors_own_malformed_images_get_a_400_naming_them(http, door, case):
    request, words = MALFORMED[door][case]
    r, param = ask(http, request)
    assert param in assert_400(r, words)
    still_serves(http)


@pytest.mark.parametrize("door", BY_BYTES)
def test_a_good_image_to_a_model_without_a_projector_gets_a_400_naming_mmproj(http, door):
    r, param = ask(http, BY_BYTES[door](PNG))
    assert param in assert_400(r, "--mmproj", "takes no images")
    still_serves(http)


@pytest.mark.parametrize("door", BY_URL)
def test_an_http_url_is_refused_unless_the_operator_allows_fetching(http, door):
    r, param = ask(http, BY_URL[door]("http://127.0.0.1:9/cat.png"))
    assert param in assert_400(r, "--image-urls", "data URI")
    still_serves(http)


# A valid PNG of 17 MiB (under the 20 MiB an image may have; four are over the 64 MiB a request may carry).
LARGE_PNG = image_files.png_raw(8, 8, bytes(17 * 1024 * 1024))

# ---- fetching, where the operator allows it --------------------------------------------------------------------


class Files(http.server.BaseHTTPRequestHandler):
    """/png, /text, /17mib, /endless (bytes until the reader stops), /slow (a byte a second), anything else 404."""

    def do_GET(self):
        if self.path == "/slow":
            self.send_response(200)
            self.end_headers()
            for byte in PNG[:30]:
                self.wfile.write(bytes([byte]))
                self.wfile.flush()
                time.sleep(1)
            return
        if self.path == "/endless":  # a PNG's signature, then zeros until the reader hangs up
            self.send_response(200)
            self.end_headers()
            try:
                self.wfile.write(b"\x89PNG\r\n\x1a\n")
                while True:
                    self.wfile.write(bytes(1 << 20))
            except (BrokenPipeError, ConnectionResetError):
                return
        body = {"/png": PNG, "/text": b"plain text"}.get(self.path)
        if self.path == "/17mib":
            body = LARGE_PNG
        if body is None:
            self.send_error(404)
            return
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        try:
            self.wfile.write(body)
        except (BrokenPipeError, ConnectionResetError):
            pass  # the server stopped reading at its limit

    def log_message(self, *args):
        pass


@pytest.fixture(scope="module")
def files() -> Iterator[str]:
    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Files)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{httpd.server_address[1]}"
    httpd.shutdown()


@pytest.fixture(scope="module")
def fetching() -> Iterator[Server]:
    # A body limit that lets an image over 20 MiB through as base64.
    # --image-urls-private: the files are served on loopback
    with start_server(
        "--image-urls", "--image-urls-private", "--image-url-timeout", "3", "--max-body-bytes", str(40 << 20)
    ) as srv:
        yield srv


@pytest.fixture(scope="module")
def public_only() -> Iterator[Server]:
    with start_server("--image-urls", "--image-url-timeout", "2", "--parallel", "1", "--ctx-size", "512") as srv:
        yield srv


@pytest.mark.parametrize(
    "host", ["127.0.0.1", "localhost", "[::1]", "[::ffff:127.0.0.1]", "0.0.0.0", "10.0.0.1", "169.254.169.254"]
)
def test_fetching_refuses_loopback_private_and_link_local_hosts_unless_allowed(public_only, files, host):
    """Where /png would be fetched (then refused for the model, as test_fetched_urls_are_checked... shows), or a
    connection tried, the URL is refused first; a name is resolved and its addresses checked."""
    port = files.rsplit(":", 1)[1]
    with public_only.client() as c:
        for door in BY_URL:
            r, param = ask(c, BY_URL[door](f"http://{host}:{port}/png"))
            text = assert_400(r, "a loopback, private or link-local address", "--image-urls-private")
            assert param in text and "--mmproj" not in text
        still_serves(c)


@pytest.mark.parametrize(
    "path, words",
    [
        ("/png", ["--mmproj"]),  # fetched and checked: only then refused for the model
        ("/text", ["not an image"]),
        ("/missing", ["HTTP 404"]),
        ("/endless", ["over the limit of 20971520 bytes"]),  # read no further than the limit
        ("/slow", ["longer than 3 s"]),
    ],
)
def test_fetched_urls_are_checked_and_bounded_in_size_and_time(fetching, files, path, words):
    with fetching.client() as c:
        t0 = time.monotonic()
        r, param = ask(c, openai_chat(files + path))
        assert param in assert_400(r, *words)
        assert time.monotonic() - t0 < 10
        still_serves(c)


def test_images_over_what_one_request_may_carry_get_a_400(fetching, files):
    path, body, _ = openai_chat(files + "/17mib")
    body["messages"][0]["content"] *= 4
    with fetching.client() as c:
        r = c.post(path, json=body)
        assert_400(r, "the request's images are 71303", "over the limit of 67108864")
        still_serves(c)


@pytest.mark.parametrize("door", BY_URL)
def test_each_doors_url_is_fetched_and_checked(fetching, files, door):
    with fetching.client() as c:
        r, param = ask(c, BY_URL[door](files + "/text"))
        assert param in assert_400(r, "not an image")


def test_an_image_over_20_mib_inline_gets_a_400(fetching):
    with fetching.client() as c:
        r, param = ask(c, BY_BYTES["openai"](image_files.png_raw(8, 8, bytes(21 << 20))))
        assert param in assert_400(r, "over the limit of 20971520")
        still_serves(c)
