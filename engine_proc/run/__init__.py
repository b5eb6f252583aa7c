"""Running llama.cpp: the model, context and KV streams (model_runner), the batches decoded (batch), the thread a
decode may run on ahead of its step (decode_thread), how many threads a decode uses (threads), how a step's
prompt chunks group into llama_decode calls (prefill_runs), and the embeddings context (embedder)."""
