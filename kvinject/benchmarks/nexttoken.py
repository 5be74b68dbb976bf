"""Next-word prediction, the study's "perplexity" benchmark.

Snippets of 10 words of encyclopedic prose: the first 9 are the prompt, and the model's greedy
next word is compared with the 10th (case and surrounding punctuation ignored). Also scored:
the log-probability of the first token of the true next word.
"""

from __future__ import annotations

import re
import string
from dataclasses import dataclass
from typing import Callable

import numpy as np

from ..data import read_text
from ..engine.generation.batching import Generation
from ..engine.model import Model
from ..exceptions import DataError
from .base import GenerationBenchmark, nanmean
from .speed import Speed

# WikiText marks intra-word hyphens and number separators as " @-@ ", " @,@ ", " @.@ ".
_WIKITEXT_JOINS = re.compile(r" @([-,.])@ ")
_SPACE_BEFORE_PUNCT = re.compile(r" ([,.;:!?)\]'])")
_PUNCT = string.punctuation + "\u201c\u201d\u2018\u2019"
MAX_WORD_TOKENS = 8


@dataclass(frozen=True)
class Snippet:
    prompt: str
    target: str


def make_snippets(text: str, n_words: int = 10, limit: int | None = None) -> list[Snippet]:
    """Non-overlapping n-word windows inside paragraphs (headings skipped); with ``limit``, that
    many windows spread evenly over the whole text."""
    windows: list[list[str]] = []
    for para in re.split(r"\n\s*\n", text):
        para = para.strip()
        if not para or (para.startswith("=") and para.endswith("=")):
            continue
        para = _SPACE_BEFORE_PUNCT.sub(r"\1", _WIKITEXT_JOINS.sub(r"\1", " ".join(para.split())))
        words = para.split()
        windows += [words[i : i + n_words] for i in range(0, len(words) - n_words + 1, n_words)]
    if limit is not None and limit < len(windows):
        picks = np.unique(np.linspace(0, len(windows) - 1, limit).round().astype(int))
        windows = [windows[i] for i in picks]
    return [Snippet(" ".join(w[:-1]), w[-1]) for w in windows]


def normalize_word(word: str) -> str:
    return word.strip(_PUNCT).lower()


def log_softmax(logits: np.ndarray) -> np.ndarray:
    z = logits.astype(np.float64)
    z -= z.max(axis=-1, keepdims=True)
    return z - np.log(np.exp(z).sum(axis=-1, keepdims=True))


class NextToken(GenerationBenchmark):
    name = "nexttoken"
    summary = "Greedy next word after 9 words of encyclopedic text (accuracy), and log p of the true next token."
    primary = "accuracy"
    secondary = ("mean_logprob", "diverged")
    higher_is_better = {"accuracy": True, "mean_logprob": True}
    binary = frozenset({"accuracy"})

    def load(self) -> None:
        data = self.options.data
        self.snippets = make_snippets(read_text(data, "encyclopedia"), limit=self.options.limit)
        if not self.snippets:
            raise DataError(f"{data or 'the bundled corpus'} holds no paragraph of 10 words or more")

    def __len__(self) -> int:
        return len(self.snippets)

    @property
    def settings(self) -> dict[str, object]:
        return {"data": self.options.data or "bundled:encyclopedia", "items": len(self), "words": 10}

    def estimate_seconds(self, runs: int, speed: Speed) -> float:
        return runs * speed.generation(len(self), 12, 3)

    def prompts(self, model: Model) -> list[list[int]]:
        self._targets = [model.tokenize(" " + s.target, add_special=False, parse_special=False)[0] for s in self.snippets]
        return [model.tokenize(s.prompt) for s in self.snippets]

    def limits(self, prompts: list[list[int]]) -> tuple[int, int]:
        return MAX_WORD_TOKENS, max(map(len, prompts)) + MAX_WORD_TOKENS + 1

    def stop(self, model: Model) -> Callable[[list[int]], bool]:
        return lambda out: " " in model.detokenize(out).strip()  # a whole word was generated

    def score(self, index: int, generation: Generation) -> tuple[float, float]:
        words = generation.text.split()
        guess = normalize_word(words[0]) if words else ""
        correct = float(guess != "" and guess == normalize_word(self.snippets[index].target))
        lp = log_softmax(generation.first_logits)[self._targets[index]]
        return correct, float(lp) if np.isfinite(lp) else float("nan")

    def summarize(self, scores: list[tuple[float, float]]) -> tuple[dict[str, float], dict[str, list[float]]]:
        correct, logprob = [c for c, _ in scores], [lp for _, lp in scores]
        return {"accuracy": float(np.mean(correct)), "mean_logprob": nanmean(logprob)}, {"accuracy": correct, "mean_logprob": logprob}
