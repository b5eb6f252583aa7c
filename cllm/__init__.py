"""cllm: llama.cpp behind an HTTP API, with next to no serving overhead."""
