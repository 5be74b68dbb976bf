"""Prompts decoded once for every configuration that leaves them alone until they end.

An eviction model (kvinject/error_models/evict.py) changes nothing while a prompt is decoded: it
cuts where the prompt ends, or its context (``query=agnostic``), after the decode that gets
there. So every such configuration of a bench decodes an item's prompt into the same cells with
the same K and V up to that point, and its model sees the same decodes (where the cells went,
the attention weights). The first of them to decode an item keeps a :class:`Snapshot` there:
the sequence's K and V through llama.cpp's state export, what the model saw of each decode and,
where the whole prompt was decoded, its last token's logits. The others restore it and replay
what was seen instead of decoding the prompt again: at 4K tokens a prompt costs about 20 s on
two cores, the question and answer after it about 1 s.

A fault campaign's item whose faults all land after its prompt (``faults:K,stage=generated``,
or ``stage=any`` where the draw fell there) decodes its prompt as the golden run does, so each
configuration after the first that placed faults restores it alike; its hook passes over the
prompt's values in the item's stream and counts them as the first one's hook did (``spared``:
the statistics agree but for the order of their float sums). With a stream of cells per sequence
(parallel items), each sequence's restore lands in its own stream.

A restore puts the sequence's cells back from cell 0 on (llama.cpp's ``find_slot`` in an
emptied cache), so a snapshot is kept only of a prompt decoded into cells 0 to n - 1 of every
layer, with one sequence in the context; the cells of what comes after then fall where they
fall without the snapshot (tests/test_prefills.py compares kept cells, tokens and logits bit
for bit with decoding every prompt).
"""

from __future__ import annotations

import ctypes
from dataclasses import dataclass, field
from typing import Hashable

import numpy as np

from ..graph.cache_writes import Writes
from ..realized_error import Realized

BUDGET = 4 << 30  # bytes of snapshots kept per evaluation; past it, items are decoded as usual


@dataclass(frozen=True)
class Seen:
    """One decode of a prompt piece as a cache-resident model saw it."""

    entries: tuple[tuple[int, int, int, bool], ...]
    writes: Writes

    @property
    def nbytes(self) -> int:
        return sum(x.nbytes for x in (self.writes.cells, self.writes.attention, self.writes.queries) if x is not None)


@dataclass(frozen=True)
class Snapshot:
    """A sequence after the first ``end`` tokens of its prompt, before its model acted on the last decode."""

    end: int
    state: ctypes.Array  # llama_state_seq_get_data of the sequence
    seen: tuple[Seen, ...]
    logits: np.ndarray | None  # the last token's, where the decode asked for them (the whole prompt)
    spared: Realized | None = None  # a spared prompt's values as the hook counted them

    @property
    def nbytes(self) -> int:
        return len(self.state) + sum(s.nbytes for s in self.seen) + (self.logits.nbytes if self.logits is not None else 0)


@dataclass
class Prefills:
    """The snapshots of one benchmark's evaluation (its configurations, runs and items), by key,
    up to ``budget`` bytes."""

    budget: int = BUDGET
    _kept: dict[Hashable, Snapshot] = field(default_factory=dict)
    _bytes: int = 0

    def get(self, key: Hashable) -> Snapshot | None:
        return self._kept.get(key)

    def put(self, key: Hashable, snapshot: Snapshot) -> None:
        if self._bytes + snapshot.nbytes <= self.budget:
            self._kept[key] = snapshot
            self._bytes += snapshot.nbytes
