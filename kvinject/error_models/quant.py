"""Simulated integer quantization, round to nearest with an absmax scale per group."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar, Sequence

import numpy as np

from ..engine import laws
from ..engine.perturbation import EntryModel
from ..engine.variates import Draws
from ..exceptions import SpecError
from .registry import register, row_groups


@register
@dataclass(frozen=True)
class Quant(EntryModel):
    bits: int
    group: int = 32
    name: ClassVar[str] = "quant"
    syntax: ClassVar[str] = "quant:BITS[,group=G]"
    summary: ClassVar[str] = (
        "Simulated symmetric absmax round-to-nearest integer quantization of each group of G consecutive components of a K/V row (default G=32, as q8_0/q4_0)."
    )
    example: ClassVar[str] = "quant:4,group=32"

    def __post_init__(self) -> None:
        if not 2 <= self.bits <= 16:
            raise SpecError(f"'quant': BITS must be in 2..16, got {self.bits}")
        if self.group < 1:
            raise SpecError(f"'quant': group must be >= 1, got {self.group}")

    def bits_per_element(self, stored: float, component: str, lengths: Sequence[int] = (), row: int = 0) -> float:
        return self.bits + 16 / self.group  # an fp16 scale per group, as q8_0 and q4_0 store it

    def span(self, component: str, row: int) -> int:
        return self.group

    @property
    def device_law(self) -> tuple[float, ...]:
        return (laws.QUANT, 2 ** (self.bits - 1) - 1, self.group)

    def apply(self, x: np.ndarray, draws: Draws | None) -> None:
        g = row_groups(x, self.group, "'quant': group")
        qmax = np.float32(2 ** (self.bits - 1) - 1)
        scale = np.abs(g).max(axis=1, keepdims=True) / qmax
        scale[scale == 0] = 1  # an all-zero group stays zero
        np.multiply(np.clip(np.rint(g / scale), -qmax, qmax), scale, out=g)
