"""Chat messages to prompt text, with the model's own Jinja template.

Rendered the way transformers renders `tokenizer.chat_template`: a sandboxed
environment that cannot touch the process or mutate its inputs, trimmed
blocks, `raise_exception` for templates that validate the conversation, and
`messages`, `add_generation_prompt`, `bos_token`, `eos_token` in scope.
"""

from __future__ import annotations

import functools
import json
import logging
from datetime import datetime

import jinja2
from jinja2.sandbox import ImmutableSandboxedEnvironment

log = logging.getLogger("cllm.frontend")

# For files that carry no template: a plain transcript, which any model can continue.
FALLBACK_TEMPLATE = (
    "{% for message in messages %}{{ message['role'] | capitalize }}: {{ message['content'] }}\n\n{% endfor %}"
    "{% if add_generation_prompt %}Assistant:{% endif %}"
)


class ChatTemplateError(ValueError):
    """The template refused the conversation, or failed on it."""


def _raise_exception(message: str):
    raise jinja2.TemplateError(message)


def _tojson(value, ensure_ascii=False, indent=None, separators=None, sort_keys=False) -> str:
    # As transformers: no HTML escaping (jinja2's own tojson escapes <, >, &).
    return json.dumps(value, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)


def _strftime_now(fmt: str) -> str:
    return datetime.now().strftime(fmt)


class ChatTemplate:
    def __init__(self, source: str | None, bos_token: str = "", eos_token: str = "", strip_bos: bool = False):
        """strip_bos: the tokenizer adds BOS itself, so a BOS the template writes first is dropped."""
        env = ImmutableSandboxedEnvironment(
            trim_blocks=True, lstrip_blocks=True, extensions=["jinja2.ext.loopcontrols"]
        )
        env.filters["tojson"] = _tojson
        env.globals["raise_exception"] = _raise_exception
        env.globals["strftime_now"] = _strftime_now
        try:
            self.template = env.from_string(source or FALLBACK_TEMPLATE)
            self.source = source or FALLBACK_TEMPLATE
        except jinja2.TemplateSyntaxError as e:
            log.warning("the model's chat template does not compile (%s); using a plain transcript", e)
            self.template = env.from_string(FALLBACK_TEMPLATE)
            self.source = FALLBACK_TEMPLATE
        self.bos_token, self.eos_token = bos_token, eos_token
        self._strip_bos = strip_bos and bool(bos_token)
        # What the template does with tools, found out as llama.cpp does: by trying.
        tool = {"type": "function", "function": {"name": "cllm_probe_tool", "parameters": {"type": "object"}}}
        self.renders_tools = self._renders("cllm_probe_tool", [{"role": "user", "content": "hi"}], [tool])
        result = {"role": "tool", "content": "cllm_probe_result", "tool_call_id": "call_0"}
        self.renders_tool_role = self._renders("cllm_probe_result", [{"role": "user", "content": "hi"}, result])

    @functools.cached_property
    def caps(self) -> dict[str, bool]:
        """What the template renders, by llama.cpp's names (common/jinja/caps.cpp, llama-server's
        chat_template_caps), found out as it does: by trying."""
        user = {"role": "user", "content": "hi"}

        def call(name: str, arguments: object = "{}") -> dict:
            return {"id": f"call_{name}", "type": "function", "function": {"name": name, "arguments": arguments}}

        def said(**message) -> list[dict]:
            return [user, {"role": "assistant", "content": "", **message}, user]

        return {
            "supports_string_content": self._renders(
                "cllm_probe_text", [{"role": "user", "content": "cllm_probe_text"}]
            ),
            "supports_typed_content": self._renders(
                "cllm_probe_text", [{"role": "user", "content": [{"type": "text", "text": "cllm_probe_text"}]}]
            ),
            "supports_tools": self.renders_tools,
            "supports_tool_calls": self._renders("cllm_probe_a", said(tool_calls=[call("cllm_probe_a")])),
            "supports_parallel_tool_calls": all(
                self._renders(name, said(tool_calls=[call("cllm_probe_a"), call("cllm_probe_b")]))
                for name in ("cllm_probe_a", "cllm_probe_b")
            ),
            "supports_system_role": self._renders(
                "cllm_probe_system", [{"role": "system", "content": "cllm_probe_system"}, user]
            ),
            "supports_preserve_reasoning": self._renders(
                "cllm_probe_thought", said(reasoning_content="cllm_probe_thought")
            ),
            "supports_reasoning_effort": "reasoning_effort" in self.source,
            "supports_object_arguments": self._renders(
                "cllm_probe_argument", said(tool_calls=[call("cllm_probe_a", {"cllm_probe_argument": 1})])
            ),
        }

    def _renders(self, probe: str, messages: list[dict], tools: list[dict] | None = None) -> bool:
        try:
            return probe in self.render(messages, tools=tools)
        except ChatTemplateError:
            return False

    def render(
        self,
        messages: list[dict],
        add_generation_prompt: bool = True,
        tools: list[dict] | None = None,
        context: dict | None = None,
    ) -> str:
        """The prompt text; `tools` (OpenAI's shape) is passed only when given, as transformers does.

        context: further template variables a request sets (enable_thinking, reasoning_effort).
        """
        extra = {"tools": tools} if tools else {}
        try:
            text = self.template.render(
                {
                    **(context or {}),
                    **extra,
                    "messages": messages,
                    "add_generation_prompt": add_generation_prompt,
                    "bos_token": self.bos_token,
                    "eos_token": self.eos_token,
                }
            )
        except jinja2.TemplateError as e:
            raise ChatTemplateError(str(e)) from None
        except (TypeError, ValueError, LookupError, AttributeError) as e:  # the template met data it does not expect
            raise ChatTemplateError(f"the chat template failed on these messages: {e}") from None
        if self._strip_bos and text.startswith(self.bos_token):
            text = text[len(self.bos_token) :]
        return text
