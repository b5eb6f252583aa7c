"""The frontend's vocabulary is loaded with no device: llama.cpp's default device choice asks every GPU for its free
memory, which makes a CUDA context (~600 MiB of VRAM) in the frontend, a process that runs nothing on a GPU
(perf/results/2026-12-04-gpu-h200.md). A CPU build lists no GPU, so what is checked here is the list the load
gets: present, and empty."""

from __future__ import annotations

import ctypes

import llama_cpp as L

from cllm.core.model_file import resolve_model
from frontend_proc.core.tokenizer import Tokenizer


def test_the_vocabulary_loads_with_an_empty_device_list(monkeypatch):
    lists = []  # each load's device list: None where it gave none (every device), else its entries
    load = L.llama_model_load_from_file

    def spy(path, params):
        devices = ctypes.cast(params.devices, ctypes.POINTER(ctypes.c_void_p)) if params.devices else None
        lists.append(None if devices is None else [devices[0]])
        return load(path, params)

    monkeypatch.setattr(L, "llama_model_load_from_file", spy)
    tok = Tokenizer(resolve_model(None))
    try:
        assert tok.decode(tok.encode("hello world", add_special=False)) == b"hello world"
    finally:
        tok.close()
    assert lists == [[None]]  # a list, its first entry the NULL that ends it
