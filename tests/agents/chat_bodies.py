"""The chat body an agent's Anthropic or Responses API request means, written apart from the doors that translate
them: what /apply-template renders to count a recorded prompt, and what /v1/chat/completions is asked greedily to check
an agent's reply for near ties."""

from __future__ import annotations

import json


def chat_body(body: dict) -> dict:
    """A Responses API body as the chat body it means (developer messages as system ones, calls as tool_calls, their
    outputs as tool messages, only function tools): what /apply-template renders to count its prompt."""
    messages = [{"role": "system", "content": body["instructions"]}] if body.get("instructions") else []
    for item in body["input"]:
        kind = item.get("type", "message")
        if kind == "message":
            content = (
                item["content"] if isinstance(item["content"], str) else "".join(p["text"] for p in item["content"])
            )
            messages.append({"role": "system" if item["role"] == "developer" else item["role"], "content": content})
        elif kind == "function_call":
            if messages[-1]["role"] != "assistant":
                messages.append({"role": "assistant", "content": ""})
            call = {
                "id": item["call_id"],
                "type": "function",
                "function": {"name": item["name"], "arguments": item["arguments"]},
            }
            messages[-1].setdefault("tool_calls", []).append(call)
        elif kind == "function_call_output":
            messages.append({"role": "tool", "tool_call_id": item["call_id"], "content": item["output"]})
    tools = [
        {"type": "function", "function": {k: t[k] for k in ("name", "description", "parameters") if k in t}}
        for t in body.get("tools", [])
        if t["type"] == "function"
    ]
    return {"messages": messages, "tools": tools}


def anthropic_chat_body(body: dict) -> dict:
    """An Anthropic body as the chat body it means: the system blocks but Claude Code's billing one joined with its
    system-role messages, text blocks joined, tool_use blocks as tool_calls and tool_result blocks as tool messages,
    the tools it offers (those with defer_loading not yet referenced left out: these bodies reference none). Written
    here apart from the door, so a door that drops part of the prompt counts less than this."""
    system = body.get("system") or ""
    if isinstance(system, list):
        system = "\n".join(b["text"] for b in system if not b["text"].startswith("x-anthropic-billing-header:"))
    systems, messages = [system] if system else [], []

    def text(content, joiner: str = "") -> str:
        return content if isinstance(content, str) else joiner.join(b["text"] for b in content if b["type"] == "text")

    for message in body["messages"]:
        if message["role"] == "system":
            systems.append(text(message["content"], "\n"))
            continue
        blocks = message["content"] if isinstance(message["content"], list) else []
        for block in blocks:
            if block["type"] == "tool_result":
                messages.append(
                    {"role": "tool", "tool_call_id": block["tool_use_id"], "content": text(block["content"], "\n")}
                )
        calls = [
            {"id": b["id"], "type": "function", "function": {"name": b["name"], "arguments": json.dumps(b["input"])}}
            for b in blocks
            if b["type"] == "tool_use"
        ]
        said = text(message["content"])
        if said or calls or not message["content"]:
            messages.append({"role": message["role"], "content": said, **({"tool_calls": calls} if calls else {})})

    def description(tool: dict) -> dict:
        return {"description": tool["description"]} if "description" in tool else {}

    tools = [
        {"type": "function", "function": {"name": t["name"], "parameters": t["input_schema"]} | description(t)}
        for t in body.get("tools", [])
        if not t.get("defer_loading")
    ]
    return {
        "messages": [{"role": "system", "content": "\n\n".join(systems)}, *messages] if systems else messages,
        "tools": tools,
    }
