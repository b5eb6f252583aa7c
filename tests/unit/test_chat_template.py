"""Chat template rendering: templates are plain strings, no model (the embedded model's own:
tests/test_model_template.py)."""

from __future__ import annotations

import pytest

from frontend_proc.core.template import FALLBACK_TEMPLATE, ChatTemplate, ChatTemplateError

CHATML = (
    "{% for message in messages %}{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + "
    "'\\n' }}"
    "{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)
LLAMA2ISH = (
    "{{ bos_token }}{% for message in messages %}"
    "{% if (message['role'] == 'user') != (loop.index0 % 2 == 0) %}"
    "{{ raise_exception('Conversation roles must alternate user/assistant/user/assistant/...') }}{% endif %}"
    "{% if message['role'] == 'user' %}{{ '[INST] ' + message['content'] + ' [/INST]' }}"
    "{% else %}{{ ' ' + message['content'] + eos_token }}{% endif %}{% endfor %}"
)
TURNS = [
    {"role": "system", "content": "Be brief."},
    {"role": "user", "content": "Hi"},
    {"role": "assistant", "content": "Hello!"},
    {"role": "user", "content": "Bye"},
]


def test_chatml_multi_turn_with_generation_prompt():
    text = ChatTemplate(CHATML).render(TURNS)
    assert text == (
        "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n"
        "<|im_start|>assistant\nHello!<|im_end|>\n<|im_start|>user\nBye<|im_end|>\n<|im_start|>assistant\n"
    )
    assert not ChatTemplate(CHATML).render(TURNS, add_generation_prompt=False).endswith("<|im_start|>assistant\n")


def test_bos_eos_tokens_and_raise_exception():
    tmpl = ChatTemplate(LLAMA2ISH, bos_token="<s>", eos_token="</s>")
    turns = [
        {"role": "user", "content": "Hi"},
        {"role": "assistant", "content": "Hello"},
        {"role": "user", "content": "Bye"},
    ]
    assert tmpl.render(turns) == "<s>[INST] Hi [/INST] Hello</s>[INST] Bye [/INST]"
    with pytest.raises(ChatTemplateError, match="roles must alternate"):
        tmpl.render([{"role": "user", "content": "a"}, {"role": "user", "content": "b"}])


def test_bos_written_by_the_template_is_dropped_when_the_tokenizer_adds_it():
    assert (
        ChatTemplate(LLAMA2ISH, bos_token="<s>", eos_token="</s>", strip_bos=True).render(TURNS[1:2])
        == "[INST] Hi [/INST]"
    )


def test_fallback_template_for_files_without_one():
    tmpl = ChatTemplate(None)
    assert tmpl.source == FALLBACK_TEMPLATE
    assert tmpl.render(TURNS) == "System: Be brief.\n\nUser: Hi\n\nAssistant: Hello!\n\nUser: Bye\n\nAssistant:"
    assert ChatTemplate("{% for m in messages %}").source == FALLBACK_TEMPLATE  # does not compile


def test_tojson_does_not_escape_html():
    assert ChatTemplate("{{ messages[0] | tojson }}").render([{"role": "user", "content": "<b>&</b>"}]) == (
        '{"role": "user", "content": "<b>&</b>"}'
    )


@pytest.mark.parametrize(
    "source",
    [
        "{{ messages.__class__.__mro__ }}{{ ''.__class__.__subclasses__() }}",  # no way out of the sandbox
        "{% set _ = messages.append({'role': 'user', 'content': 'x'}) %}",  # and the inputs are read-only
    ],
)
def test_sandbox(source):
    with pytest.raises(ChatTemplateError):
        ChatTemplate(source).render(TURNS)


def test_template_failing_on_unexpected_data_is_an_error():
    with pytest.raises(ChatTemplateError):
        ChatTemplate("{{ messages[0]['content'] + 1 }}").render(TURNS)
