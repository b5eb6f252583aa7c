r"""The fill-in-the-middle prompt of /infill, built token for token as llama-server builds it (format_prompt_infill).

The repository-level pattern (https://arxiv.org/pdf/2409.12186), each part
present only when the model has its token:

    [FIM_REP]myproject\n [FIM_SEP]filename0\n chunk 0 ... [FIM_SEP]filename\n
    [BOS] [FIM_PRE] prefix prompt [FIM_SUF] suffix [FIM_MID]

Without a separator token, each chunk is preceded by "\n\n--- snippet ---\n\n".
The prefix keeps its last 3/4 of a batch, the suffix its first quarter (less
the prompt), and the chunks fill what the context has left, their ends kept.
"""

from __future__ import annotations

from collections.abc import Callable

from frontend_proc.core.tokenizer import FimTokens

CHUNK_SEPARATOR = "\n\n--- snippet ---\n\n"
N_PREDICT = -1  # llama-server sizes the chunks with its launch default (-1), not the request's n_predict


def missing_fim(fim: FimTokens) -> str:
    """What llama-server says a model lacks for infill (empty: nothing)."""
    names = (("prefix", fim.pre), ("suffix", fim.suf), ("middle", fim.mid))
    return "".join(f"{name} token is missing. " for name, token in names if token < 0)


def infill_prompt(
    encode: Callable[[str], list[int]],
    fim: FimTokens,
    bos: int | None,
    prefix: list[int],
    suffix: list[int],
    extra: list[tuple[str, str]],
    typed: list[int],
    n_batch: int,
    n_ctx: int,
) -> list[int]:
    """The prompt's tokens; encode: text to tokens without special tokens; bos: the BOS to start with, if the
    model adds one; extra: (filename, text) chunks; typed: the request's own prompt, after the prefix."""
    extra_tokens: list[int] = []
    if fim.rep >= 0:
        extra_tokens += [fim.rep, *encode("myproject\n")]
    for filename, text in extra:
        if fim.sep >= 0:
            extra_tokens += [fim.sep, *encode(filename + "\n")]
        else:
            extra_tokens += encode(CHUNK_SEPARATOR)
        extra_tokens += encode(text)
    if fim.sep >= 0:
        extra_tokens += [fim.sep, *encode("filename\n")]

    n_prefix = min(len(prefix), 3 * (n_batch // 4))
    n_suffix = min(len(suffix), max(0, n_batch // 4 - (2 + len(typed))))
    n_extra = min(max(0, n_ctx - n_batch - 2 * N_PREDICT), len(extra_tokens))

    head = [fim.pre, *prefix[len(prefix) - n_prefix :], *typed]
    tail = [fim.suf, *suffix[:n_suffix]]
    if bos is not None:
        head.insert(0, bos)
    return [*extra_tokens[len(extra_tokens) - n_extra :], *head, *tail, fim.mid]
