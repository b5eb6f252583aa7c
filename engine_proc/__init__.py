"""The engine process: owns the llama.cpp model and runs the decode loop."""

from cllm.core.llama_bindings import bare

bare()  # before any module here imports llama_cpp
