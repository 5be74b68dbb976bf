"""Mantissa truncation of the fp32 value (the study's bit masking)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar, Sequence

import numpy as np

from ..engine import laws
from ..engine.perturbation import EntryModel
from ..engine.variates import Draws
from ..exceptions import SpecError
from .registry import register


@register
@dataclass(frozen=True)
class Mantissa(EntryModel):
    bits: int
    name: ClassVar[str] = "mantissa"
    syntax: ClassVar[str] = "mantissa:N"
    summary: ClassVar[str] = "Keep N of the 23 mantissa bits of each fp32 component (truncation, the study's bit masking)."
    example: ClassVar[str] = "mantissa:7"

    def __post_init__(self) -> None:
        if not 0 <= self.bits <= 23:
            raise SpecError(f"'mantissa': N must be in 0..23, got {self.bits}")

    def bits_per_element(self, stored: float, component: str, lengths: Sequence[int] = (), row: int = 0) -> float:
        return 1 + 8 + self.bits  # sign, fp32's exponent, the mantissa bits kept

    @property
    def _mask(self) -> int:
        return (0xFFFFFFFF << (23 - self.bits)) & 0xFFFFFFFF

    @property
    def device_law(self) -> tuple[float, ...]:
        return (laws.MASK, self._mask)

    def apply(self, x: np.ndarray, draws: Draws | None) -> None:
        x.view(np.uint32)[...] &= np.uint32(self._mask)
