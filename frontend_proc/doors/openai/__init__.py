"""The OpenAI-compatible API: models, completions, chat completions."""
