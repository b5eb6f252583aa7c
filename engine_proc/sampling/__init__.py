"""Choosing tokens from a decode's logits: each sequence's sampler chain, grammar and logprobs (sampler), and the
common chain's rows drawn together over the logits matrix (draws). Knows no sequence or step."""
