"""What every benchmark provides, and what one run of one configuration produces."""

from __future__ import annotations

import math
from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from typing import Any, Callable, ClassVar, Iterator

import numpy as np

from ..engine.generation.batching import Generation
from ..engine.model import Model
from ..engine.positions import GENERATION_SPANS, Spans
from ..engine.realized_error import Realized
from ..error_models.configuration import Configuration
from ..exceptions import DataError, SpecError
from .drift import METRICS as DRIFT
from .options import Options
from .outcomes import METRICS as OUTCOMES
from .speed import Speed

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
    outputs: list[list[int]] | None = None  # generated tokens per item (a generation bench's)
    texts: list[str] | None = None  # generated text per item, written with the record
    faults: list[list[dict[str, object]]] | None = None  # per item, where each fault landed (faults:K)

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
            **({"outputs": self.outputs} if self.outputs is not None else {}),
            **({"responses": self.texts} if self.texts is not None else {}),
            **({"faults": self.faults} if self.faults is not None else {}),
        }


@dataclass(frozen=True)
class Golden:
    """What the other configurations of a generation bench are compared with in the control's
    run, as its stored record holds it: each item's generated tokens and primary score. A sweep
    that resumes takes it from the store instead of evaluating the control again (cache-free
    generation took 25 minutes for SmolLM2's 50 gsm8k problems, twice a cached run)."""

    outputs: list[list[int]]
    items: dict[str, list[float]]
    seconds: float = 0.0  # the run's, which sizes a fault campaign's time limit (item_deadline)


# Which runs of which configuration to evaluate; the first entry is the control.
Plan = list[tuple[Configuration, list[int]]]


BENCHMARKS: dict[str, type[Benchmark]] = {}


class Benchmark(ABC):
    """A benchmark: loaded data plus how to score a model on it under each configuration.

    A subclass that sets ``name`` is registered: its ``Options`` dataclass gives the `kvinject
    run` flags, the `[bench.NAME]` grid keys and the `kvinject benchmarks` listing. It loads
    its data in ``load`` (``self.options`` set) and says in ``estimate_seconds`` how long a
    run takes for `kvinject sweep --dry-run`."""

    name: ClassVar[str]
    summary: ClassVar[str]
    Options: ClassVar[type[Options]] = Options
    primary: ClassVar[str]  # the metric of the tables' headline column
    secondary: ClassVar[tuple[str, ...]] = ()  # also shown in the tables
    higher_is_better: ClassVar[dict[str, bool]]
    binary: ClassVar[frozenset[str]] = frozenset()  # per-item metrics that are pass/fail
    # per-item metrics that are pass/fail where every item's value is 0 or 1 (a score whose
    # kind depends on the task: lm-eval's acc and exact_match are, its f1 is not)
    binary_if_zero_one: ClassVar[frozenset[str]] = frozenset()
    # metric -> (per-item metric, transform of its mean over items, vectorized as numpy's ufuncs)
    # for metrics that are not a mean over items
    proxies: ClassVar[dict[str, tuple[str, Callable[[Any], Any]]]] = {}
    # metric -> the per-item series that weighs its items, for a metric pooled over items of
    # unequal size (followed instructions over given ones): its intervals resample weighted means
    weights: ClassVar[dict[str, str]] = {}
    spans: ClassVar[tuple[str, ...]] = ()  # the span names --positions may use with this benchmark

    def __init_subclass__(cls, **kwargs: object) -> None:
        super().__init_subclass__(**kwargs)
        if "name" in cls.__dict__:
            taken = BENCHMARKS.get(cls.name)
            if taken is not None and taken.__qualname__ != cls.__qualname__:  # a module imported again defines its class anew
                raise SpecError(f"the benchmark name '{cls.name}' is taken by {taken.__module__}.{taken.__qualname__}")
            BENCHMARKS[cls.name] = cls

    @classmethod
    def pass_fail(cls, options: Options) -> frozenset[str]:
        """The per-item metrics that are pass/fail with ``options`` (their single runs get
        Wilson's interval and an exact paired test)."""
        return cls.binary

    def __init__(self, options: Options | None = None, /, **values: object):
        """``Bench(limit=20)`` or ``Bench(Bench.Options(...))``; values are checked as the
        CLI's and grid files' are."""
        self.options = options if options is not None else self.Options.parse(values)
        self.load()

    @abstractmethod
    def load(self) -> None:
        """Read the data ``self.options`` names; a DataError says what is wrong with it."""

    @abstractmethod
    def __len__(self) -> int:
        """Number of items."""

    @abstractmethod
    def estimate_seconds(self, runs: int, speed: Speed) -> float:
        """Rough seconds for ``runs`` runs of one configuration (before ``prepare``)."""

    @property
    def temperature(self) -> float:
        return 0.0

    def runs_needed(self, config: Configuration, runs: int) -> int:
        """A configuration with no randomness (greedy decoding, no random error) gives the same
        result every run: evaluate it once rather than report copies as independent runs."""
        return runs if config.error.random or self.temperature > 0 else 1

    @classmethod
    def check(cls, config: Configuration, options: Options | None = None) -> None:
        """Fail, in one line, for a configuration this benchmark cannot measure with ``options``
        (its --positions name a span the benchmark does not declare, say); before anything runs."""
        if config.target.positions is not None:
            config.target.positions.check(cls.name, cls.spans)
        breaks_at = config.error.resident.breaks_at if config.error.resident is not None else None
        if breaks_at is not None and breaks_at not in cls.spans:
            raise SpecError(
                f"'{config.error.spec}' acts where each prompt's {breaks_at} ends, and {cls.name} marks no {breaks_at} "
                f"(benches that do: {', '.join(sorted(n for n, b in BENCHMARKS.items() if breaks_at in b.spans))})"
            )

    def prepare(self, model: Model) -> None:
        """Model-dependent set-up (tokenizing a corpus) before ``work`` is asked."""

    def work(self, plan: Plan) -> int:
        """Progress units that ``evaluate`` will report."""
        return len(self) * sum(len(runs) for _, runs in plan)

    def evaluate(self, model: Model, plan: Plan, seed: int, progress: Progress, golden: Golden | None = None) -> Iterator[RunResult]:
        """Evaluate the planned runs, for a benchmark that decodes its own way (perplexity's
        chunks, lm-eval's requests); the control (``plan[0]``) first, unless ``golden`` (what
        ``golden`` made of its stored record) stands for it and ``plan[0]`` lists no runs. A
        :class:`GenerationBenchmark` is evaluated by kvinject/experiments/executor.py instead."""
        raise NotImplementedError(f"{self.name} neither generates (GenerationBenchmark) nor implements evaluate")

    def golden(self, record: dict[str, Any]) -> Golden | None:
        """What of the control's stored run can stand for it; None where the comparisons need
        more than a record holds (perplexity's logits): the control is then evaluated again."""
        return None

    @property
    def settings(self) -> dict[str, object]:
        """The benchmark's options, recorded with every result."""
        return {}


class GenerationBenchmark(Benchmark):
    """A benchmark that generates after each item's prompt and scores each generation: it
    gives the prompts, limits, scoring and summaries, and kvinject/experiments/executor.py
    decodes (continuous batching, per-item noise streams). Divergence from the control's tokens
    comes with every other configuration, and against a cache-free control (``recompute``) the
    token flips and logit drift of every configuration (kvinject/benchmarks/drift.py)."""

    keep_texts: ClassVar[bool] = False  # record the generated texts with the results
    spans = GENERATION_SPANS  # marked by generate_all; a subclass adds those item_spans declares

    def __init_subclass__(cls, **kwargs: object) -> None:
        super().__init_subclass__(**kwargs)
        # Every generation bench has the divergence and drift metrics; tables show them where they were measured.
        cls.higher_is_better = {**getattr(cls, "higher_is_better", {}), **TOKEN_DIVERGENCE, **DRIFT, **OUTCOMES}
        cls.secondary = (*cls.secondary, *(m for m in ("flip_rate", "kld", "sdc") if m not in cls.secondary))
        cls.binary = cls.binary | {"flipped", "diverged", *OUTCOMES}

    def __init__(self, options: Options | None = None, /, **values: object):
        super().__init__(options, **values)
        if len(self) == 0:
            raise DataError(f"{self.options.data or 'the bundled data'} leaves no item to evaluate for {self.name}")

    @abstractmethod
    def prompts(self, model: Model) -> list[list[int]]:
        """Each item's prompt as tokens (benchmarks may keep model-dependent state here)."""

    @abstractmethod
    def limits(self, prompts: list[list[int]]) -> tuple[int, int]:
        """(tokens to generate at most, context cells per sequence)."""

    def sequences(self, model: Model, per_seq: int) -> int:
        """Sequences generated together in contexts of ``per_seq`` cells per sequence."""
        return model.parallel

    def item_spans(self, model: Model) -> list[Spans]:
        """The token spans each item's prompt declares (a subclass that adds names to ``spans``),
        after ``prompts``."""
        return [{} for _ in range(len(self))]

    def stop(self, model: Model) -> Callable[[list[int]], bool] | None:
        """A test that ends a generation early, given its tokens so far."""
        return None

    @abstractmethod
    def score(self, index: int, generation: Generation) -> Any:
        """Score one item's generation."""

    @abstractmethod
    def summarize(self, scores: list[Any]) -> tuple[dict[str, float], dict[str, list[float]]]:
        """(metrics, per-item values of the paired metrics) of one run's scores."""

    def due(self, generation: Generation) -> str:
        """What made an item DUE (outcomes.CAUSES): a fault ECC detected (ecc=secded: the read
        that found it came before any logits), NaN or Inf logits, else the watchdog that stopped it
        (generate_all's deadline and contain); "" for none."""
        if any(f.get("ecc") == "detected" for f in generation.faults or ()):
            return "ecc_detected"
        if generation.nonfinite_steps:
            return "nonfinite"
        if generation.stopped:
            return generation.stopped.partition(":")[0]
        return "nonfinite" if not np.isfinite(generation.first_logits).all() else ""

    @classmethod
    def check(cls, config: Configuration, options: Options | None = None) -> None:
        super().check(config, options)
        if config.cache_free and getattr(options, "temperature", 0.0) > 0:
            raise SpecError(f"recompute generates greedily: {cls.name} needs --temperature 0 with it")

    def golden(self, record: dict[str, Any]) -> Golden | None:
        """The record's tokens and primary scores; None for a record without its tokens (record
        format 1, kvinject/record_format.py)."""
        if "outputs" not in record or self.primary not in record["items"]:
            return None
        scores = [math.nan if v is None else v for v in record["items"][self.primary]]  # NaN is stored as null
        return Golden(record["outputs"], {self.primary: scores}, record.get("seconds", 0.0))


def nanmean(values: list[float]) -> float:
    arr = np.asarray(values, dtype=np.float64)
    return float(np.nanmean(arr)) if np.isfinite(arr).any() else float("nan")


TOKEN_DIVERGENCE = {"diverged": False, "first_diff": True, "token_match": True}  # what token_divergence() measures


def token_divergence(control: list[list[int]], outputs: list[list[int]]) -> tuple[dict[str, float], dict[str, list[float]]]:
    """Share of outputs that differ from the control's, the mean token position of the first
    difference among those (the FP16-vs-FP32 cache studies measure exactly this), and the mean
    share of token positions where output and control agree, over the longer of the two (the
    token match by which eviction studies such as The Residual Stream Is All You Need's compare with the full cache); with
    each item's ``diverged`` and ``token_match``, whose intervals are then over items."""
    firsts, matches, diverged = [], [], []
    for a, b in zip(control, outputs):
        matches.append(sum(x == y for x, y in zip(a, b)) / max(len(a), len(b), 1))
        diverged.append(float(a != b))
        if a != b:
            n = min(len(a), len(b))
            firsts.append(next((i for i in range(n) if a[i] != b[i]), n))
    metrics = {
        "diverged": float(np.mean(diverged)) if outputs else float("nan"),
        "first_diff": float(np.mean(firsts)) if firsts else float("nan"),
        "token_match": float(np.mean(matches)) if matches else float("nan"),
    }
    return metrics, {"diverged": diverged, "token_match": matches}
