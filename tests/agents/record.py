"""A stand-in server that records what a coding agent sends, to make tests/fixtures/clients/.

It answers Anthropic's /v1/messages and OpenAI's /v1/responses with canned
streams, so that the agent carries on as it would against a real server: once
with a tool call when the prompt asks for one (so that the next request carries
the tool's result), else with text. Every request is written to DIR/NNN-<path>.json,
its ids, paths and machine details replaced by fixed stand-ins (scrub()).

    python tests/agents/record.py DIR PORT [PATH=STAND_IN ...]   # the agent's working and home directories
    # then, in an empty directory, with the environment of tests/agents/test_agents.py:
    claude -p "Say hello." --max-turns 1 --model smollm2           # ANTHROPIC_BASE_URL=http://127.0.0.1:PORT
    claude -p "List the files in this directory." --max-turns 3 --model smollm2 --allowedTools Bash
    codex exec --skip-git-repo-check "Say hello."                  # base_url = "http://127.0.0.1:PORT/v1"
    codex exec --skip-git-repo-check "List the files in this directory."
"""

from __future__ import annotations

import json
import os
import platform
import re
import sys
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

TOOL_PROMPT = "List the files"  # the tool-offering turn's prompt starts so
KEPT_HEADERS = ("content-type", "accept", "anthropic-version", "anthropic-beta", "user-agent", "originator")


def scrub(text: str, paths: dict[str, str]) -> str:
    """The recording without what names this machine, its user or the session (``paths``: directory -> stand-in)."""
    text = re.sub(
        r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}", "00000000-0000-0000-0000-000000000000", text
    )
    text = re.sub(r"\b[0-9a-f]{64}\b", "0" * 64, text)
    text = re.sub(r'(turn_started_at_unix_ms[\\"]*:)\d+', r"\g<1>0", text)
    text = re.sub(r'(agent_name[\\"]*:[\\"]*)/[^\\"]*', r"\g<1>/user", text)
    text = text.replace(platform.release(), "6.1.0")
    for path in sorted(paths, key=len, reverse=True):
        text = text.replace(path, paths[path]).replace(path.replace("/", "-"), paths[path].replace("/", "-"))
    return text


def _sse(name: str, data: dict) -> bytes:
    return f"event: {name}\ndata: {json.dumps(data)}\n\n".encode()


def _asked_for_tool(body: dict) -> bool:
    """The prompt asks for a tool and no tool result came back yet."""
    text = json.dumps(body.get("messages", body.get("input", "")))
    return TOOL_PROMPT in text and "tool_result" not in text and "function_call_output" not in text


def _tool_name(tools: list | None, *names: str) -> tuple[str, str] | None:
    """(type, name) of the first offered tool called one of ``names``."""
    for tool in tools or []:
        name = tool.get("name") or tool.get("function", {}).get("name")
        if name in names:
            return tool.get("type", ""), name
    return None


def anthropic(body: dict) -> list[bytes]:
    usage = {"input_tokens": 10, "output_tokens": 3, "cache_read_input_tokens": 0, "cache_creation_input_tokens": 0}
    message = {
        "id": "msg_1",
        "type": "message",
        "role": "assistant",
        "model": body.get("model", ""),
        "content": [],
        "stop_reason": None,
        "stop_sequence": None,
        "usage": usage,
    }
    out = [_sse("message_start", {"type": "message_start", "message": message})]
    tool = _asked_for_tool(body) and _tool_name(body.get("tools"), "Bash")
    if tool:
        out += [
            _sse(
                "content_block_start",
                {
                    "type": "content_block_start",
                    "index": 0,
                    "content_block": {"type": "tool_use", "id": "toolu_1", "name": "Bash", "input": {}},
                },
            ),
            _sse(
                "content_block_delta",
                {
                    "type": "content_block_delta",
                    "index": 0,
                    "delta": {
                        "type": "input_json_delta",
                        "partial_json": json.dumps({"command": "ls", "description": "List files"}),
                    },
                },
            ),
        ]
    else:
        out += [
            _sse(
                "content_block_start",
                {"type": "content_block_start", "index": 0, "content_block": {"type": "text", "text": ""}},
            ),
            _sse(
                "content_block_delta",
                {"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": "Hello."}},
            ),
        ]
    out += [
        _sse("content_block_stop", {"type": "content_block_stop", "index": 0}),
        _sse(
            "message_delta",
            {
                "type": "message_delta",
                "delta": {"stop_reason": "tool_use" if tool else "end_turn", "stop_sequence": None},
                "usage": {"output_tokens": 3},
            },
        ),
        _sse("message_stop", {"type": "message_stop"}),
    ]
    return out


def responses(body: dict) -> list[bytes]:
    tool = _asked_for_tool(body) and _tool_name(body.get("tools"), "shell", "exec_command", "shell_command")
    if tool:
        args = {"command": ["ls"]} if tool[1] == "shell" else {"cmd": "ls"}
        item: dict[str, Any] = {
            "type": "function_call",
            "id": "fc_1",
            "call_id": "call_1",
            "name": tool[1],
            "arguments": json.dumps(args),
            "status": "completed",
        }
    else:
        item = {
            "type": "message",
            "id": "msg_1",
            "role": "assistant",
            "status": "completed",
            "content": [{"type": "output_text", "text": "Hello.", "annotations": []}],
        }
    response = {
        "id": "resp_1",
        "object": "response",
        "created_at": 0,
        "status": "in_progress",
        "model": body.get("model", ""),
        "output": [],
    }
    done = {
        **response,
        "status": "completed",
        "output": [item],
        "usage": {
            "input_tokens": 10,
            "input_tokens_details": {"cached_tokens": 0},
            "output_tokens": 3,
            "output_tokens_details": {"reasoning_tokens": 0},
            "total_tokens": 13,
        },
    }
    out = [
        _sse("response.created", {"type": "response.created", "sequence_number": 0, "response": response}),
        _sse(
            "response.output_item.added",
            {
                "type": "response.output_item.added",
                "sequence_number": 1,
                "output_index": 0,
                "item": {**item, "status": "in_progress"},
            },
        ),
    ]
    if item["type"] == "message":
        out.append(
            _sse(
                "response.output_text.delta",
                {
                    "type": "response.output_text.delta",
                    "sequence_number": 2,
                    "item_id": "msg_1",
                    "output_index": 0,
                    "content_index": 0,
                    "delta": "Hello.",
                },
            )
        )
    return out + [
        _sse(
            "response.output_item.done",
            {"type": "response.output_item.done", "sequence_number": 3, "output_index": 0, "item": item},
        ),
        _sse("response.completed", {"type": "response.completed", "sequence_number": 4, "response": done}),
    ]


class Recorder(BaseHTTPRequestHandler):
    out_dir = "."
    paths: dict[str, str] = {}
    count = 0

    def _record(self, body: bytes) -> dict:
        Recorder.count += 1
        name = self.path.split("?")[0].strip("/").replace("/", "_") or "root"
        try:
            parsed = json.loads(body) if body else None
        except ValueError:
            parsed = body.decode(errors="replace")
        headers = {k.lower(): v for k, v in self.headers.items() if k.lower() in KEPT_HEADERS}
        entry = {"method": self.command, "path": self.path, "headers": headers, "body": parsed}
        with open(os.path.join(self.out_dir, f"{Recorder.count:03d}-{name}.json"), "w") as f:
            f.write(scrub(json.dumps(entry, indent=1), self.paths) + "\n")
        return parsed if isinstance(parsed, dict) else {}

    def _send(self, status: int, chunks: list[bytes], content_type: str) -> None:
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(sum(map(len, chunks))))
        self.end_headers()
        for c in chunks:
            self.wfile.write(c)

    def do_GET(self) -> None:
        self._record(b"")
        if self.path.startswith("/v1/models"):
            return self._send(
                200,
                [json.dumps({"object": "list", "data": [{"id": "smollm2", "object": "model"}]}).encode()],
                "application/json",
            )
        self._send(404, [b'{"error": "not found"}'], "application/json")

    def do_HEAD(self) -> None:
        self._record(b"")
        self._send(200, [], "text/plain")

    def do_POST(self) -> None:
        body = self._record(self.rfile.read(int(self.headers.get("Content-Length", 0))))
        path = self.path.split("?")[0]
        if path.endswith("/messages/count_tokens"):
            return self._send(200, [b'{"input_tokens": 10}'], "application/json")
        if path.endswith("/messages"):
            return self._send(200, anthropic(body), "text/event-stream")
        if path.endswith("/responses"):
            return self._send(200, responses(body), "text/event-stream")
        self._send(404, [b'{"error": "not found"}'], "application/json")

    def log_message(self, *args) -> None:
        pass


if __name__ == "__main__":
    Recorder.out_dir = sys.argv[1]
    Recorder.paths = dict(arg.split("=", 1) for arg in sys.argv[3:])
    os.makedirs(Recorder.out_dir, exist_ok=True)
    ThreadingHTTPServer(("127.0.0.1", int(sys.argv[2])), Recorder).serve_forever()
