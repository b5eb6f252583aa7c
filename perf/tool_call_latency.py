"""What a `required` tool call costs over a plain chat reply of the same length.

One server; the same question as a tool call (tool_choice required, so the
grammar constrains every token) and as a plain reply with the same prompt (the
generic form's system text written as a system message) and exactly as many
tokens (ignore_eos), taking turns for R rounds. Usage:
    .venv/bin/python -m perf.tool_call_latency [--model PATH] [--rounds 10]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time
from typing import Any

import httpx

from cllm.core.model_file import resolve_model
from frontend_proc.chat.tools import Tool, generic_system_text
from perf import servers

ADD: dict[str, Any] = {
    "name": "add",
    "description": "Add two integers",
    "parameters": {
        "type": "object",
        "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}},
        "required": ["a", "b"],
    },
}
QUESTION = [{"role": "user", "content": "What is 12 plus 30?"}]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model")
    ap.add_argument("--rounds", type=int, default=10)
    ap.add_argument("--threads", type=int, default=os.cpu_count())
    args = ap.parse_args()
    tool_call = {
        "messages": QUESTION,
        "tools": [{"type": "function", "function": ADD}],
        "tool_choice": "required",
        "parallel_tool_calls": False,
        "temperature": 0,
    }
    system = generic_system_text([Tool(ADD["name"], ADD["description"], json.dumps(ADD["parameters"]))], "required")
    settings = servers.Settings(resolve_model(args.model), args.threads, 1, seq_ctx=1024)
    with servers.start("cllm", settings) as server, httpx.Client(base_url=server.url, timeout=300) as http:
        first = http.post("/v1/chat/completions", json=tool_call).json()
        n = first["usage"]["completion_tokens"]
        plain = {
            "messages": [{"role": "system", "content": system}, *QUESTION],
            "temperature": 0,
            "max_tokens": n,
            "ignore_eos": True,
        }
        times: dict[str, list[float]] = {"tool call": [], "plain reply": []}
        for _ in range(args.rounds):
            for label, body in (("tool call", tool_call), ("plain reply", plain)):
                t = time.perf_counter()
                reply = http.post("/v1/chat/completions", json=body).json()
                times[label].append(time.perf_counter() - t)
                assert (
                    reply["usage"]["completion_tokens"] == n
                    and reply["usage"]["prompt_tokens"] == first["usage"]["prompt_tokens"]
                )
    tool_ms, plain_ms = (statistics.median(times[k]) * 1000 for k in ("tool call", "plain reply"))
    print(f"{n} tokens after a {first['usage']['prompt_tokens']}-token prompt, {args.rounds} rounds, medians:")
    print(f"required tool call {tool_ms:.1f} ms, plain reply {plain_ms:.1f} ms, ratio {tool_ms / plain_ms:.3f}")


if __name__ == "__main__":
    main()
