"""The chat layer below every chat door: a ChatRequest in, a prompt, a grammar and a Generation out, and the reply read
back."""
