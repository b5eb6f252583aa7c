"""The request dialects of `cllm bench http` (cllm/bench/http_load.py): each server's route for the same greedy
request of exactly G tokens (ignore_eos), and how to read the generated-token count back from its answer, whole
or streamed.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class Dialect:
    path: str

    def body(self, prompt: str, gen_tokens: int, stream: bool) -> dict:
        raise NotImplementedError

    def tokens(self, answer: dict) -> int:
        """Generated tokens from a non-streaming answer."""
        raise NotImplementedError

    def event(self, event: dict) -> tuple[str, int | None]:
        """A streamed event's text, and the generated-token count if it tells."""
        raise NotImplementedError

    def payload(self, line: bytes) -> bytes | None:
        """A streamed line's JSON (None: a line that carries none): server-sent events, `data: {...}`."""
        return line[6:].strip() if line.startswith(b"data: ") else None


class Cllm(Dialect):
    def body(self, prompt, gen_tokens, stream):
        return {"prompt": prompt, "max_tokens": gen_tokens, "temperature": 0, "ignore_eos": True, "stream": stream}

    def tokens(self, answer):
        return answer["data"]["generated_tokens"]

    def event(self, event):
        return event.get("token", ""), event.get("generated_tokens")


@dataclass
class OpenAI(Dialect):
    model: str = "default"
    ban_tokens: tuple[int, ...] = ()

    def body(self, prompt, gen_tokens, stream):
        body = {
            "model": self.model,
            "prompt": prompt,
            "max_tokens": gen_tokens,
            "temperature": 0,
            "ignore_eos": True,
            "stream": stream,
        }
        if self.ban_tokens:
            body["logit_bias"] = {str(t): -100 for t in self.ban_tokens}
        if stream:
            body["stream_options"] = {"include_usage": True}
        return body

    def tokens(self, answer):
        return answer["usage"]["completion_tokens"]

    def event(self, event):
        usage = event.get("usage")
        choices = event.get("choices") or [{}]
        return choices[0].get("text") or "", usage["completion_tokens"] if usage else None


class LlamaServer(Dialect):
    def body(self, prompt, gen_tokens, stream):
        return {
            "prompt": prompt,
            "n_predict": gen_tokens,
            "temperature": 0,
            "ignore_eos": True,
            "cache_prompt": False,
            "stream": stream,
        }

    def tokens(self, answer):
        return answer["tokens_predicted"]

    def event(self, event):
        return event.get("content", ""), event.get("tokens_predicted") if event.get("stop") else None


@dataclass
class Chat(Dialect):
    """The same greedy request through a chat route: /v1/chat/completions, /v1/messages or /v1/responses."""

    api: str = "chat"  # chat, messages or responses

    def body(self, prompt, gen_tokens, stream):
        body = {"model": "default", "temperature": 0, "ignore_eos": True, "stream": stream}
        if self.api == "responses":
            return {**body, "input": prompt, "max_output_tokens": gen_tokens, "store": False}
        body = {**body, "messages": [{"role": "user", "content": prompt}], "max_tokens": gen_tokens}
        if self.api == "chat" and stream:
            body["stream_options"] = {"include_usage": True}
        return body

    def tokens(self, answer):
        usage = answer["usage"]
        return usage["completion_tokens"] if self.api == "chat" else usage["output_tokens"]

    def event(self, event):
        if self.api == "chat":
            usage = event.get("usage")
            choices = event.get("choices") or [{}]
            return choices[0].get("delta", {}).get("content") or "", usage["completion_tokens"] if usage else None
        kind = event["type"]
        if kind in ("content_block_delta", "response.output_text.delta"):
            return event["delta"]["text"] if self.api == "messages" else event["delta"], None
        if kind == "message_delta":
            return "", event["usage"]["output_tokens"]
        if kind in ("response.completed", "response.incomplete"):
            return "", event["response"]["usage"]["output_tokens"]
        return "", None


@dataclass
class Ollama(Dialect):
    """Ollama's /api/chat: options.num_predict, a JSON object a line, the done one counting eval_count."""

    model: str = "default"  # a name /api/tags lists: the Ollama door answers an unknown one 404

    def body(self, prompt, gen_tokens, stream):
        return {
            "model": self.model,
            "messages": [{"role": "user", "content": prompt}],
            "stream": stream,
            "options": {"num_predict": gen_tokens, "temperature": 0, "ignore_eos": True},
        }

    def tokens(self, answer):
        return answer["eval_count"]

    def event(self, event):
        return event.get("message", {}).get("content", ""), event.get("eval_count") if event.get("done") else None

    def payload(self, line):
        return line.strip() or None


CHAT_PATHS = {
    "chat": "/v1/chat/completions",
    "messages": "/v1/messages",
    "responses": "/v1/responses",
    "ollama": "/api/chat",
}


def make_dialect(name: str, model: str = "default", ban_tokens: tuple[int, ...] = ()) -> Dialect:
    if name == "cllm":
        return Cllm("/generate")
    if name == "openai":
        return OpenAI("/v1/completions", model, ban_tokens)
    if name == "llama-server":
        return LlamaServer("/completion")
    if name == "ollama":
        return Ollama(CHAT_PATHS[name], model)
    if name in CHAT_PATHS:
        return Chat(CHAT_PATHS[name], name)
    raise ValueError(f"unknown dialect {name!r}")


DIALECTS = ("cllm", "openai", "llama-server", *CHAT_PATHS)
