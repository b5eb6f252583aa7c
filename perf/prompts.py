"""Fresh, distinct prompts of about 26 tokens, so no prompt cache can help."""

from __future__ import annotations

import random

SUBJECTS = ["a lighthouse keeper", "a lost robot", "two rival chefs", "an old violin", "a desert caravan", "a quiet librarian",
            "a comet", "a chess prodigy", "a city under snow", "a talking crow", "a retired pilot", "a hidden garden"]
ASKS = ["Write a short story about", "Describe the daily life of", "Explain, step by step, the history of",
        "Compose a letter from the point of view of", "Give three surprising facts about"]


def make_prompts(n: int, seed: int | None = None) -> list[str]:
    rng = random.Random(seed)
    tag = rng.randrange(10**9)
    return [
        f"[{tag}-{i}] {rng.choice(ASKS)} {rng.choice(SUBJECTS)} and {rng.choice(SUBJECTS)}, in a calm and precise voice."
        for i in range(n)
    ]
