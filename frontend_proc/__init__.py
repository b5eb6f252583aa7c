"""The frontend process: HTTP, validation, tokenization, streaming."""
