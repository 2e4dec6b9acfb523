"""Deterministic synthetic English-like text with learnable structure (no downloads).

Sentences come from a small grammar with subject-verb agreement, adjective order, and simple arithmetic
facts ("seven plus two is nine."), so a model can keep lowering its loss well below the unigram entropy.
"""

from __future__ import annotations

import numpy as np

NUMBERS = ["zero", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine", "ten", "eleven", "twelve"]
SUBJECTS_SG = ["the cat", "a dog", "the old man", "my sister", "the robot", "a small bird", "the teacher"]
SUBJECTS_PL = ["the cats", "two dogs", "the children", "my parents", "the robots", "many birds", "the teachers"]
VERBS = [("sees", "see"), ("likes", "like"), ("finds", "find"), ("paints", "paint"), ("follows", "follow")]
ADJECTIVES = ["red", "quiet", "heavy", "bright", "strange", "wooden"]
OBJECTS = ["ball", "house", "river", "garden", "letter", "window", "machine"]
PLACES = ["in the morning", "near the lake", "after dinner", "at school", "under the bridge"]


def _sentence(rng: np.random.Generator) -> str:
    kind = rng.integers(3)
    if kind == 0:
        a, b = rng.integers(0, 7, size=2)
        op = rng.integers(2)
        if op == 0:
            return f"{NUMBERS[a]} plus {NUMBERS[b]} is {NUMBERS[a + b]}."
        a, b = max(a, b), min(a, b)
        return f"{NUMBERS[a]} minus {NUMBERS[b]} is {NUMBERS[a - b]}."
    plural = bool(rng.integers(2))
    subject = rng.choice(SUBJECTS_PL if plural else SUBJECTS_SG)
    verb = VERBS[rng.integers(len(VERBS))][1 if plural else 0]
    obj = f"the {rng.choice(ADJECTIVES)} {rng.choice(OBJECTS)}"
    tail = f" {rng.choice(PLACES)}" if kind == 2 else ""
    return f"{subject} {verb} {obj}{tail}."


def generate_text(num_chars: int, seed: int = 0) -> str:
    """At least `num_chars` characters of synthetic text, deterministic in `seed`."""
    rng = np.random.default_rng(seed)
    parts, n = [], 0
    while n < num_chars:
        s = _sentence(rng)
        s = s[0].upper() + s[1:] + " "
        parts.append(s)
        n += len(s)
    return "".join(parts)


class CharTokenizer:
    """Character-level tokenizer over a fixed alphabet; vocab padded to a multiple of 32 (MX blocks)."""

    def __init__(self, text: str):
        chars = sorted(set(text))
        self.itos = chars
        self.stoi = {c: i for i, c in enumerate(chars)}
        self.vocab_size = -(-len(chars) // 32) * 32

    def encode(self, s: str) -> np.ndarray:
        return np.array([self.stoi[c] for c in s], dtype=np.int32)

    def decode(self, ids) -> str:
        return "".join(self.itos[i] if i < len(self.itos) else "?" for i in ids)
