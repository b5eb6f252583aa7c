"""GGUF models on the Hugging Face hub by name: which files a name means (names), pulling them into the
standard cache with resume and checks (pull), what the cache holds (store), and the `cllm pull`, `cllm models`
and `cllm rm` commands (commands). Above cllm/core: only the launcher imports it, so neither the engine nor
the frontend loads huggingface_hub; they get local paths in the registry.
"""
