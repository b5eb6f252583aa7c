"""cLLM's own API, and the chat page."""
