"""The embedded model's own chat template, read from its GGUF metadata (template rendering alone:
tests/unit/test_chat_template.py)."""

from __future__ import annotations

from cllm.core.model_file import resolve_model
from frontend_proc.core.tokenizer import Tokenizer
from tests.unit.test_chat_template import TURNS  # a system prompt, then user, assistant, user


def test_embedded_model_template_from_gguf_metadata():
    tmpl = Tokenizer(resolve_model(None)).chat_template()
    assert "<|im_start|>" in tmpl.source
    assert tmpl.bos_token == "<|im_start|>" and tmpl.eos_token == "<|im_end|>"
    # SmolLM2's template adds its default system prompt when the conversation has none.
    assert tmpl.render(TURNS[1:2]).startswith("<|im_start|>system\nYou are a helpful AI assistant named SmolLM")
    assert tmpl.render(TURNS).startswith("<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi")
