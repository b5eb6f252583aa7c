"""Overload: a bounded queue (429), a deadline per request (408), limits set on the command line."""

from __future__ import annotations

import json

import pytest

from tests.conftest import health, start_server, wait_idle, wait_until
from tests.test_faults import LONG, Load

TIMEOUT = 6.0


@pytest.fixture(scope="module")
def tight():
    """One slot, one waiting place, a short deadline, short prompts."""
    args = (
        "--parallel",
        "1",
        "--ctx-size",
        "2048",
        "--max-waiting",
        "1",
        "--request-timeout",
        str(TIMEOUT),
        "--max-prompt-tokens",
        "16",
    )
    with start_server(*args) as srv:
        yield srv


def test_beyond_the_waiting_room_is_429_and_past_the_deadline_408(tight):
    load = Load(tight.url)
    with tight.client() as http:
        wait_idle(http)
        load.start(stream=False, **LONG, max_tokens=2000)  # runs
        load.start(stream=False, **LONG, max_tokens=2000)  # waits
        wait_until(lambda: health(http, "detailed")["queue"]["in_flight"] == 2, 30)
        r = http.post("/generate", json={"prompt": "Hi", "max_tokens": 2})
        assert r.status_code == 429 and r.headers["retry-after"] == "1"
        body = r.json()
        assert (
            body["error"] == "too many requests"
            and "1 requests are already waiting for one of 1 slots" in body["message"]
        )

        for o in load.join(TIMEOUT + 30):  # the running one and the waiting one both time out
            assert o["status"] == 408, o
            assert o["body"] == {
                "success": False,
                "error": "request timeout",
                "message": f"the request took longer than {TIMEOUT:g} s",
            }
        wait_idle(http, timeout=10)  # both were aborted: the slot is free again
        r = http.post("/generate", json={"prompt": "Hi", "max_tokens": 2, "temperature": 0})
        assert r.status_code == 200 and r.json()["data"]["generated_tokens"] == 2


def test_a_stream_past_the_deadline_ends_with_an_error_event(tight):
    with tight.client() as http:
        with http.stream("POST", "/generate_stream", json={**LONG, "max_tokens": 2000}) as r:
            assert r.status_code == 200
            events = [json.loads(line[6:]) for line in r.iter_lines() if line.startswith("data: ")]
        last = events[-1]
        assert last["done"] is True and last["error"] == "request timeout"
        assert all("error" not in e for e in events[:-1])
        wait_idle(http, timeout=10)


def test_max_prompt_tokens(tight):
    with tight.client() as http:
        prompt = "word " * 20
        n = http.post("/encode", json={"text": prompt}).json()["data"]["length"]
        r = http.post("/generate", json={"prompt": prompt, "max_tokens": 2})
        assert r.status_code == 400
        assert r.json() == {
            "success": False,
            "error": "prompt too long",
            "message": f"the prompt is {n} tokens; this server takes at most 16",
        }
        r = http.post("/generate", json={"prompt": "one two three", "max_tokens": 2})
        assert r.status_code == 200


def test_max_tokens_caps_what_each_request_generates():
    """--max-tokens 8: a request naming no limit, or a larger one (even past its sequence), gets 8; a smaller one what
    it asks."""
    with start_server("--parallel", "1", "--ctx-size", "1024", "--max-tokens", "8") as srv, srv.client() as http:
        msgs = [{"role": "user", "content": "Count from one to one hundred."}]
        r = http.post("/v1/chat/completions", json={"messages": msgs, "ignore_eos": True})
        assert (
            r.status_code == 200
            and r.json()["usage"]["completion_tokens"] == 8
            and r.json()["choices"][0]["finish_reason"] == "length"
        )
        r = http.post("/v1/messages", json={"model": "m", "max_tokens": 32000, "messages": msgs, "ignore_eos": True})
        assert (
            r.status_code == 200 and r.json()["usage"]["output_tokens"] == 8 and r.json()["stop_reason"] == "max_tokens"
        )
        r = http.post("/v1/chat/completions", json={"messages": msgs, "max_tokens": 3, "ignore_eos": True})
        assert r.status_code == 200 and r.json()["usage"]["completion_tokens"] == 3
        # /completion shows n_predict as capped, as llama-server shows its --n-predict clamp; a smaller one as asked
        for asked, shown in ((-1, 8), (100, 8), (3, 3)):
            r = http.post("/completion", json={"prompt": "One, two,", "n_predict": asked, "ignore_eos": True})
            assert r.status_code == 200 and r.json()["tokens_predicted"] == shown
            assert r.json()["generation_settings"]["n_predict"] == shown
