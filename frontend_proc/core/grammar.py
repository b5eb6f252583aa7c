"""Structured output: a JSON schema (or any JSON) as a GBNF grammar for llama.cpp's grammar sampler, or a
client's own GBNF grammar.

The frontend converts and parses the grammar before submitting, so a schema
llama.cpp cannot enforce, or a grammar it cannot parse, is a 400 (quoting
llama.cpp's reason) and never reaches the engine.

The converter writes a count (`maxItems`, `maxLength`, a pattern's `{m,n}`)
as that many copies of a rule, the optional ones nested in each other, and
llama.cpp's grammar parser recurses once per level: a count of a million in
a 40-byte schema would take the frontend's memory, time and C stack. So the
counts a schema asks for are summed first and refused above MAX_REPEATS.
"""

from __future__ import annotations

import re
from functools import lru_cache

import llama_cpp as L
import msgspec
from llama_cpp.llama_grammar import JSON_GBNF, json_schema_to_gbnf

from cllm.core import llama_log

MAX_REPEATS = 2048  # the counts of one schema, all together
MAX_NESTING = 200  # of a grammar's parentheses: llama.cpp's parser recurses once per level, on the C stack
QUANTIFIER = re.compile(r"\{([^}]*)\}")  # {n}, {m,n}, {m,}: read up to the next brace, as the converter does


class GrammarError(ValueError):
    pass


def json_grammar(schema: dict | None, vocab) -> str:
    """The grammar of JSON output: any JSON object (schema None), or what the schema allows."""
    return JSON_GBNF if schema is None else schema_grammar(schema, vocab)


def schema_grammar(schema: dict, vocab) -> str:
    """The grammar of one JSON schema; GrammarError for one llama.cpp cannot enforce."""
    repeats = schema_repeats(schema)
    if repeats > MAX_REPEATS:
        raise GrammarError(
            f"unsupported JSON schema: its lengths and counts add up to {repeats}, more than {MAX_REPEATS}"
        )
    return json_schema_grammar(msgspec.json.encode(schema).decode(), vocab)


@lru_cache(maxsize=64)  # clients send the same schema again and again
def json_schema_grammar(schema_json: str, vocab) -> str:
    try:
        gbnf = json_schema_to_gbnf(schema_json)
    except Exception as e:  # the converter asserts (and may fail otherwise) on what it cannot express
        raise GrammarError(f"unsupported JSON schema: {e}") from None
    check(gbnf, vocab)
    return gbnf


def schema_repeats(schema) -> int:
    """How many copies of rules the converter would write for a schema's counts and pattern quantifiers."""
    total, todo = 0, [schema]
    while todo:  # iterative: a deeply nested schema must not exhaust Python's recursion
        node = todo.pop()
        if isinstance(node, dict):
            total += max(_count(node.get("minItems")), _count(node.get("maxItems")))
            total += max(_count(node.get("minLength")), _count(node.get("maxLength")))
            if isinstance(pattern := node.get("pattern"), str):
                total += sum(_quantifier(body) for body in QUANTIFIER.findall(pattern))
            todo.extend(node.values())
        elif isinstance(node, list):
            todo.extend(node)
    return total


def _count(value) -> int:
    return value if type(value) is int and value > 0 else 0


def _quantifier(body: str) -> int:
    """The larger count of a quantifier, read with int() as the converter reads it."""
    try:
        return max([0, *(int(n) for n in body.split(",") if n.strip())])
    except ValueError:  # the converter's int() fails the same way, and the schema is refused
        return 0


def check(gbnf: str, vocab) -> None:
    """Raise GrammarError unless llama.cpp parses the grammar (as the engine will)."""
    sampler = L.llama_sampler_init_grammar(vocab, gbnf.encode(), b"root")
    if not sampler:
        raise GrammarError("llama.cpp cannot parse the grammar made from this schema")
    L.llama_sampler_free(sampler)


@lru_cache(maxsize=64)
def user_grammar(gbnf: str, vocab) -> str:
    """A client's GBNF grammar (start symbol root), once llama.cpp parses it; else GrammarError with its reason."""
    if not gbnf.strip():
        raise GrammarError("the grammar is empty")
    depth = nesting(gbnf)
    if depth > MAX_NESTING:
        raise GrammarError(f"the grammar nests parentheses {depth} deep, more than {MAX_NESTING}")
    with llama_log.capture() as said:  # its reason, for the client rather than the log
        sampler = L.llama_sampler_init_grammar(vocab, gbnf.encode(), b"root")
    if not sampler:
        raise GrammarError(f"llama.cpp cannot parse the grammar: {parse_error(said)}")
    L.llama_sampler_free(sampler)
    return gbnf


def parse_error(said: list[str]) -> str:
    """The reason in what llama.cpp said when it refused a grammar."""
    for line in said:
        if "error parsing grammar: " in line:
            return line.split("error parsing grammar: ", 1)[1].strip()
    reasons = [line.strip() for line in said if "failed to parse grammar" not in line]
    return "; ".join(reasons) or "no reason given"


def nesting(gbnf: str) -> int:
    """How deep the grammar's parentheses go, outside its strings, character classes and comments."""
    depth = most = 0
    i, n = 0, len(gbnf)
    while i < n:
        c = gbnf[i]
        if c in '"[':
            close = '"' if c == '"' else "]"
            i += 1
            while i < n and gbnf[i] != close:
                i += 2 if gbnf[i] == "\\" else 1
        elif c == "#":
            while i < n and gbnf[i] != "\n":
                i += 1
        elif c == "(":
            depth += 1
            most = max(most, depth)
        elif c == ")":
            depth -= 1
        i += 1
    return most
