"""The frontend's core: the one generation path, the models served, their tokenizer and chat template, and their
state."""
