"""Reasoning models: thinking split from the answer, by the parser alone and end to end on every chat route.

No thinking model ships in a package here, so the parser is checked on
replies in the formats those models write (fed whole, and cut into pieces at
every position, markers split included), and the routes with a chat template
that opens a think block as Qwen3's and DeepSeek-R1's do: the embedded model
then writes its reply inside the block.
"""

from __future__ import annotations

import anthropic
import openai
import pytest

from frontend_proc.reasoning import CONTENT, REASONING, ReasoningSplitter, opened_in_prompt, split
from tests.conftest import start_server

# (reply, closing marker the prompt left open, expected reasoning, expected answer)
REPLIES = [
    # Qwen3, thinking on: the model opens the block itself.
    (
        "<think>\nOkay, the user asks for the capital of France. That is Paris.\n</think>\n\nThe capital of France is **Paris**.",
        None,
        "Okay, the user asks for the capital of France. That is Paris.",
        "The capital of France is **Paris**.",
    ),
    # DeepSeek-R1 distills: the template writes "<think>\n", the reply starts inside the block.
    ("Alright, 2 + 2.\nThat is 4.\n</think>\n\n2 + 2 = **4**.", "</think>", "Alright, 2 + 2.\nThat is 4.", "2 + 2 = **4**."),
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


def _fed(reply: str, closing: str | None, cuts: list[int]) -> tuple[str, str]:
    splitter = ReasoningSplitter(closing)
    parts = []
    for start, end in zip([0, *cuts], [*cuts, len(reply)]):
        parts += splitter.feed(reply[start:end])
    parts += splitter.flush()
    assert all(text for _, text in parts), "no empty parts"
    return "".join(t for k, t in parts if k == REASONING), "".join(t for k, t in parts if k == CONTENT)


@pytest.mark.parametrize("reply,closing,reasoning,answer", REPLIES)
def test_split_whole_and_in_every_piece_size(reply, closing, reasoning, answer):
    assert split(reply, closing) == (reasoning, answer)
    for cut in range(1, len(reply)):  # two pieces, cut at every position (markers split included)
        assert _fed(reply, closing, [cut]) == (reasoning, answer), cut
    for size in (1, 2, 3, 5):  # token-sized pieces
        assert _fed(reply, closing, list(range(size, len(reply), size))) == (reasoning, answer), size


def test_opened_in_prompt():
    assert opened_in_prompt("<|im_start|>assistant\n<think>\n") == "</think>"
    assert opened_in_prompt("<|im_start|>assistant\n<think>\n\n</think>\n\n") is None
    assert opened_in_prompt("<|im_start|>assistant\n") is None


# ChatML, as the embedded model's, with Qwen3's switch: the generation prompt opens a think block
# unless enable_thinking is false, which writes an empty one.
THINK_TEMPLATE = (
    "{% for message in messages %}{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>\\n' }}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}"
    "{% if enable_thinking is defined and not enable_thinking %}{{ '<think>\\n\\n</think>\\n\\n' }}{% else %}{{ '<think>\\n' }}{% endif %}"
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
        model=MODEL, messages=QUESTION, max_tokens=20, temperature=0, extra_body={"chat_template_kwargs": {"enable_thinking": False}}
    )
    assert off.choices[0].message.content.strip() and "reasoning_content" not in (off.choices[0].message.model_extra or {})
    effort = oai.chat.completions.create(model=MODEL, messages=QUESTION, max_tokens=20, temperature=0, reasoning_effort="none")
    assert effort.choices[0].message.content == off.choices[0].message.content
    responses = oai.responses.create(model=MODEL, input="What is the capital of France?", max_output_tokens=20, temperature=0,
                                     reasoning={"effort": "none"})
    assert [item.type for item in responses.output] == ["message"] and responses.output_text == off.choices[0].message.content
    with anthropic.Anthropic(base_url=think_server[0].url, api_key="unused", max_retries=0) as claude:
        message = claude.messages.create(model=MODEL, max_tokens=20, messages=QUESTION, thinking={"type": "disabled"},
                                         extra_body={"temperature": 0})
    assert [b.type for b in message.content] == ["text"] and message.content[0].text == off.choices[0].message.content


def test_messages_thinking_blocks(oai, think_server):
    reasoning = oai.chat.completions.create(model=MODEL, messages=QUESTION, max_tokens=20, temperature=0).choices[0].message.model_extra[
        "reasoning_content"
    ]
    with anthropic.Anthropic(base_url=think_server[0].url, api_key="unused", max_retries=0) as claude:
        message = claude.messages.create(model=MODEL, max_tokens=20, messages=QUESTION, extra_body={"temperature": 0})
        assert [b.type for b in message.content] == ["thinking"] and message.content[0].thinking == reasoning
        with claude.messages.stream(model=MODEL, max_tokens=20, messages=QUESTION, extra_body={"temperature": 0}) as stream:
            deltas = [e.delta.type for e in stream if e.type == "content_block_delta"]
            final = stream.get_final_message()
    assert set(deltas) == {"thinking_delta"} and final.content[0].thinking == reasoning


def test_responses_reasoning_items(oai):
    reasoning = oai.chat.completions.create(model=MODEL, messages=QUESTION, max_tokens=20, temperature=0).choices[0].message.model_extra[
        "reasoning_content"
    ]
    r = oai.responses.create(model=MODEL, input="What is the capital of France?", max_output_tokens=20, temperature=0)
    assert [item.type for item in r.output] == ["reasoning", "message"] and r.output_text == ""
    assert r.output[0].content[0].text == reasoning
    events = list(oai.responses.create(model=MODEL, input="What is the capital of France?", max_output_tokens=20, temperature=0, stream=True))
    assert "".join(e.delta for e in events if e.type == "response.reasoning_text.delta") == reasoning
    assert [e.item.type for e in events if e.type == "response.output_item.done"] == ["reasoning", "message"]


def test_reasoning_format_none_leaves_the_text(think_server, oai):
    reasoning = oai.chat.completions.create(model=MODEL, messages=QUESTION, max_tokens=20, temperature=0).choices[0].message.model_extra[
        "reasoning_content"
    ]
    with start_server("--parallel", "2", "--ctx-size", "2048", "--chat-template-file", str(think_server[1]), "--reasoning-format", "none") as srv:
        with openai.OpenAI(base_url=srv.url + "/v1", api_key="unused", max_retries=0) as raw:
            message = raw.chat.completions.create(model=MODEL, messages=QUESTION, max_tokens=20, temperature=0).choices[0].message
    assert "reasoning_content" not in (message.model_extra or {})
    assert message.content.strip() == reasoning.strip()
