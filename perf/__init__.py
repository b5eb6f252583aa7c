"""Benchmarks: raw llama.cpp ceiling, HTTP load against cllm and its peers."""
