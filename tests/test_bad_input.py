"""Bad input at the HTTP level: content types, encodings, oversized bodies; the server keeps serving."""

from __future__ import annotations

import select
import socket
import time
from collections.abc import Sequence
from urllib.parse import urlsplit

import pytest

MAX_BODY = 1 << 20  # the default --max-body-bytes


def raw_exchange(
    url: str, head: bytes, chunks: Sequence[bytes] = (), timeout: float = 20.0
) -> tuple[int, dict, bytes, float]:
    """Send a request by hand, stop sending once the server answers; (status, headers, body, seconds)."""
    parts = urlsplit(url)
    t0 = time.monotonic()
    with socket.create_connection((parts.hostname, parts.port or 80), timeout=timeout) as s:
        s.sendall(head)
        for chunk in chunks:
            if select.select([s], [], [], 0)[0]:
                break  # answered already: the rest would not be read
            try:
                s.sendall(chunk)
            except (BrokenPipeError, ConnectionResetError):
                break
        data = b""
        while b"\r\n\r\n" not in data:
            more = s.recv(65536)
            assert more, f"connection closed without an answer: {data!r}"
            data += more
        elapsed = time.monotonic() - t0
        head_bytes, _, body = data.partition(b"\r\n\r\n")
        lines = head_bytes.decode().split("\r\n")
        headers = {k.lower(): v.strip() for k, _, v in (line.partition(":") for line in lines[1:])}
        while len(body) < int(headers.get("content-length", 0)):
            more = s.recv(65536)
            if not more:
                break
            body += more
    return int(lines[0].split()[1]), headers, body, elapsed


def test_declared_oversized_body_is_413_before_it_is_sent(server):
    head = (
        b"POST /generate HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
        b"Content-Length: 1000000000\r\n\r\n"
    )
    status, headers, body, _ = raw_exchange(server.url, head)  # not a byte of the body is sent
    assert status == 413 and headers["connection"] == "close"
    assert b'"error":"request too large"' in body and str(MAX_BODY).encode() in body


def test_chunked_oversized_body_is_413_once_the_count_passes_the_limit(server):
    head = (
        b"POST /encode HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
        b"Transfer-Encoding: chunked\r\n\r\n"
    )
    piece = b"x" * 65536
    chunks = [b"%x\r\n%s\r\n" % (len(piece), piece)] * 64  # 4 MiB offered, 1 MiB allowed
    status, headers, body, _ = raw_exchange(server.url, head, chunks)
    assert status == 413 and headers["connection"] == "close"
    assert b'"error":"request too large"' in body


def test_chunked_body_under_the_limit_is_read(server):
    payload = b'{"text": "Hello world"}'
    head = b"POST /encode HTTP/1.1\r\nHost: 127.0.0.1\r\nTransfer-Encoding: chunked\r\nConnection: close\r\n\r\n"
    status, _, body, _ = raw_exchange(server.url, head, [b"%x\r\n%s\r\n0\r\n\r\n" % (len(payload), payload)])
    assert status == 200 and b'"length":2' in body


@pytest.mark.parametrize(
    "content_type",
    [
        None,
        "application/json",
        "application/json; charset=UTF-8",
        "application/x-www-form-urlencoded",
        "application/merge-patch+json",
    ],
)
def test_json_is_read_whatever_type_curl_or_a_client_sends(http, content_type):
    headers = {"content-type": content_type} if content_type else {}
    r = http.post("/encode", content=b'{"text": "Hello world"}', headers=headers)
    assert r.status_code == 200 and r.json()["data"]["length"] == 2


def test_curl_style_generate_works(http):
    r = http.post(
        "/generate",
        content=b'{"prompt": "Hi", "max_tokens": 2}',
        headers={"content-type": "application/x-www-form-urlencoded"},
    )
    assert r.status_code == 200 and r.json()["data"]["generated_tokens"] == 2


@pytest.mark.parametrize(
    "content_type,message",
    [
        ("text/plain", "not text/plain"),
        ("multipart/form-data; boundary=x", "not multipart/form-data"),
        ("application/json; charset=latin-1", "JSON must be UTF-8, not latin-1"),
    ],
)
def test_other_content_types_are_415(http, content_type, message):
    for path in ("/generate", "/encode"):
        r = http.post(path, content=b'{"prompt": "x", "text": "x"}', headers={"content-type": content_type})
        assert r.status_code == 415
        body = r.json()
        assert body["success"] is False and body["error"] == "unsupported media type" and message in body["message"]


@pytest.mark.parametrize("raw", [b'{"prompt": "caf\xe9"}', b'{"prompt": "\xff\xfe"}', b'{"prompt": "ok", "\xc3": 1}'])
def test_invalid_utf8_is_400(http, raw):
    r = http.post("/generate", content=raw, headers={"content-type": "application/json"})
    assert r.status_code == 400
    assert r.json() == {"success": False, "error": "invalid UTF-8", "message": "the body is not valid UTF-8 text"}


def test_body_that_is_not_an_object_or_empty(http):
    for raw, error in ((b'"just a string"', "invalid request"), (b"", "invalid JSON"), (b"null", "invalid request")):
        r = http.post("/generate", content=raw, headers={"content-type": "application/json"})
        assert r.status_code == 400 and r.json()["error"] == error


def schema(levels: int) -> str:
    """A JSON schema of objects in objects, ``levels`` levels of JSON deep (two a schema)."""
    return '{"type":"object","properties":{"a":' * (levels // 2) + '{"type":"string"}' + "}}" * (levels // 2)


CHAT = '"messages":[{"role":"user","content":"Hi"}]'
# Each door with a JSON schema of the given depth (DEEP) where it takes one, elsewhere a field it has never heard of
# (a tool's schema would be written into the prompt), and where its answer says what is wrong.
DEEP_BODIES = [
    ("/generate", '{"prompt":"Hi","max_tokens":2,"extra":DEEP}', "message"),
    (
        "/v1/chat/completions",
        "{"
        + CHAT
        + ',"max_tokens":2,"response_format":{"type":"json_schema","json_schema":{"name":"n","schema":DEEP}}}',
        "error",
    ),
    ("/v1/messages", '{"model":"m","max_tokens":2,' + CHAT + ',"extra":DEEP}', "error"),
    (
        "/v1/responses",
        '{"input":"Hi","max_output_tokens":16,"text":{"format":{"type":"json_schema","name":"n","schema":DEEP}}}',
        "error",
    ),
    (
        "/api/chat",
        '{"model":"SmolLM2-135M-Instruct.Q4_1",' + CHAT + ',"stream":false,"options":{"num_predict":2},"format":DEEP}',
        "error",
    ),
    ("/completion", '{"prompt":"Hi","n_predict":2,"json_schema":DEEP}', "error"),
    ("/v1/embeddings", '{"input":"Hi","extra":DEEP}', "error"),
]


@pytest.mark.parametrize("path,body,field", DEEP_BODIES)
def test_a_body_nested_too_deep_is_a_400_and_one_within_the_limit_is_served(http, path, body, field):
    """A few hundred levels of nesting in a small body made the readers' recursion end in a 500 (every door)."""
    headers = {"content-type": "application/json"}
    for levels in (600, 5000):
        r = http.post(path, content=body.replace("DEEP", schema(levels)).encode(), headers=headers)
        assert r.status_code == 400, r.text
        assert "nests deeper than 128 levels" in str(r.json()[field]), r.text
    r = http.post(path, content=body.replace("DEEP", schema(110)).encode(), headers=headers)
    assert r.status_code == 200, r.text


def test_still_serving_after_all_that(http):
    r = http.post("/generate", json={"prompt": "Hello", "max_tokens": 3, "temperature": 0})
    assert r.status_code == 200 and r.json()["data"]["generated_tokens"] == 3


# A field each door has never heard of, at the top and inside what it reads, next to the fields it reads.
NEW_FIELDS = [
    ("/generate", {"prompt": "Hello", "max_tokens": 2, "bogus": 1}),
    ("/v1/completions", {"prompt": "Hello", "max_tokens": 2, "bogus": 1, "stream_options": None}),
    (
        "/v1/chat/completions",
        {
            "messages": [
                {
                    "role": "user",
                    "content": [{"type": "text", "text": "Hi", "new_part_field": 1}],
                    "new_message_field": 1,
                }
            ],
            "max_tokens": 2,
            "stream": True,
            "stream_options": {"include_usage": True, "new_option": 1},
            "new_top_field": {"a": 1},
        },
    ),
    (
        "/v1/messages",
        {
            "model": "m",
            "max_tokens": 2,
            "messages": [{"role": "user", "content": [{"type": "text", "text": "Hi", "new_block_field": 1}]}],
            "tool_choice": {"type": "auto", "new_choice_field": True},
            "new_top_field": [1],
        },
    ),
    (
        "/v1/responses",
        {
            "input": "Hi",
            "max_output_tokens": 16,
            "reasoning": {"effort": "low", "new_reasoning_field": 1},
            "new_top_field": 1,
        },
    ),
    (
        "/api/chat",
        {
            "model": "SmolLM2-135M-Instruct.Q4_1",
            "messages": [{"role": "user", "content": "Hi"}],
            "stream": False,
            "options": {"num_predict": 2},
            "new_top_field": 1,
        },
    ),
    ("/completion", {"prompt": "Hello", "n_predict": 2, "new_top_field": 1}),
]


@pytest.mark.parametrize("path,body", NEW_FIELDS, ids=[p for p, _ in NEW_FIELDS])
def test_fields_a_newer_client_adds_are_ignored(http, path, body):
    r = http.post(path, json=body)
    assert r.status_code == 200, r.text


def test_a_bad_value_next_to_a_new_field_is_still_a_400(http):
    r = http.post(
        "/v1/chat/completions",
        json={"messages": [{"role": "user", "content": "Hi"}], "max_tokens": "5", "new_top_field": 1},
    )
    assert r.status_code == 400 and r.json()["error"]["param"] == "max_tokens"
    r = http.post("/generate", json={"prompt": "x", "bogus": 1, "top_p": 0})
    assert r.status_code == 400 and r.json()["message"] == "Expected `float` > 0.0 - at `$.top_p`"


# A limit past what one sequence holds: a 400 naming the field the client set it with, in each door's words.
TOO_MANY = 1 << 20
HI = [{"role": "user", "content": "Hi"}]
OLLAMA = "SmolLM2-135M-Instruct.Q4_1"
LIMITS = [
    ("/v1/chat/completions", {"messages": HI, "max_tokens": TOO_MANY}, "max_tokens"),
    ("/v1/chat/completions", {"messages": HI, "max_completion_tokens": TOO_MANY}, "max_completion_tokens"),
    ("/v1/completions", {"prompt": "Hi", "max_tokens": TOO_MANY}, "max_tokens"),
    ("/v1/messages", {"model": "m", "max_tokens": TOO_MANY, "messages": HI}, "max_tokens"),
    ("/v1/responses", {"input": "Hi", "max_output_tokens": TOO_MANY}, "max_output_tokens"),
    (
        "/api/chat",
        {"model": OLLAMA, "messages": HI, "stream": False, "options": {"num_predict": TOO_MANY}},
        "options.num_predict",
    ),
    (
        "/api/generate",
        {"model": OLLAMA, "prompt": "Hi", "stream": False, "options": {"num_predict": TOO_MANY}},
        "options.num_predict",
    ),
    ("/completion", {"prompt": "Hi", "n_predict": TOO_MANY}, "n_predict"),
    ("/completion", {"prompt": "Hi", "max_tokens": TOO_MANY}, "max_tokens"),
    ("/generate", {"prompt": "Hi", "max_tokens": TOO_MANY}, "max_tokens"),
]


@pytest.mark.parametrize("path,body,field", LIMITS, ids=[f"{p} {f}" for p, _, f in LIMITS])
def test_a_limit_too_large_names_the_field_the_client_sent(http, path, body, field):
    r = http.post(path, json=body)
    assert r.status_code == 400, r.text
    answer = r.json()
    error = answer["error"]
    message = answer["message"] if path == "/generate" else error if isinstance(error, str) else error["message"]
    assert f"{field} {TOO_MANY} exceeds the context of one sequence" in message, message
    if field != "max_tokens":
        assert "max_tokens" not in message, message
    if isinstance(error, dict) and "param" in error:
        assert error["param"] == field


def test_a_multimodal_prompt_among_others_is_a_400(http):
    """One multimodal prompt is the whole prompt; beside others it was iterated as a list (a 500, found by
    tests/test_fuzz.py)."""
    prompt = [{"prompt_string": "Hi", "multimodal_data": []}, "Hello"]
    r = http.post("/completion", json={"prompt": prompt, "n_predict": 1})
    assert r.status_code == 400, r.text
    assert "one multimodal prompt" in r.json()["error"]["message"]
