"""Fresh, distinct prompts, so no prompt cache can help.

Each prompt starts with a random tag, so two prompts share no prefix. The
base prompt is about 26 tokens; a longer one gets common words appended
(about one token each), so `tokens` is approximate for text. The engine
bench, which works on token ids, trims or pads to the exact length.
"""

from __future__ import annotations

import inspect
import json
import random
import textwrap

BASE_TOKENS = 26
SUBJECTS = [
    "a lighthouse keeper",
    "a lost robot",
    "two rival chefs",
    "an old violin",
    "a desert caravan",
    "a quiet librarian",
    "a comet",
    "a chess prodigy",
    "a city under snow",
    "a talking crow",
    "a retired pilot",
    "a hidden garden",
]
ASKS = [
    "Write a short story about",
    "Describe the daily life of",
    "Explain, step by step, the history of",
    "Compose a letter from the point of view of",
    "Give three surprising facts about",
]
WORDS = (
    "river stone light morning house water music friend garden window silver market winter paper road story "
    "mountain green bread field summer cloud letter horse clock forest bridge candle harbor valley"
).split()


def make_prompts(n: int, tokens: int = BASE_TOKENS, seed: int | None = None) -> list[str]:
    rng = random.Random(seed)
    tag = rng.randrange(10**9)
    prompts = []
    for i in range(n):
        ask, one, other = rng.choice(ASKS), rng.choice(SUBJECTS), rng.choice(SUBJECTS)
        text = f"[{tag}-{i}] {ask} {one} and {other}, in a calm and precise voice."
        if tokens > BASE_TOKENS:
            text += " Mention " + " ".join(rng.choices(WORDS, k=tokens - BASE_TOKENS - 1)) + "."
        prompts.append(text)
    return prompts


def requests_for(concurrency: int) -> int:
    """Requests in one cell: several waves, capped to keep it short (cLLM's 40 at concurrency 8)."""
    return min(max(8, 5 * concurrency), 160)


def copy_prompts() -> dict[str, str]:
    """Fixed, input-grounded tasks (the texts are Python's standard library's, fixed per Python version)."""
    code = inspect.getsource(textwrap)[:2400]
    doc = json.__doc__[:1500]
    return {
        "copy text": f"Repeat the following text exactly:\n\n{doc}",
        "copy code": f"{code}\n\nRepeat the code above exactly, character for character, in a ```python block.",
        "edit code": "Rewrite this Python file with the class TextWrapper renamed to LineWrapper; change nothing else:"
        f"\n\n```python\n{code}\n```",
        "fix text": "Fix the typos in this text and return it otherwise unchanged:\n\n" + doc.replace("the", "teh", 3),
    }
