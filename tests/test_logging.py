"""Logs: startup figures, one line per request when it ends, text or JSON."""

from __future__ import annotations

import json
import logging
import subprocess
import sys
import time

import pytest

from cllm.core.config import ServeConfig
from cllm.core.log import JsonFormatter, TextFormatter
from cllm.core.model_meta import gpu_layers
from tests.conftest import ROOT, start_server
from tests.test_api import generate, stream_events

WAIT = 30.0


def wait_for_line(lines: list[str], needle: str) -> str:
    """The first log line holding needle; requests log once they are over, so wait (bounded)."""
    deadline = time.monotonic() + WAIT
    while time.monotonic() < deadline:
        found = [line for line in list(lines) if needle in line]
        if found:
            return found[0]
        time.sleep(0.05)
    raise AssertionError(f"no log line with {needle!r} in:\n{''.join(lines)}")


@pytest.fixture(scope="module")
def json_server():
    with start_server("--parallel", "2", "--ctx-size", "512", "--log-format", "json") as srv:
        yield srv


def test_json_logs_startup_figures_and_one_line_per_request(json_server):
    srv = json_server
    with srv.client() as http:
        data = generate(http, prompt="Hello there", max_tokens=12, ignore_eos=True)
        events = stream_events(http, "/generate_stream", prompt="Hi", max_tokens=5, ignore_eos=True)
        for _ in range(3):
            http.get("/health")
            http.get("/metrics")
        completion = http.post(
            "/v1/completions", json={"prompt": "1, 2, 3, 4,", "max_tokens": 20, "temperature": 0, "stop": ["7"]}
        ).json()
    wait_for_line(srv.stderr_lines, '"route":"/v1/completions"')
    records = [json.loads(line) for line in srv.stderr_lines]  # every line is one JSON object

    messages = " | ".join(r["message"] for r in records)
    assert "SmolLM2-135M-Instruct.Q4_1.gguf" in messages and "135M parameters" in messages
    # 30 layers x 2 streams of 256 cells (2 sequences, no cache slot by default; in host memory no scratch stream
    # for them to trade places through, in device memory one more) x 384 x 2 bytes
    streams = 2 + (gpu_layers(ServeConfig()) > 0)
    reserved = 30 * streams * 256 * 384 * 2 / (1 << 20)
    assert f"KV cache: 512 cells (2 sequences of 256) and 0 cache slots, {reserved:.1f} MiB reserved; " in messages
    assert f"listening on {srv.url}" in messages
    assert all({"time", "level", "logger", "message"} <= set(r) for r in records)

    done = [r for r in records if r["message"] == "request done"]
    assert len(done) == 3  # one per generation, none per token nor for /health or /metrics
    first, second, third = done
    assert first["level"] == "info" and first["logger"] == "cllm.frontend"
    assert f"cllm-{first['id']}" == data["id"] and first["route"] == "/generate" and first["status"] == 200
    assert first["prompt_tokens"] == data["prompt_tokens"] and first["generated_tokens"] == 12
    assert first["finish_reason"] == "length"
    assert 0 < first["ttft"] <= first["total_time"]
    assert (
        f"cllm-{second['id']}" == events[0]["id"]
        and second["route"] == "/generate_stream"
        and second["generated_tokens"] == 5
    )
    # A stop string ends it in the frontend: the reason and the count are what the client got.
    assert f"cmpl-{third['id']}" == completion["id"] and third["route"] == "/v1/completions"
    assert third["finish_reason"] == completion["choices"][0]["finish_reason"] == "stop"
    assert third["generated_tokens"] == completion["usage"]["completion_tokens"]
    assert len(records) < 10


def test_text_log_line_of_a_request(server, http):
    data = generate(http, prompt="The sky is", max_tokens=4, ignore_eos=True)
    line = wait_for_line(server.stderr_lines, f"id={data['id'].removeprefix('cllm-')} ")
    assert " INFO cllm.frontend: request done " in line
    assert f"route=/generate status=200 prompt_tokens={data['prompt_tokens']} generated_tokens=4 ttft=" in line
    assert line.rstrip().endswith("finish_reason=length")


def test_a_client_that_leaves_is_logged_as_abort(server, http):
    with http.stream("POST", "/generate_stream", json={"prompt": "Go on", "max_tokens": 400, "ignore_eos": True}) as r:
        lines = r.iter_lines()
        rid = json.loads(next(lines)[len("data: ") :])["id"].removeprefix("cllm-")
    line = wait_for_line(server.stderr_lines, f"id={rid} ")
    assert "route=/generate_stream status=200" in line and line.rstrip().endswith("finish_reason=abort")


def test_bad_log_options_are_one_clear_line():
    for option, value in (("--log-level", "verbose"), ("--log-format", "xml")):
        r = subprocess.run(
            [sys.executable, "-m", "cllm.cli", "serve", option, value],
            cwd=ROOT,
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert (
            r.returncode == 2
            and r.stderr.startswith("cllm: invalid setting: Invalid enum value")
            and r.stderr.count("\n") == 1
        )


def _record(**fields) -> logging.LogRecord:
    try:
        raise ValueError("boom")
    except ValueError:
        exc_info = sys.exc_info()
    return logging.makeLogRecord(
        {
            "name": "cllm.test",
            "levelno": logging.WARNING,
            "levelname": "WARNING",
            "msg": "done %s",
            "args": ("here",),
            "exc_info": exc_info,
            "fields": fields,
        }
    )


def test_formatters_carry_the_fields():
    text = TextFormatter().format(_record(id="cllm-1", ttft=0.5))
    assert text.splitlines()[0].endswith(" WARNING cllm.test: done here id=cllm-1 ttft=0.5")
    assert "ValueError: boom" in text
    entry = json.loads(JsonFormatter().format(_record(id="cllm-1", ttft=0.5)))
    assert (
        entry["message"] == "done here"
        and entry["level"] == "warning"
        and entry["id"] == "cllm-1"
        and entry["ttft"] == 0.5
    )
    assert "ValueError: boom" in entry["exception"]
