"""Tokenization in the frontend, from a vocabulary-only load of the GGUF file."""

from __future__ import annotations

import codecs
import ctypes
from collections.abc import Sequence
from typing import NamedTuple

import llama_cpp as L

from cllm.core.llama_log import silence_llama_logs
from frontend_proc.core.template import ChatTemplate


class FimTokens(NamedTuple):
    """The model's fill-in-the-middle tokens (llama_vocab_fim_pre and the others)."""

    pre: int  # -1: the model has none
    suf: int
    mid: int
    rep: int
    sep: int


def fim_tokens(vocab) -> FimTokens:
    """Where a model's fill-in-the-middle tokens are read (/infill, Ollama's suffix and its capabilities)."""
    kinds = (
        L.llama_vocab_fim_pre,
        L.llama_vocab_fim_suf,
        L.llama_vocab_fim_mid,
        L.llama_vocab_fim_rep,
        L.llama_vocab_fim_sep,
    )
    return FimTokens(*(kind(vocab) for kind in kinds))


class Tokenizer:
    def __init__(self, model_path: str):
        silence_llama_logs()
        params = L.llama_model_default_params()
        params.vocab_only = True
        # No devices (an empty, NULL-ended list): without a list llama.cpp picks every GPU and asks each for its
        # free memory, which makes a CUDA context, ~600 MiB of VRAM, in this process that runs nothing there.
        none = (ctypes.c_void_p * 1)()
        params.devices = ctypes.cast(none, ctypes.c_void_p)
        self.model = L.llama_model_load_from_file(model_path.encode(), params)
        if not self.model:
            raise RuntimeError(f"llama.cpp could not load the vocabulary of {model_path}")
        self.vocab = L.llama_model_get_vocab(self.model)
        self.n_vocab = L.llama_vocab_n_tokens(self.vocab)
        self._pieces: dict[int, bytes] = {}
        self._piece_buf = ctypes.create_string_buffer(256)
        self._control: dict[tuple[str, ...], frozenset[int]] = {}

    def close(self) -> None:
        """Free the vocabulary, of a Tokenizer read for one look (a model's FIM tokens) and not kept."""
        L.llama_model_free(self.model)

    def chat_template(self, source: str | None = None) -> ChatTemplate:
        """``source``, else the file's `tokenizer.chat_template` (or a plain fallback), with its BOS and EOS."""
        if source is None and (own := L.llama_model_chat_template(self.model, None)):
            source = own.decode(errors="replace")
        return ChatTemplate(
            source,
            bos_token=self._text(L.llama_vocab_bos(self.vocab)),
            eos_token=self._text(L.llama_vocab_eos(self.vocab)),
            strip_bos=L.llama_vocab_get_add_bos(self.vocab),
        )

    def _text(self, token: int) -> str:
        return L.llama_vocab_get_text(self.vocab, token).decode(errors="replace") if token >= 0 else ""

    def encode(self, text: str, add_special: bool = True, parse_special: bool = True) -> list[int]:
        """Token ids of text; special tokens written out (<|im_end|>) are parsed, as llama-server does."""
        data = text.encode()
        size = len(data) + 8
        while True:
            buf = (L.llama_token * size)()
            n = L.llama_tokenize(self.vocab, data, len(data), buf, size, add_special, parse_special)
            if n >= 0:
                return buf[:n]
            size = -n

    def rerank_prompt(self, query: str, document: str) -> list[int]:
        """The tokens a reranker scores for a pair, as llama-server's format_prompt_rerank builds them: the file's
        rerank template (`tokenizer.chat_template.rerank`, Qwen3-Reranker's) with {query} and {document} filled in,
        else BOS, query, EOS, SEP, document, EOS as the vocabulary's add_bos/add_eos/add_sep flags say (SEP where
        there is no EOS)."""
        template = L.llama_model_chat_template(self.model, b"rerank")
        if template:
            prompt = template.decode(errors="replace").replace("{query}", query).replace("{document}", document)
            return self.encode(prompt, add_special=False)
        v = self.vocab
        eos = L.llama_vocab_eos(v) if L.llama_vocab_eos(v) >= 0 else L.llama_vocab_sep(v)
        bos = [L.llama_vocab_bos(v)] if L.llama_vocab_get_add_bos(v) else []
        end = [eos] if L.llama_vocab_get_add_eos(v) else []
        sep = [L.llama_vocab_sep(v)] if L.llama_vocab_get_add_sep(v) else []
        q = self.encode(query, add_special=False, parse_special=False)
        d = self.encode(document, add_special=False, parse_special=False)
        return bos + q + end + sep + d + end

    def decode(self, tokens: list[int]) -> bytes:
        """The bytes of tokens, control tokens written out (as llama-server's /detokenize)."""
        ids = (L.llama_token * len(tokens))(*tokens)
        size = 8 * len(tokens) + 8
        while True:
            buf = ctypes.create_string_buffer(size)
            n = L.llama_detokenize(self.vocab, ids, len(tokens), buf, size, False, True)
            if n >= 0:
                return buf.raw[:n]
            size = -n

    def piece(self, token: int) -> bytes:
        """The bytes one token stands for (control tokens: none)."""
        piece = self._pieces.get(token)
        if piece is None:
            n = L.llama_token_to_piece(self.vocab, token, self._piece_buf, len(self._piece_buf), 0, False)
            if n < 0:  # longer than the buffer
                buf = ctypes.create_string_buffer(-n)
                n = L.llama_token_to_piece(self.vocab, token, buf, -n, 0, False)
                piece = buf.raw[:n]
            else:
                piece = self._piece_buf.raw[:n]
            self._pieces[token] = piece
        return piece

    def token_str(self, token: int) -> str:
        """One token's text on its own (a piece of a split character shows as U+FFFD)."""
        return self.piece(token).decode(errors="replace")

    def detokenizer(self, shown: frozenset[int] = frozenset()) -> Detokenizer:
        """shown: control tokens whose text is written out (Mistral's [TOOL_CALLS], for the tool-call parser)."""
        if not shown:
            return Detokenizer(self.piece)
        written = {t: self.decode([t]) for t in shown}
        return Detokenizer(lambda t: written.get(t) or self.piece(t))

    def control_token(self, text: str) -> int | None:
        """The id of the control token written `text`, if there is one."""
        tokens = self.encode(text, add_special=False)
        return tokens[0] if len(tokens) == 1 and not self.piece(tokens[0]) else None

    def control_tokens(self, texts: tuple[str, ...]) -> frozenset[int]:
        """The ids of those of `texts` that are control tokens (looked up once)."""
        found = self._control.get(texts)
        if found is None:
            found = self._control[texts] = frozenset(t for text in texts if (t := self.control_token(text)) is not None)
        return found


class Detokenizer:
    """Incremental detokenization that only ever emits whole UTF-8 characters.

    Bytes of a character split across tokens are held back until it is
    complete; whatever is left at the end is decoded with replacement.
    """

    def __init__(self, piece):
        self._piece = piece
        self._utf8 = codecs.getincrementaldecoder("utf-8")(errors="replace")

    def feed(self, tokens: Sequence[int]) -> str:
        return self._utf8.decode(b"".join(map(self._piece, tokens)))

    def flush(self) -> str:
        return self._utf8.decode(b"", final=True)
