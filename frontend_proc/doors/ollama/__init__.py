"""Ollama's API."""
