"""Multiplicative noise: each component times (1 + a random relative error)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from ..engine.laws import NORMAL, UNIFORM
from ..engine.perturbation import Multiplicative
from ..exceptions import SpecError
from .registry import register


@register
@dataclass(frozen=True)
class Uniform(Multiplicative):
    a: float
    b: float
    name: ClassVar[str] = "uniform"
    syntax: ClassVar[str] = "uniform:A,B"
    summary: ClassVar[str] = "kv += kv * U(A,B) per component (relative error uniform on [A,B))."
    example: ClassVar[str] = "uniform:-1,1"

    def __post_init__(self) -> None:
        if self.b < self.a:
            raise SpecError(f"'uniform': need A <= B, got A={self.a}, B={self.b}")

    @property
    def law(self) -> tuple[int, float, float]:
        return UNIFORM, 1 + self.a, self.b - self.a


@register
@dataclass(frozen=True)
class Normal(Multiplicative):
    mean: float
    std: float
    name: ClassVar[str] = "normal"
    syntax: ClassVar[str] = "normal:MEAN,STD"
    summary: ClassVar[str] = "kv += kv * N(MEAN,STD) per component (relative error normally distributed)."
    example: ClassVar[str] = "normal:0,0.25"

    def __post_init__(self) -> None:
        if self.std < 0:
            raise SpecError(f"'normal': STD must be >= 0, got {self.std}")

    @property
    def law(self) -> tuple[int, float, float]:
        return NORMAL, 1 + self.mean, self.std
