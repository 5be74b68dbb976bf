"""What every benchmark provides, and what one run of one configuration produces."""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from typing import Callable, ClassVar, Iterator

import numpy as np

from ..config import Configuration
from ..context import Context
from ..exceptions import DataError
from ..model import Model
from ..realized import Realized

# progress(advance) is called as items finish; benchmarks report how many units they will do.
Progress = Callable[[int], None]


@dataclass
class RunResult:
    """One run of one configuration on one benchmark."""

    bench: str
    config: Configuration
    run: int
    metrics: dict[str, float]
    items: dict[str, list[float]]  # per-item values of the paired metrics, in item order
    realized: Realized
    nonfinite_items: int = 0  # items whose logits held NaN or Inf
    seconds: float = 0.0
    tokens: int = 0
    extra: dict[str, float] = field(default_factory=dict)  # e.g. divergence from the control
    outputs: list[list[int]] | None = None  # generated tokens per item, kept in memory only
    texts: list[str] | None = None  # generated text per item, written with the record

    def to_dict(self) -> dict[str, object]:
        return {
            "bench": self.bench,
            "label": self.config.label,
            **self.config.to_dict(),
            "run": self.run,
            "metrics": {**self.metrics, **self.extra},
            "nonfinite_items": self.nonfinite_items,
            "seconds": self.seconds,
            "tokens": self.tokens,
            "realized": self.realized.summary(),
            "items": self.items,
            **({"responses": self.texts} if self.texts is not None else {}),
        }


# Which runs of which configuration to evaluate; the first entry is the control.
Plan = list[tuple[Configuration, list[int]]]


class Benchmark(ABC):
    """A benchmark: loaded data plus how to score a model on it under each configuration."""

    name: ClassVar[str]
    summary: ClassVar[str]
    primary: ClassVar[str]  # the metric of the tables' headline column
    secondary: ClassVar[tuple[str, ...]] = ()  # also shown in the tables
    higher_is_better: ClassVar[dict[str, bool]]
    binary: ClassVar[frozenset[str]] = frozenset()  # per-item metrics that are pass/fail
    # metric -> (per-item metric, transform) for metrics that are not a mean over items
    proxies: ClassVar[dict[str, tuple[str, Callable[[float], float]]]] = {}

    @abstractmethod
    def __len__(self) -> int:
        """Number of items."""

    temperature: float = 0.0

    def runs_needed(self, config: Configuration, runs: int) -> int:
        """A configuration with no randomness (greedy decoding, no random error) gives the same
        result every run: evaluate it once rather than report copies as independent runs."""
        return runs if config.error.random or self.temperature > 0 else 1

    def plan(self, configs: list[Configuration], runs: int) -> Plan:
        return [(c, list(range(self.runs_needed(c, runs)))) for c in configs]

    def prepare(self, model: Model) -> None:
        """Model-dependent set-up (tokenizing a corpus) before ``work`` is asked."""

    def work(self, plan: Plan) -> int:
        """Progress units that ``evaluate`` will report."""
        return len(self) * sum(len(runs) for _, runs in plan)

    @abstractmethod
    def evaluate(self, model: Model, plan: Plan, seed: int, progress: Progress) -> Iterator[RunResult]:
        """Evaluate the planned runs; the control (``plan[0]``) first."""

    @property
    def settings(self) -> dict[str, object]:
        """The benchmark's options, recorded with every result."""
        return {}


def at_least_one(option: str, value: int | None) -> int | None:
    """None (all items), or a count of at least 1: zero items would score nothing."""
    if value is not None and value < 1:
        raise DataError(f"{option} must be at least 1, got {value}")
    return value


def generation_context(model: Model, config: Configuration, seed: int, run: int, per_seq: int) -> Context:
    """A context for one run of a generation benchmark: ``model.parallel`` sequences of
    ``per_seq`` cells each."""
    n_seq = model.parallel
    return model.context(config.cache, config.error, config.target, seed=seed, run=run, n_ctx=n_seq * per_seq, n_seq=n_seq)


def nanmean(values: list[float]) -> float:
    arr = np.asarray(values, dtype=np.float64)
    return float(np.nanmean(arr)) if np.isfinite(arr).any() else float("nan")


def divergence(control: list[list[int]], outputs: list[list[int]]) -> dict[str, float]:
    """Share of outputs that differ from the control's, and the mean token position of the
    first difference among those (the FP16-vs-FP32 cache studies measure exactly this)."""
    firsts = []
    for a, b in zip(control, outputs):
        if a != b:
            n = min(len(a), len(b))
            firsts.append(next((i for i in range(n) if a[i] != b[i]), n))
    return {
        "diverged": len(firsts) / len(outputs) if outputs else float("nan"),
        "first_diff": float(np.mean(firsts)) if firsts else float("nan"),
    }
