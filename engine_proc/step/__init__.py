"""The parts of a step around the scheduler: a run of a step's chunks, its rows sampled and its tokens recorded
(runs, recorder); how the decode batch runs, plainly with speculative drafts (drafter: from text and
ngram_memory, or by a draft model, draft_model) or in steady steps one step ahead (decoding, ahead); requests
with images as a step sees them (images); where a step's time goes (timer)."""
