"""The text the Ray Serve ingress routes by (cllm/ray_serve/call.py): no Ray needed."""

from __future__ import annotations

import json

from cllm.ray_serve.call import BLOCK_CHARS, routing_text, text_blocks


def chat(*turns: str) -> bytes:
    roles = ["user", "assistant"]
    return json.dumps(
        {
            "messages": [{"role": "system", "content": "Be brief."}]
            + [{"role": roles[i % 2], "content": t} for i, t in enumerate(turns)]
        }
    ).encode()


def test_a_chat_turn_starts_with_the_text_of_the_turn_before():
    one = routing_text(chat("What is the capital of France? " * 5))
    two = routing_text(chat("What is the capital of France? " * 5, "Paris.", "And of Spain?"))
    assert one and two.startswith(one)
    blocks_one, blocks_two = text_blocks(one), text_blocks(two)
    assert len(blocks_one) == len(one.encode()) // BLOCK_CHARS > 0
    assert blocks_two[: len(blocks_one)] == blocks_one


def test_every_api_shape_gives_its_text():
    assert routing_text(b'{"prompt": "Once upon a time"}') == "Once upon a time"
    assert routing_text(b'{"prompt": [1, 2]}') == "1,2,"
    anthropic = routing_text(
        b'{"system": "S", "messages": [{"role": "user", "content": [{"type": "text", "text": "hi"}]}]}'
    )
    assert anthropic.startswith("S") and "hi" in anthropic
    assert "hello" in routing_text(b'{"input": "hello", "instructions": "I"}')


def test_bodies_that_say_nothing_route_by_nothing():
    for body in (b"", b"not json", b"[1, 2]", b'{"messages": null}', b"\xff\xfe"):
        assert routing_text(body) == ""
    assert text_blocks("short") == []


def test_different_prompts_differ_from_their_first_block():
    a, b = text_blocks("a" * 300), text_blocks("b" + "a" * 299)
    assert a[0] != b[0] and a[1] != b[1]
