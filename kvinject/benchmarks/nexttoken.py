"""Next-word prediction, the study's "perplexity" benchmark.

Snippets of 10 words of encyclopedic prose: the first 9 are the prompt, and the model's greedy
next word is compared with the 10th (case and surrounding punctuation ignored). Also scored:
the log-probability of the first token of the true next word.
"""

from __future__ import annotations

import re
import string
import time
from dataclasses import dataclass
from typing import Iterator

import numpy as np

from ..batching import generate_all
from ..data import read_text
from ..exceptions import DataError
from ..model import Model
from .base import Benchmark, Plan, Progress, RunResult, at_least_one, divergence, generation_context, nanmean

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


class NextToken(Benchmark):
    name = "nexttoken"
    summary = "Greedy next word after 9 words of encyclopedic text (accuracy), and log p of the true next token."
    primary = "accuracy"
    secondary = ("mean_logprob", "diverged")
    higher_is_better = {"accuracy": True, "mean_logprob": True, "diverged": False}
    binary = frozenset({"accuracy"})

    def __init__(self, data: str | None = None, limit: int | None = None):
        self.data = data
        self.snippets = make_snippets(read_text(data, "encyclopedia"), limit=at_least_one("limit", limit))
        if not self.snippets:
            raise DataError(f"{data or 'the bundled corpus'} holds no paragraph of 10 words or more")

    def __len__(self) -> int:
        return len(self.snippets)

    @property
    def settings(self) -> dict[str, object]:
        return {"data": self.data or "bundled:encyclopedia", "items": len(self), "words": 10}

    def evaluate(self, model: Model, plan: Plan, seed: int, progress: Progress) -> Iterator[RunResult]:
        prompts = [model.tokenize(s.prompt) for s in self.snippets]
        targets = [model.tokenize(" " + s.target, add_special=False, parse_special=False)[0] for s in self.snippets]
        control_tokens: list[list[int]] | None = None
        for config, runs in plan:
            for run in runs:
                result = self._run(model, config, run, seed, prompts, targets, control_tokens, progress)
                if control_tokens is None:
                    control_tokens = result.outputs
                yield result

    def _run(self, model, config, run, seed, prompts, targets, control_tokens, progress) -> RunResult:
        start = time.perf_counter()
        nonfinite = tokens = 0

        def word_done(out: list[int]) -> bool:
            return " " in model.detokenize(out).strip()

        n = len(prompts)
        correct, logprob, generated = [0.0] * n, [0.0] * n, [[] for _ in range(n)]
        per_seq = max(map(len, prompts)) + MAX_WORD_TOKENS + 1
        with generation_context(model, config, seed, run, per_seq) as ctx:
            for i, gen in generate_all(ctx, prompts, MAX_WORD_TOKENS, stop=word_done, items=range(n)):
                words = gen.text.split()
                guess = normalize_word(words[0]) if words else ""
                correct[i] = float(guess != "" and guess == normalize_word(self.snippets[i].target))
                lp = log_softmax(gen.first_logits)[targets[i]]
                logprob[i] = float(lp) if np.isfinite(lp) else float("nan")
                nonfinite += bool(gen.nonfinite_steps) or not np.isfinite(gen.first_logits).all()
                generated[i] = gen.tokens
                tokens += len(prompts[i]) + len(gen.tokens)
                progress(1)
            realized = ctx.realized
        return RunResult(
            self.name,
            config,
            run,
            {"accuracy": float(np.mean(correct)), "mean_logprob": nanmean(logprob)},
            {"accuracy": correct, "mean_logprob": logprob},
            realized,
            nonfinite,
            time.perf_counter() - start,
            tokens,
            divergence(control_tokens, generated) if control_tokens is not None else {},
            generated,
        )

