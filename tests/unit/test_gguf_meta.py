"""cllm/core/gguf_meta.py, the one reader of a GGUF file's metadata, on a file written by perf/gguf_io.py: with
arrays=False (what Ollama's /api/show reads) the arrays are read past, and every value after them still reads."""

from __future__ import annotations

from cllm.core.gguf_meta import ARRAY, BOOL, FLOAT32, INT32, STRING, UINT32, read_metadata
from perf.gguf_io import header

METADATA = {
    "general.architecture": (STRING, "llama"),
    "tokenizer.ggml.tokens": (ARRAY, (STRING, ["<s>", "a", "bc", "déf"])),
    "tokenizer.ggml.token_type": (ARRAY, (INT32, [3, 1, 1, 1])),
    "llama.rope.freq_base": (FLOAT32, 10000.0),
    "nested": (ARRAY, (ARRAY, [(UINT32, [1, 2]), (STRING, ["x"])])),
    "llama.context_length": (UINT32, 8192),
    "general.flag": (BOOL, True),
}


def test_arrays_are_read_past_and_what_follows_still_reads(tmp_path):
    path = tmp_path / "m.gguf"
    path.write_bytes(header(METADATA, [])[0])
    everything = read_metadata(str(path))
    assert everything["tokenizer.ggml.tokens"] == (ARRAY, (STRING, ["<s>", "a", "bc", "déf"]))
    assert everything["llama.context_length"] == (UINT32, 8192)
    scalars = read_metadata(str(path), arrays=False)
    assert scalars == {k: v for k, v in METADATA.items() if v[0] != ARRAY}
