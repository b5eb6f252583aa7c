"""cllm/core/gguf_check.py refuses every malformed GGUF with a sentence saying what is wrong, and passes sound ones:
a small file written by perf/gguf_io.py, then that file cut short, given offsets past its end, absurd counts and
lengths, and tensors on each other's bytes; and the embedded model."""

from __future__ import annotations

import struct

import pytest

from cllm.core.gguf_check import GGUFError, check
from cllm.core.gguf_meta import ARRAY, STRING, UINT32
from cllm.core.model_file import embedded_model_path
from perf.gguf_io import header

F32, F16, Q4_0 = 0, 1, 2
METADATA = {
    "general.architecture": (STRING, "llama"),
    "tokenizer.ggml.tokens": (ARRAY, (STRING, ["<s>", "a", "bc"])),
    "llama.context_length": (UINT32, 8192),
}
TENSORS = [("t.a", (64,), F32, 256), ("t.b", (32, 2), F16, 128), ("t.c", (64,), Q4_0, 36)]


def sound() -> bytearray:
    head, offsets = header(METADATA, TENSORS)
    end = offsets[-1] + TENSORS[-1][3]
    return bytearray(head + bytes(range(256)) * (end // 256 + 1))[:end]


def _at(data: bytearray, needle: bytes) -> int:
    at = data.find(needle)
    assert at > 0
    return at


def tensor_field(data: bytearray, name: str, field: str) -> int:
    """Where tensor `name`'s n_dims, type or offset field is in the file."""
    at = _at(data, struct.pack("<Q", len(name)) + name.encode()) + 8 + len(name)
    n_dims = struct.unpack_from("<I", data, at)[0]
    return {"n_dims": at, "type": at + 4 + 8 * n_dims, "offset": at + 4 + 8 * n_dims + 4}[field]


def patched(fmt: str, at: int, value: int) -> bytearray:
    data = sound()
    struct.pack_into(fmt, data, at, value)
    return data


def key_length(key: str) -> int:
    return _at(sound(), struct.pack("<Q", len(key)) + key.encode())


BAD = {
    "not GGUF": (lambda: patched("<4s", 0, b"GGML"), "does not start with the GGUF magic"),  # type: ignore[arg-type]
    "version 1": (lambda: patched("<I", 4, 1), "GGUF version is 1"),
    "cut in the header": (lambda: sound()[:200], "of t.a at byte .* needs .* bytes but the file ends"),
    "cut in the data": (lambda: sound()[:-10], "tensor t.c .* runs past the file's end"),
    "offset past the end": (
        lambda: patched("<Q", tensor_field(sound(), "t.b", "offset"), 1 << 40),
        "tensor t.b .* runs past the file's end",
    ),
    "absurd tensor count": (lambda: patched("<Q", 8, 1 << 62), "claims 4,611,686,018,427,387,904 tensors"),
    "absurd metadata count": (lambda: patched("<Q", 16, 1 << 40), "claims 1,099,511,627,776 metadata entries"),
    "absurd key length": (
        lambda: patched("<Q", key_length("general.architecture"), 1 << 60),
        r"metadata key 0 \(1152921504606846976 bytes long\).*file ends",
    ),
    "absurd string array": (
        lambda: patched("<Q", _at(sound(), struct.pack("<IQ", STRING, 3)) + 4, 1 << 50),
        "tokenizer.ggml.tokens claims 1,125,899,906,842,624 elements",
    ),
    "absurd name length": (
        lambda: patched("<Q", _at(sound(), b"\x03\0\0\0\0\0\0\0t.b"), 1 << 45),
        r"the name of tensor 1 \(35184372088832 bytes long\)",
    ),
    "overlap": (
        lambda: patched("<Q", tensor_field(sound(), "t.b", "offset"), 128),
        "tensor t.b .* overlaps tensor t.a, which ends at 256",
    ),
    "misaligned": (lambda: patched("<Q", tensor_field(sound(), "t.b", "offset"), 260), "offset 260 is not a multiple"),
    "too many dimensions": (lambda: patched("<I", tensor_field(sound(), "t.a", "n_dims"), 9), "t.a has 9 dimensions"),
    "unknown type": (
        lambda: patched("<I", tensor_field(sound(), "t.a", "type"), 4),
        "type 4, which ggml does not know",
    ),
    "type past the list": (lambda: patched("<I", tensor_field(sound(), "t.a", "type"), 9999), "type 9999"),
    "block": (
        lambda: patched("<q", tensor_field(sound(), "t.c", "n_dims") + 4, 48),
        "t.c's first dimension 48 is not a multiple of its type's block",
    ),
}


def test_a_sound_file_and_the_embedded_model_pass(tmp_path):
    path = tmp_path / "m.gguf"
    path.write_bytes(sound())
    check(str(path))
    check(embedded_model_path())


@pytest.mark.parametrize("case", BAD)
def test_each_malformed_file_is_refused_with_its_reason(tmp_path, case):
    make, said = BAD[case]
    path = tmp_path / "m.gguf"
    path.write_bytes(make())
    with pytest.raises(GGUFError, match=said):
        check(str(path))
