"""How deep a request body nests, read before it is decoded: brackets in strings do not count, nor do escapes."""

from __future__ import annotations

import json

import pytest

from frontend_proc.http.body import MAX_DEPTH, _depth


def nested(levels: int, inner: str = "1") -> str:
    """Objects and arrays in turn, ``levels`` deep."""
    opens = "".join('{"a":' if i % 2 else "[" for i in range(levels))
    closes = "".join("}" if i % 2 else "]" for i in reversed(range(levels)))
    return opens + inner + closes


@pytest.mark.parametrize("levels", [MAX_DEPTH - 1, MAX_DEPTH, MAX_DEPTH + 1, 5000])
def test_objects_and_arrays_in_turn_count_each_level(levels):
    body = nested(levels).encode()
    if levels < 500:  # deeper, Python's json module cannot read it either
        json.loads(body)  # what is measured is valid JSON
    assert _depth(body) == min(levels, MAX_DEPTH + 1)


@pytest.mark.parametrize(
    "text",
    [
        "[[[[" * 100,  # brackets in a string
        '\\"' + "[" * 300,  # after an escaped quote, still in the string
        "]]]]" * 100 + "{" * 50,
    ],
)
def test_brackets_in_strings_do_not_count(text):
    body = json.dumps({"s": text, "t": [[1], [2]], "more": [text, {"x": text}]}).encode()
    assert _depth(body) == 3


def test_an_escaped_backslash_before_a_closing_quote_ends_the_string():
    # "a\\" is a string of a and a backslash: the brackets after it are the body's own.
    body = ('{"s": "a\\\\", "t": ' + nested(MAX_DEPTH + 10) + ', "u": "[[[["}').encode()
    json.loads(body)
    assert _depth(body) == MAX_DEPTH + 1


def test_a_long_flat_body_is_shallow():
    body = json.dumps({"messages": [{"role": "user", "content": "x[y]{z}" * 50}] * 2000}).encode()
    assert _depth(body) == 3


def test_brackets_that_do_not_pair_are_left_to_the_decoder():
    # Not JSON: msgspec refuses it with its own message; the scan counts what pairs.
    assert _depth(b"[" * 300) == 0
    assert _depth(b"[" * 300 + b"]" * 10) == 10
