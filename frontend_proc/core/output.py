"""Structured output, whatever the door: the grammar a JSON output or a client's own GBNF grammar asks for.

The chat layer adds the tools' grammar on top (frontend_proc.chat.turn.constraint); the other doors use
``grammar_for`` as it is.
"""

from __future__ import annotations

from dataclasses import dataclass

from cllm.core.errors import invalid
from frontend_proc.core.grammar import GrammarError, json_grammar, user_grammar


@dataclass(frozen=True, slots=True)
class JsonOutput:
    """JSON output, enforced by a grammar: any JSON object (schema None), or what the schema allows."""

    schema: dict | None = None


@dataclass(frozen=True, slots=True)
class GrammarOutput:
    """Output a client's own GBNF grammar (start symbol root) allows: llama-server's `grammar` field."""

    gbnf: str


def output_grammar(vocab, output: JsonOutput | GrammarOutput | None, param: str) -> str | None:
    """The grammar of the output format; a 400 naming `grammar`, or ``param`` (where the door carries a JSON
    format), when llama.cpp cannot parse or enforce it."""
    if isinstance(output, GrammarOutput):
        try:
            return user_grammar(output.gbnf, vocab)
        except GrammarError as e:  # one llama.cpp cannot parse: its reason
            raise invalid(str(e), "grammar") from None
    if output is not None:
        try:
            return json_grammar(output.schema, vocab)
        except GrammarError as e:  # a schema llama.cpp cannot enforce
            raise invalid(str(e), param) from None
    return None


def check_ignore_eos(grammar: str | None, ignore_eos: bool) -> None:
    if grammar is not None and ignore_eos:  # the grammar's end can only be followed by an end-of-generation token
        raise invalid("ignore_eos cannot be combined with a grammar, a JSON output format or tool calls", "ignore_eos")


def grammar_for(vocab, output: JsonOutput | GrammarOutput | None, param: str, ignore_eos: bool) -> str | None:
    """The grammar of a request without tools."""
    found = output_grammar(vocab, output, param)
    check_ignore_eos(found, ignore_eos)
    return found
