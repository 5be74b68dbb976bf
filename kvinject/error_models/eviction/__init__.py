"""Eviction methods: how ``evict:METHOD,BUDGET`` (kvinject/error_models/evict.py) picks the
tokens a sequence keeps, one small dataclass per method in a file of this package, registered
by name, as kvpress has one press per file (github.com/NVIDIA/kvpress, kvpress/presses/).

A method's fields are its options (``sinks``, ``window``, ...), which ``evict`` takes by name;
:meth:`Method.observe` sees every decode (scores that accumulate), and :meth:`Method.keep`, called
only where the cache is cut, gets the sequence's tokens in the cache and its budget and returns
the ones to keep, so that a method scores no more often than it cuts. llama.cpp holds a token in one cell for every layer and head, so one set is kept per
sequence, where the references choose per layer (and per KV head): scores are the mean over
layers and heads. Every method keeps a sequence's newest token (llama.cpp requires the next
position of a sequence to follow the last it holds), and among equal scores the later token.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass, fields
from typing import TYPE_CHECKING, ClassVar

import numpy as np

from ...plugins import import_modules

if TYPE_CHECKING:
    from ...engine.cache.resident_cache import ResidentCache

METHODS: dict[str, type[Method]] = {}


def register(cls: type[Method]) -> type[Method]:
    METHODS[cls.name] = cls
    return cls


@dataclass(frozen=True)
class Method(ABC):
    name: ClassVar[str]
    summary: ClassVar[str]  # a few words for `kvinject errors`
    reads: ClassVar[str] = ""  # what it scores from besides positions: "attention" (flash attention off), "keys", "keys and values", "queries", "draws"

    @classmethod
    def options(cls) -> tuple[str, ...]:
        return tuple(f.name for f in fields(cls))

    def observe(self, cache: ResidentCache, seq: int, held: np.ndarray, n0: int, n1: int) -> None:
        """After every decode, the one that brought ``seq`` from ``n0`` to ``n1`` tokens (``held``:
        its tokens in the cache, in order), before any cut: what the scores accumulate."""

    @abstractmethod
    def keep(self, cache: ResidentCache, seq: int, held: np.ndarray, budget: int) -> np.ndarray | None:
        """Where the decode cuts ``seq``, holding more than ``budget`` tokens: the indices into
        ``held`` of the ``budget`` to keep, or None to keep them all."""


@dataclass(frozen=True)
class Scored(Method):
    """A method that scores each held token: the cut keeps the highest scores, and the newest
    token (kvpress's ``ScorerPress``, whose presses are one ``score`` method)."""

    @abstractmethod
    def scores(self, cache: ResidentCache, seq: int, held: np.ndarray) -> np.ndarray:
        """The held tokens' scores, one each."""

    def keep(self, cache, seq, held, budget):
        return newest_kept(self.scores(cache, seq, held), budget)


@dataclass(frozen=True)
class HeadScored(Scored):
    """A method that scores each held token in each layer and KV head: a token's score is their
    mean where one set of tokens is kept, and budgets per layer or head can follow them."""

    @abstractmethod
    def head_scores(self, cache: ResidentCache, seq: int, held: np.ndarray) -> np.ndarray:
        """The held tokens' scores per layer and KV head, (layers, heads, tokens), which budgets
        per layer or head follow (``alloc=``, kvinject/error_models/eviction/allocation.py)."""

    def scores(self, cache, seq, held):
        return self.head_scores(cache, seq, held).mean(axis=(0, 1))


def top(scores: np.ndarray, k: int) -> np.ndarray:
    """The indices of the ``k`` highest ``scores``, ties to the later index, in order."""
    order = np.lexsort((-np.arange(len(scores)), -scores))
    return np.sort(order[: max(k, 0)])


def newest_kept(scores: np.ndarray, budget: int) -> np.ndarray:
    """The ``budget`` highest of a sequence's held tokens' ``scores``, its newest among them."""
    scores = scores.astype(np.float64, copy=True)
    scores[-1] = np.inf
    return top(scores, budget)


class Rows:
    """Rows a sequence gains decode by decode (a score, a unit key per token), in a buffer that
    doubles: concatenating would copy every row at every generated token."""

    def __init__(self) -> None:
        self._buffer: np.ndarray | None = None
        self._n = 0

    def append(self, rows: np.ndarray) -> None:
        end = self._n + len(rows)
        if self._buffer is None:
            self._buffer = rows[:0]
        if end > len(self._buffer):
            grown = np.empty((max(end, 2 * len(self._buffer)), *rows.shape[1:]), rows.dtype)
            grown[: self._n] = self._buffer[: self._n]
            self._buffer = grown
        self._buffer[self._n : end] = rows
        self._n = end

    def __getitem__(self, index: np.ndarray) -> np.ndarray:
        return self._buffer[: self._n][index]


def scored_on_arrival(cache: ResidentCache, seq: int, new: np.ndarray) -> None:
    """Where each token is scored once, as it arrives: add ``new``, the scores of the tokens this
    decode brought, to ``seq``'s (``cache.state(seq)["scores"]``, kept with the sequence)."""
    cache.state(seq).setdefault("scores", Rows()).append(new)


import_modules(__path__, __name__)
