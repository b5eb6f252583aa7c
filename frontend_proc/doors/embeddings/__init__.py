"""Embeddings, in OpenAI's and llama-server's shapes."""
