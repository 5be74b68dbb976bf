"""What fault models share: the space an item's faults are drawn in, the changes they draw, and
their registry (kvinject/error_models/fault_models/__init__.py)."""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import ClassVar

import numpy as np

from ...engine.rowbits import SCALE_SHIFT, RowLayout
from ...exceptions import SpecError


@dataclass(frozen=True)
class Space:
    """Where an item's faults may land: ``units`` floats or q8_0/q4_0 blocks of ``per_unit``
    values in the item's stream, each with the bits ``sites`` a fault may take (value of the
    unit, mask: the field and bit asked for), in cache rows of ``row`` values (0 where K's and
    V's rows differ in length) laid out as ``layout``."""

    units: int
    per_unit: int
    sites: list[tuple[int, int]]
    row: int
    layout: RowLayout

    def elements(self) -> list[tuple[int, int]]:
        """The stored elements of a unit a fault may take: a float, or a block's scale or a code,
        as (value of the unit, mask of its bits that ``sites`` allows)."""
        out: dict[tuple[int, bool], int] = {}
        for j, mask in self.sites:
            scale = self.per_unit > 1 and mask >> SCALE_SHIFT > 0  # a block's first value holds its scale and its first code
            out[j, scale] = out.get((j, scale), 0) | mask
        return [(j, mask) for (j, _), mask in out.items()]

    def pick(self, rng: np.random.Generator, count: int, choices: int, what: str) -> tuple[np.ndarray, np.ndarray]:
        """``count`` distinct (unit, choice) pairs, uniformly: faults that cannot share a site."""
        if count > self.units * choices:
            raise SpecError(f"asks for {count} faults among the {self.units * choices} {what} an item may hit: ask for at most {self.units * choices}")
        return np.divmod(rng.choice(self.units * choices, size=count, replace=False), choices)

    def rows(self, rng: np.random.Generator, count: int, choices: int, what: str) -> tuple[np.ndarray, np.ndarray]:
        """``count`` distinct (row, choice) pairs, uniformly: the first value of each row and the choice."""
        if not self.row:
            raise SpecError("lands in a row of the cache's memory, and the targeted K and V rows differ in length: target one (--target k or v)")
        n = self.units * self.per_unit // self.row
        if count > n * choices:
            raise SpecError(f"asks for {count} faults among the {n * choices} {what} an item may hit: ask for at most {n * choices}")
        row, choice = np.divmod(rng.choice(n * choices, size=count, replace=False), choices)
        return row * self.row, choice


@dataclass(frozen=True)
class Drawn:
    """An item's faults as changes: value ``at`` of the stream gets bits ``clear`` cleared and
    then ``xor`` flipped, for fault ``fault`` (one fault may change several values)."""

    at: np.ndarray
    clear: np.ndarray
    xor: np.ndarray
    fault: np.ndarray

    @classmethod
    def of(cls, changes: list[tuple[int, int, int, int]]) -> Drawn:
        """From (fault, value, clear, xor) changes."""
        fault, at, clear, xor = (np.array([c[i] for c in changes], dtype) for i, dtype in enumerate((np.int64, np.int64, np.uint64, np.uint64)))
        return cls(at, clear, xor, fault)


class FaultModel(ABC):
    """What one fault does. ``options``: the options of ``faults`` it takes besides K, stage and
    format (field, bit, bits)."""

    name: ClassVar[str]
    summary: ClassVar[str]
    options: ClassVar[tuple[str, ...]] = ()

    def __init__(self, bits: int | None):
        self.bits = bits

    def check(self) -> None:
        """Refuse, in one line, an option value the model cannot take."""

    @abstractmethod
    def draw(self, rng: np.random.Generator, space: Space, count: int) -> Drawn:
        """``count`` faults of an item, uniformly over ``space``."""


FAULT_MODELS: dict[str, type[FaultModel]] = {}


def register(cls: type[FaultModel]) -> type[FaultModel]:
    FAULT_MODELS[cls.name] = cls
    return cls


def fault_model(name: str, bits: int | None) -> FaultModel:
    """The model ``name`` (``faults``' kind= option), checked."""
    if name not in FAULT_MODELS:
        raise SpecError(f"kind must be one of {', '.join(FAULT_MODELS)} (single-bit flips without kind=), got '{name}'")
    model = FAULT_MODELS[name](bits)
    model.check()
    return model
