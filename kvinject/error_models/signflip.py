"""Sign flips: each component negated with a probability."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from ..engine.laws import SIGN
from ..engine.perturbation import Multiplicative
from ..exceptions import SpecError
from .registry import register


@register
@dataclass(frozen=True)
class SignFlip(Multiplicative):
    p: float
    name: ClassVar[str] = "signflip"
    syntax: ClassVar[str] = "signflip:P"
    summary: ClassVar[str] = "Each component's sign is flipped with probability P."
    example: ClassVar[str] = "signflip:0.01"

    def __post_init__(self) -> None:
        if not 0 <= self.p <= 1:
            raise SpecError(f"'signflip': P must be in [0, 1], got {self.p}")

    @property
    def law(self) -> tuple[int, float, float]:
        return SIGN, self.p, 0.0
