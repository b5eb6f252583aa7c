"""Structured output: a JSON schema (or any JSON) as a GBNF grammar for llama.cpp's grammar sampler.

The frontend converts and parses the grammar before submitting, so a schema
llama.cpp cannot enforce is a 400 and never reaches the engine.
"""

from __future__ import annotations

from functools import lru_cache

import llama_cpp as L
import msgspec
from llama_cpp.llama_grammar import JSON_GBNF, json_schema_to_gbnf

from frontend_proc.openai_schemas import JsonObjectFormat, JsonSchemaFormat, ResponseFormat


class GrammarError(ValueError):
    pass


def response_format_grammar(fmt: ResponseFormat | None, vocab) -> str | None:
    """The grammar a response_format asks for; None for plain text."""
    if type(fmt) is JsonObjectFormat:
        return JSON_GBNF
    if type(fmt) is JsonSchemaFormat:
        return json_schema_grammar(msgspec.json.encode(fmt.json_schema.schema).decode(), vocab)
    return None


@lru_cache(maxsize=64)  # clients send the same schema again and again
def json_schema_grammar(schema_json: str, vocab) -> str:
    try:
        gbnf = json_schema_to_gbnf(schema_json)
    except Exception as e:  # the converter asserts (and may fail otherwise) on what it cannot express
        raise GrammarError(f"unsupported JSON schema: {e}") from None
    check(gbnf, vocab)
    return gbnf


def check(gbnf: str, vocab) -> None:
    """Raise GrammarError unless llama.cpp parses the grammar (as the engine will)."""
    sampler = L.llama_sampler_init_grammar(vocab, gbnf.encode(), b"root")
    if not sampler:
        raise GrammarError("llama.cpp cannot parse the grammar made from this schema")
    L.llama_sampler_free(sampler)
