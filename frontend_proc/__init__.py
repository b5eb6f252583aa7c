"""The frontend process: HTTP, validation, tokenization, streaming."""

from cllm.core.llama_bindings import bare

bare()  # before any module here imports llama_cpp
