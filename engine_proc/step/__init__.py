"""The parts of a step around the scheduler: the sampled tokens recorded into their sequences (recorder), a
steady decode run one step ahead (ahead), speculative drafts (drafter), and where a step's time goes (timer)."""
