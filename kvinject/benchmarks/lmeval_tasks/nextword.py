"""The documents of the kvinject_nextword task (loaded by lm-eval from the task's YAML)."""

from __future__ import annotations

import datasets
import numpy as np

from kvinject.benchmarks.nexttoken import make_snippets, normalize_word
from kvinject.data import read_text

CHOICES = 4


def docs(**kwargs: object) -> datasets.DatasetDict:
    """One document per snippet of the bundled articles: its 9 words, and its true next word
    among 3 next words of other snippets (distinct once normalized), in a seeded order."""
    snippets = make_snippets(read_text(None, "encyclopedia"))
    rng = np.random.default_rng(0)
    words = [s.target for s in snippets]
    rows = []
    for s in snippets:
        choices = [s.target]
        while len(choices) < CHOICES:
            word = words[rng.integers(len(words))]
            if normalize_word(word) not in {normalize_word(c) for c in choices}:
                choices.append(word)
        order = rng.permutation(CHOICES)
        rows.append({"prompt": s.prompt, "choices": [f" {choices[i]}" for i in order], "answer": int(np.flatnonzero(order == 0)[0])})
    return datasets.DatasetDict({"test": datasets.Dataset.from_list(rows)})
