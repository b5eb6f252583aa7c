"""Reasoning models: thinking split from the answer, by the parser alone and end to end on every chat route.

No thinking model ships in a package here, so the parser is checked on
replies in the formats those models write (fed whole, and cut into pieces at
every position, markers split included), and the routes with a chat template
that opens a think block as Qwen3's and DeepSeek-R1's do, or gpt-oss's
analysis channel: the embedded model then writes its reply inside it.
"""

from __future__ import annotations

import anthropic
import openai
import pytest

from cllm.core.model_file import embedded_model_path
from frontend_proc.chat.reasoning import (
    CONTENT,
    HARMONY_TOKENS,
    REASONING,
    HarmonySplitter,
    ReasoningSplitter,
    opened_in_harmony,
    opened_in_prompt,
    split,
)
from frontend_proc.core.tokenizer import Tokenizer
from tests.conftest import start_server

# (reply, closing marker the prompt left open, expected reasoning, expected answer)
REPLIES = [
    # Qwen3, thinking on: the model opens the block itself.
    (
        "<think>\nOkay, the user asks for the capital of France. That is Paris.\n</think>\n\nThe capital of France is "
        "**Paris**.",
        None,
        "Okay, the user asks for the capital of France. That is Paris.",
        "The capital of France is **Paris**.",
    ),
    # DeepSeek-R1 distills: the template writes "<think>\n", the reply starts inside the block.
    (
        "Alright, 2 + 2.\nThat is 4.\n</think>\n\n2 + 2 = **4**.",
        "</think>",
        "Alright, 2 + 2.\nThat is 4.",
        "2 + 2 = **4**.",
    ),
    # Qwen3 with enable_thinking false: the template wrote an empty block; a plain answer.
    ("The capital of France is Paris.", None, "", "The capital of France is Paris."),
    # Magistral's markers.
    ("[THINK]Short question.[/THINK]Paris.", None, "Short question.", "Paris."),
    # Cut by max_tokens while thinking: all of it is reasoning.
    ("<think>\nLet me count: one, two, thr", None, "Let me count: one, two, thr", ""),
    # A marker the answer mentions later is the answer's.
    ("Use <think> tags </think> to think.", None, "", "Use <think> tags </think> to think."),
    # A reply that starts like a marker but is not one.
    ("<thinking about it> no.", None, "", "<thinking about it> no."),
    # A closing marker within the reasoning's last characters, and </ that is not one.
    ("<think>a </b> c</think>answer </think>", None, "a </b> c", "answer </think>"),
]


def _fed(reply: str, closing: str | None, cuts: list[int], harmony: bool) -> tuple[str, str]:
    splitter = HarmonySplitter(closing is not None, calls=True) if harmony else ReasoningSplitter(closing)
    parts = []
    for start, end in zip([0, *cuts], [*cuts, len(reply)]):
        parts += splitter.feed(reply[start:end])
    parts += splitter.flush()
    assert all(text for _, text in parts), "no empty parts"
    return "".join(t for k, t in parts if k == REASONING), "".join(t for k, t in parts if k == CONTENT)


# gpt-oss, in the harmony format its template asks for (the prompt ends with "<|start|>assistant"):
# (reply with its control tokens shown, "<|end|>" if the prompt opened the analysis channel, reasoning, answer).
HARMONY = [
    (
        '<|channel|>analysis<|message|>User asks: "What is the capital of France?" Simple: Paris.<|end|>'
        "<|start|>assistant<|channel|>final<|message|>The capital of France is **Paris**.",
        None,
        'User asks: "What is the capital of France?" Simple: Paris.',
        "The capital of France is **Paris**.",
    ),
    # Low effort, no analysis.
    ("<|channel|>final<|message|>Paris.", None, "", "Paris."),
    # Cut by max_tokens while thinking.
    ("<|channel|>analysis<|message|>We need to count: one, two", None, "We need to count: one, two", ""),
    # A preamble on the commentary channel is the answer's; the stray commentary prefix gpt-oss-20b writes is dropped.
    (
        "<|channel|>commentary<|channel|>analysis<|message|>Plan "
        "it.<|end|><|start|>assistant<|channel|>commentary<|message|>"
        "Let me check. <|end|><|start|>assistant<|channel|>final<|message|>Done: 4 < 5.",
        None,
        "Plan it.",
        "Let me check. Done: 4 < 5.",
    ),
    # A call in harmony's own syntax stays in the answer as written, for the tool-call parser (test_tool_parser.py),
    # never in the reasoning.
    (
        "<|channel|>analysis<|message|>Need the weather.<|end|><|start|>assistant<|channel|>commentary "
        "to=functions.get_weather "
        '<|constrain|>json<|message|>{"city": "Paris"}',
        None,
        "Need the weather.",
        '<|start|>assistant<|channel|>commentary to=functions.get_weather <|constrain|>json<|message|>{"city": '
        '"Paris"}',
    ),
    # The template opened the analysis channel.
    ("Short.<|end|><|start|>assistant<|channel|>final<|message|>Paris.", "<|end|>", "Short.", "Paris."),
    # A model that does not write harmony: all answer; markers the answer mentions are the answer's.
    ("Paris <|end|> is the capital.", None, "", "Paris <|end|> is the capital."),
    ("<|channel|>final<|message|>Write <|end|> or <|start|>.", None, "", "Write <|end|> or <|start|>."),
    ("<|start|>tail", None, "", "<|start|>tail"),
]


@pytest.mark.parametrize(
    "reply,closing,reasoning,answer,harmony", [(*r, False) for r in REPLIES] + [(*r, True) for r in HARMONY]
)
def test_split_whole_and_in_every_piece_size(reply, closing, reasoning, answer, harmony):
    if not harmony:
        assert split(reply, closing) == (reasoning, answer)
    assert _fed(reply, closing, [], harmony) == (reasoning, answer)
    for cut in range(1, len(reply)):  # two pieces, cut at every position (markers split included)
        assert _fed(reply, closing, [cut], harmony) == (reasoning, answer), cut
    for size in (1, 2, 3, 5, 7):  # token-sized pieces
        assert _fed(reply, closing, list(range(size, len(reply), size)), harmony) == (reasoning, answer), size


def test_harmony_header_without_message_marker_is_the_answer():
    """A reply that starts like a header but never becomes one is not held back for long."""
    reply = "<|channel|>" + "x" * 300
    splitter = HarmonySplitter()
    parts = [p for i in range(0, len(reply), 10) for p in splitter.feed(reply[i : i + 10])]
    assert parts[0][0] == CONTENT and len(parts[0][1]) <= 266  # released once it is longer than a header may be
    assert "".join(t for _, t in parts + splitter.flush()) == reply


def test_opened_in_prompt():
    assert opened_in_harmony("<|start|>user<|message|>hi<|end|><|start|>assistant<|channel|>analysis<|message|>")
    assert not opened_in_harmony("<|start|>user<|message|>hi<|end|><|start|>assistant")
    assert opened_in_prompt("<|im_start|>assistant\n<think>\n") == "</think>"
    assert opened_in_prompt("<|im_start|>assistant\n<think>\n\n</think>\n\n") is None
    assert opened_in_prompt("<|im_start|>assistant\n") is None


# ChatML, as the embedded model's, with Qwen3's switch: the generation prompt opens a think block
# unless enable_thinking is false, which writes an empty one.
THINK_TEMPLATE = (
    "{% for message in messages %}{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>\\n' "
    "}}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}"
    "{% if enable_thinking is defined and not enable_thinking %}{{ '<think>\\n\\n</think>\\n\\n' }}{% else %}{{ "
    "'<think>\\n' }}{% endif %}"
    "{% endif %}"
)
QUESTION = [{"role": "user", "content": "What is the capital of France?"}]
MODEL = "any"


@pytest.fixture(scope="module")
def think_server(tmp_path_factory):
    path = tmp_path_factory.mktemp("template") / "think.jinja"
    path.write_text(THINK_TEMPLATE)
    with start_server("--parallel", "2", "--ctx-size", "2048", "--chat-template-file", str(path)) as srv:
        yield srv, path


@pytest.fixture(scope="module")
def oai(think_server):
    with openai.OpenAI(base_url=think_server[0].url + "/v1", api_key="unused", timeout=120, max_retries=0) as client:
        yield client


def test_chat_completions_reasoning_content(oai):
    whole = oai.chat.completions.create(model=MODEL, messages=QUESTION, max_tokens=20, temperature=0)
    message = whole.choices[0].message
    reasoning = message.model_extra["reasoning_content"]
    assert reasoning.strip() and message.content == ""  # the block never closed within 20 tokens
    assert "<think>" not in reasoning and "</think>" not in reasoning
    pieces, content = [], []
    for chunk in oai.chat.completions.create(model=MODEL, messages=QUESTION, max_tokens=20, temperature=0, stream=True):
        delta = chunk.choices[0].delta
        pieces.append((delta.model_extra or {}).get("reasoning_content") or "")
        content.append(delta.content or "")
    assert "".join(pieces) == reasoning and "".join(content) == ""


def test_thinking_off_reaches_the_template(oai, think_server):
    off = oai.chat.completions.create(
        model=MODEL,
        messages=QUESTION,
        max_tokens=20,
        temperature=0,
        extra_body={"chat_template_kwargs": {"enable_thinking": False}},
    )
    assert off.choices[0].message.content.strip() and "reasoning_content" not in (
        off.choices[0].message.model_extra or {}
    )
    effort = oai.chat.completions.create(
        model=MODEL, messages=QUESTION, max_tokens=20, temperature=0, reasoning_effort="none"
    )
    assert effort.choices[0].message.content == off.choices[0].message.content
    responses = oai.responses.create(
        model=MODEL,
        input="What is the capital of France?",
        max_output_tokens=20,
        temperature=0,
        reasoning={"effort": "none"},
    )
    assert [item.type for item in responses.output] == ["message"] and responses.output_text == off.choices[
        0
    ].message.content
    with anthropic.Anthropic(base_url=think_server[0].url, api_key="unused", max_retries=0) as claude:
        message = claude.messages.create(
            model=MODEL, max_tokens=20, messages=QUESTION, thinking={"type": "disabled"}, extra_body={"temperature": 0}
        )
    assert [b.type for b in message.content] == ["text"] and message.content[0].text == off.choices[0].message.content


def test_messages_thinking_blocks(oai, think_server):
    reasoning = (
        oai.chat.completions.create(model=MODEL, messages=QUESTION, max_tokens=20, temperature=0)
        .choices[0]
        .message.model_extra["reasoning_content"]
    )
    with anthropic.Anthropic(base_url=think_server[0].url, api_key="unused", max_retries=0) as claude:
        message = claude.messages.create(model=MODEL, max_tokens=20, messages=QUESTION, extra_body={"temperature": 0})
        assert [b.type for b in message.content] == ["thinking"] and message.content[0].thinking == reasoning
        with claude.messages.stream(
            model=MODEL, max_tokens=20, messages=QUESTION, extra_body={"temperature": 0}
        ) as stream:
            deltas = [e.delta.type for e in stream if e.type == "content_block_delta"]
            final = stream.get_final_message()
    assert set(deltas) == {"thinking_delta"} and final.content[0].thinking == reasoning


def test_responses_reasoning_items(oai):
    reasoning = (
        oai.chat.completions.create(model=MODEL, messages=QUESTION, max_tokens=20, temperature=0)
        .choices[0]
        .message.model_extra["reasoning_content"]
    )
    r = oai.responses.create(model=MODEL, input="What is the capital of France?", max_output_tokens=20, temperature=0)
    assert [item.type for item in r.output] == ["reasoning", "message"] and r.output_text == ""
    assert r.output[0].content[0].text == reasoning
    # Every token is the reasoning's (the block never closed); counted again from its text, one or two may differ.
    assert 0 < r.usage.output_tokens - 2 <= r.usage.output_tokens_details.reasoning_tokens <= r.usage.output_tokens
    events = list(
        oai.responses.create(
            model=MODEL, input="What is the capital of France?", max_output_tokens=20, temperature=0, stream=True
        )
    )
    assert "".join(e.delta for e in events if e.type == "response.reasoning_text.delta") == reasoning
    assert [e.item.type for e in events if e.type == "response.output_item.done"] == ["reasoning", "message"]
    assert (
        events[-1].response.usage.output_tokens_details.reasoning_tokens
        == r.usage.output_tokens_details.reasoning_tokens
    )


def test_reasoning_format_none_leaves_the_text(think_server, oai):
    reasoning = (
        oai.chat.completions.create(model=MODEL, messages=QUESTION, max_tokens=20, temperature=0)
        .choices[0]
        .message.model_extra["reasoning_content"]
    )
    with start_server(
        "--parallel",
        "2",
        "--ctx-size",
        "2048",
        "--chat-template-file",
        str(think_server[1]),
        "--reasoning-format",
        "none",
    ) as srv:
        with openai.OpenAI(base_url=srv.url + "/v1", api_key="unused", max_retries=0) as raw:
            message = (
                raw.chat.completions.create(model=MODEL, messages=QUESTION, max_tokens=20, temperature=0)
                .choices[0]
                .message
            )
    assert "reasoning_content" not in (message.model_extra or {})
    assert message.content.strip() == reasoning.strip()


# The harmony format of gpt-oss's template, whose generation prompt here opens the analysis channel.
HARMONY_TEMPLATE = (
    "{% for message in messages %}{{ '<|start|>' + message['role'] + '<|message|>' + message['content'] + '<|end|>' "
    "}}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|start|>assistant<|channel|>analysis<|message|>' }}{% endif %}"
)


@pytest.fixture(scope="module")
def harmony_url(tmp_path_factory):
    path = tmp_path_factory.mktemp("template") / "harmony.jinja"
    path.write_text(HARMONY_TEMPLATE)
    with start_server("--parallel", "2", "--ctx-size", "2048", "--chat-template-file", str(path)) as srv:
        yield srv.url


def test_harmony_reasoning_on_every_route(harmony_url):
    """gpt-oss's analysis channel: reasoning_content, a thinking block, a reasoning item; whole and streamed alike."""
    with openai.OpenAI(base_url=harmony_url + "/v1", api_key="unused", timeout=120, max_retries=0) as client:
        message = (
            client.chat.completions.create(model=MODEL, messages=QUESTION, max_tokens=20, temperature=0)
            .choices[0]
            .message
        )
        reasoning = message.model_extra["reasoning_content"]
        assert reasoning.strip() and message.content == "" and "<|" not in reasoning
        chunks = list(
            client.chat.completions.create(model=MODEL, messages=QUESTION, max_tokens=20, temperature=0, stream=True)
        )
        assert (
            "".join((c.choices[0].delta.model_extra or {}).get("reasoning_content") or "" for c in chunks) == reasoning
        )
        r = client.responses.create(model=MODEL, input=QUESTION[0]["content"], max_output_tokens=20, temperature=0)
        assert [item.type for item in r.output] == ["reasoning", "message"] and r.output[0].content[0].text == reasoning
    with anthropic.Anthropic(base_url=harmony_url, api_key="unused", max_retries=0) as claude:
        with claude.messages.stream(
            model=MODEL, max_tokens=20, messages=QUESTION, extra_body={"temperature": 0}
        ) as stream:
            final = stream.get_final_message()
    assert [b.type for b in final.content] == ["thinking"] and final.content[0].thinking == reasoning


def test_control_tokens_found_in_the_vocabulary():
    """Harmony's markers are control tokens of gpt-oss's vocabulary; the reply's text shows those that are."""
    tok = Tokenizer(embedded_model_path())
    start = tok.control_token("<|im_start|>")  # a control token of this vocabulary, as <|channel|> is of gpt-oss's
    assert tok.control_tokens(("<|im_start|>", "<|channel|>", "Hello")) == {start}
    assert tok.control_tokens(HARMONY_TOKENS) == frozenset()  # SmolLM2 writes them as plain text
