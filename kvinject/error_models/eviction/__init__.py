"""Eviction methods: how ``evict:METHOD,BUDGET`` (kvinject/error_models/evict.py) picks the
tokens a sequence keeps, one small dataclass per method in a file of this package, registered
by name, as kvpress has one press per file (github.com/NVIDIA/kvpress, kvpress/presses/).

A method's fields are its options (``sinks``, ``window``, ...), which ``evict`` takes by name;
:meth:`Method.keep` gets the sequence's tokens in the cache and its budget and returns the ones
to keep. llama.cpp holds a token in one cell for every layer and head, so one set is kept per
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
    from ...engine.resident import ResidentCache

METHODS: dict[str, type[Method]] = {}


def register(cls: type[Method]) -> type[Method]:
    METHODS[cls.name] = cls
    return cls


@dataclass(frozen=True)
class Method(ABC):
    name: ClassVar[str]
    summary: ClassVar[str]  # a few words for `kvinject errors`
    reads: ClassVar[str] = ""  # what it scores from besides positions: "attention" (flash attention off), "keys", "draws"

    @classmethod
    def options(cls) -> tuple[str, ...]:
        return tuple(f.name for f in fields(cls))

    @abstractmethod
    def keep(self, cache: ResidentCache, seq: int, held: np.ndarray, n0: int, n1: int, budget: int) -> np.ndarray | None:
        """After a decode that brought ``seq`` from ``n0`` to ``n1`` tokens: the indices into
        ``held`` (its tokens in the cache, in order) of the ``budget`` to keep, or None to keep
        them all. Called at every decode, so that scores may accumulate."""


def top(scores: np.ndarray, k: int) -> np.ndarray:
    """The indices of the ``k`` highest ``scores``, ties to the later index, in order."""
    order = np.lexsort((-np.arange(len(scores)), -scores))
    return np.sort(order[: max(k, 0)])


def newest_kept(scores: np.ndarray, budget: int) -> np.ndarray:
    """The ``budget`` highest of a sequence's held tokens' ``scores``, its newest among them."""
    scores = scores.astype(np.float64, copy=True)
    scores[-1] = np.inf
    return top(scores, budget)


def scored_on_arrival(cache: ResidentCache, seq: int, new: np.ndarray) -> np.ndarray:
    """Every token's score where each is scored once, as it arrives: those of ``seq``'s tokens
    so far, then ``new``, those of the tokens this decode brought (kept with the sequence)."""
    state = cache.state(seq)
    state["scores"] = scores = np.concatenate([state.get("scores", np.zeros(0)), new])
    return scores


import_modules(__path__, __name__)
