"""A recording proxy between a coding agent and `cllm serve`: greedy decoding, and every exchange kept to read.

The agents send their own sampling settings (Claude Code temperature 1), so
what they get back would differ from run to run; the proxy sets temperature 0
and a seed on every generation request, and writes one fixed date where their
prompts carry today's, fixed stand-ins for the run's directories and for the
chunk id and time above Codex's tool output, making
each turn the same every run, any day. In a turn that is to use a tool
(``call_tool``), the request that carries no tool result yet asks for a call
(Anthropic's tool_choice "any", the Responses API's "required"), one, and
the requests that carry its result ask for none: the 135M model, offered
Bash, writes about the command instead of calling it, and once it calls,
calls on.
It keeps each request's body and its reply, read back as Reply: how it ended
(stop, length or tool), its text and its tool calls, in either API's shape.
"""

from __future__ import annotations

import json
import re
import threading
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import httpx

GREEDY = {"temperature": 0, "seed": 1}
GENERATES = ("/v1/messages", "/v1/responses")  # count_tokens and the rest pass unchanged
# What changes from run to run in their prompts: today's date as each writes it (Claude Code's system prompt, Codex's
# environment context), Codex's tool output header.
RUN_SPECIFIC = (
    (re.compile(r"Today's date is \d{4}-\d{2}-\d{2}"), "Today's date is 2026-11-26"),
    (re.compile(r"<current_date>[^<]*</current_date>"), "<current_date>2026-11-26</current_date>"),
    # Claude Code's --bare prompt, after "\n" as JSON writes it (where \b found no word boundary: the date went through)
    (re.compile(r"Date: \d{4}-\d{2}-\d{2}"), "Date: 2026-11-26"),
    # What Codex writes above a command's output: a random chunk id and the time it took.
    (re.compile(r"Chunk ID: [0-9a-f]+"), "Chunk ID: 000000"),
    (re.compile(r"Wall time: [0-9.]+ seconds"), "Wall time: 0.0000 seconds"),
)
# One call (several in parallel ran the 135M model to its length limit), then an answer: offered its tools again,
# the model called one after another and Codex, which sets no limit on turns, ran each.
MUST_CALL: dict[str, dict[str, Any]] = {
    "/v1/messages": {"tool_choice": {"type": "any", "disable_parallel_tool_use": True}},
    "/v1/responses": {"tool_choice": "required", "parallel_tool_calls": False},
}
# The call is to the agent's shell, and the command `ls`, where it offers one: left to choose among Codex's tools, the
# 135M model's pick depended on rounding (on another machine it chose request_user_input and wrote its questions to
# the length limit), and left to write the command, it wrote `git-clone-git-repo-...` to the limit. The server
# enforces the narrowed schema with its grammar; what is tested is the call's round trip through the CLI.
SHELLS = {"/v1/messages": ("Bash", "input_schema", "command"), "/v1/responses": ("exec_command", "parameters", "cmd")}
NAMED = {
    "/v1/messages": lambda name: {"type": "tool", "name": name, "disable_parallel_tool_use": True},
    "/v1/responses": lambda name: {"type": "function", "name": name},
}
COMMAND = "ls"
NO_CALL: dict[str, dict[str, Any]] = {
    "/v1/messages": {"tool_choice": {"type": "none"}},
    "/v1/responses": {"tool_choice": "none"},
}
HOP = {"connection", "keep-alive", "transfer-encoding", "content-length", "host", "accept-encoding"}


@dataclass
class Call:
    id: str  # Anthropic's tool_use id, the Responses API's call_id: what the result must name
    name: str
    arguments: dict | str


@dataclass
class Reply:
    end: str  # stop (end of sequence), length (cut at its limit) or tool (ended by a tool call)
    text: str
    calls: list[Call] = field(default_factory=list)


@dataclass
class Exchange:
    path: str
    body: dict
    status: int
    content: bytes

    def reply(self) -> Reply:
        """The reply read from the stream (or JSON) that answered this request."""
        if self.path.startswith("/v1/messages"):
            return (
                _anthropic(_events(self.content))
                if self.content.startswith(b"event:")
                else _anthropic_message(json.loads(self.content))
            )
        stream = _events(self.content)
        return _response(stream[-1][1]["response"] if stream else json.loads(self.content))


class Proxy:
    def __init__(self, upstream: str, paths: dict[str, str] | None = None):
        self.upstream = upstream
        self.paths = paths or {}  # a run's own directories (in the prompts) -> fixed stand-ins
        self.call_tool = False
        self.exchanges: list[Exchange] = []
        proxy = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self):
                proxy._forward(self, None)

            def do_HEAD(self):
                proxy._forward(self, None)

            def do_POST(self):
                proxy._forward(self, self.rfile.read(int(self.headers.get("Content-Length", 0))))

            def log_message(self, *args):
                pass

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.httpd.daemon_threads = True  # closing does not wait on a request the server is still answering
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)

    def __enter__(self) -> Proxy:
        self.thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()
        self.thread.join(10)

    def generations(self, path: str) -> list[Exchange]:
        return [e for e in self.exchanges if e.path.split("?")[0] == path]

    @staticmethod
    def _choice(route: str, body: dict) -> dict[str, Any]:
        """What a turn that is to use a tool asks: a call to the shell running `ls` (or to any tool) until a result
        comes back, then none."""
        if tool_results(body):
            return NO_CALL[route]
        name, schema, arg = SHELLS[route]
        tools = body.get("tools") or []
        if not any(t.get("name") == name for t in tools):
            return MUST_CALL[route]
        narrowed = {"type": "object", "properties": {arg: {"enum": [COMMAND]}}, "required": [arg]}
        tools = [{**t, schema: narrowed} if t.get("name") == name else t for t in tools]
        return {**MUST_CALL[route], "tool_choice": NAMED[route](name), "tools": tools}

    def _forward(self, handler: BaseHTTPRequestHandler, raw: bytes | None) -> None:
        path = handler.path
        body = json.loads(raw) if raw else None
        if isinstance(body, dict) and path.split("?")[0] in GENERATES:
            route = path.split("?")[0]
            must = self._choice(route, body) if self.call_tool else {}
            text = json.dumps({**body, **GREEDY, **must})
            for today, fixed in RUN_SPECIFIC:
                text = today.sub(fixed, text)
            for own, stand_in in self.paths.items():
                text = text.replace(own, stand_in)
            body, raw = json.loads(text), text.encode()
        headers = {k: v for k, v in handler.headers.items() if k.lower() not in HOP}
        # The whole reply is read before it is passed on: the agents read a stream sent with a length as well.
        with httpx.Client(timeout=None) as c:
            r = c.request(handler.command, self.upstream + path, content=raw, headers=headers)
        if isinstance(body, dict):
            self.exchanges.append(Exchange(path.split("?")[0], body, r.status_code, r.content))
        handler.send_response(r.status_code)
        for k, v in r.headers.items():
            if k.lower() not in HOP:
                handler.send_header(k, v)
        handler.send_header("Content-Length", str(len(r.content)))
        handler.end_headers()
        if handler.command != "HEAD":
            handler.wfile.write(r.content)


def _events(content: bytes) -> list[tuple[str, dict]]:
    out, name = [], ""
    for line in content.decode().splitlines():
        if line.startswith("event: "):
            name = line[7:]
        elif line.startswith("data: "):
            out.append((name, json.loads(line[6:])))
    return out


ANTHROPIC_ENDS = {"end_turn": "stop", "max_tokens": "length", "tool_use": "tool"}


def _anthropic(stream: list[tuple[str, dict]]) -> Reply:
    blocks: list[dict] = []
    end = "?"
    for name, data in stream:
        if name == "content_block_start":
            blocks.append({**data["content_block"], "json": ""})
        elif name == "content_block_delta":
            delta = data["delta"]
            if delta["type"] == "text_delta":
                blocks[-1]["text"] += delta["text"]
            elif delta["type"] == "input_json_delta":
                blocks[-1]["json"] += delta["partial_json"]
        elif name == "message_delta":
            end = data["delta"]["stop_reason"]
    for b in blocks:
        if b["type"] == "tool_use":
            b["input"] = _arguments(b["json"] or "{}")
    return _anthropic_message({"content": blocks, "stop_reason": end})


def _anthropic_message(message: dict) -> Reply:
    blocks = message["content"]
    return Reply(
        ANTHROPIC_ENDS.get(message["stop_reason"], message["stop_reason"]),
        "".join(b["text"] for b in blocks if b["type"] == "text"),
        [Call(b["id"], b["name"], b["input"]) for b in blocks if b["type"] == "tool_use"],
    )


def _response(response: dict) -> Reply:
    items = response["output"]
    calls = [Call(i["call_id"], i["name"], _arguments(i["arguments"])) for i in items if i["type"] == "function_call"]
    text = "".join(p.get("text", "") for i in items if i["type"] == "message" for p in i["content"])
    end = "length" if response["status"] == "incomplete" else "tool" if calls else "stop"
    return Reply(end, text, calls)


def _arguments(text: str) -> dict | str:
    """A call's arguments, or their text where it is not JSON (cut at the length limit): a failed check shows it."""
    try:
        return json.loads(text)
    except json.JSONDecodeError:
        return text


def tool_results(body: dict) -> list[tuple[str, str]]:
    """(call id, the result's text) for each tool result in a request: Anthropic's tool_result blocks, the Responses
    API's function_call_output items."""
    out = []
    for message in body.get("messages", ()):
        for block in message["content"] if isinstance(message["content"], list) else ():
            if block.get("type") == "tool_result":
                content = block.get("content", "")
                text = content if isinstance(content, str) else "".join(b.get("text", "") for b in content)
                out.append((block["tool_use_id"], text))
    items = body.get("input", ())
    for item in items if isinstance(items, list) else ():
        if item.get("type") == "function_call_output":
            out.append((item["call_id"], str(item["output"])))
    return out


def without_results(body: dict) -> dict:
    """The request with each tool result's text emptied."""
    body = json.loads(json.dumps(body))
    for message in body.get("messages", ()):
        for block in message["content"] if isinstance(message["content"], list) else ():
            if block.get("type") == "tool_result":
                block["content"] = ""
    items = body.get("input", ())
    for item in items if isinstance(items, list) else ():
        if item.get("type") == "function_call_output":
            item["output"] = ""
    return body
