"""Rounding to a minifloat: fp8 (e4m3, e5m2), fp6 (e3m2, e2m3), fp4 (e2m1), and fp16/bf16.

Formats as the OCP 8-bit floating point specification (FP8 v1.0) and the OCP Microscaling
specification (MX v1.0) define them, their parameters from ml_dtypes, rounded by
kvinject/engine/callback/rounding.py (bit for bit as ml_dtypes converts): round to nearest, ties to even,
subnormals kept. Values beyond the largest finite value saturate to it, OCP's conversion mode
for machine learning (e4m3, fp6 and fp4 have no infinity). The compiled callback rounds in
its own pass.
``block=N`` adds MX's shared scale: each block of N components of a row is divided by the
power of two 2^(floor(log2(max |x|)) - emax), emax being the exponent of the element
format's largest normal value (MX v1.0, section 6.3), rounded, and multiplied back; the
scale is stored as an 8-bit exponent (E8M0). Rounded in Python through numpy, an MX block
had made gsm8k with ``float:e4m3,block=32`` take 23 minutes against 10 to 18 for the other
fp8 configurations (examples/k16-v8.toml).
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property
from typing import ClassVar, Sequence

import ml_dtypes
import numpy as np

from ..engine.laws import ROUND
from ..engine.perturbation import EntryModel
from ..engine.variates import Draws
from ..exceptions import SpecError
from .registry import register, row_groups

FORMATS: dict[str, type] = {
    "e4m3": ml_dtypes.float8_e4m3fn,
    "e5m2": ml_dtypes.float8_e5m2,
    "e3m2": ml_dtypes.float6_e3m2fn,
    "e2m3": ml_dtypes.float6_e2m3fn,
    "e2m1": ml_dtypes.float4_e2m1fn,
    "e5m10": np.float16,
    "e8m7": ml_dtypes.bfloat16,
}
SCALE_BITS = 8  # MX's E8M0 shared scale


@register
@dataclass(frozen=True)
class Minifloat(EntryModel):
    format: str
    block: int = 0
    name: ClassVar[str] = "float"
    syntax: ClassVar[str] = "float:FORMAT[,block=N]"
    summary: ClassVar[str] = (
        "Round each component to a minifloat (OCP formats, nearest-even, saturating): e4m3 and e5m2 (fp8), "
        "e3m2 and e2m3 (fp6), e2m1 (fp4), e5m10 (fp16), e8m7 (bf16); block=N adds an MX shared power-of-two scale per N components."
    )
    example: ClassVar[str] = "float:e4m3"

    def __post_init__(self) -> None:
        if self.format not in FORMATS:
            raise SpecError(f"'float': FORMAT must be one of {', '.join(FORMATS)}, got '{self.format}'")
        if self.block < 0:
            raise SpecError(f"'float': block must be >= 0 (0: no shared scale), got {self.block}")

    @cached_property
    def _info(self) -> ml_dtypes.finfo:
        return ml_dtypes.finfo(FORMATS[self.format])

    @cached_property
    def _format(self) -> tuple[float, int, int]:
        """(largest, mantissa bits, smallest normal exponent), what kvinject/engine/callback/rounding.py takes."""
        return float(self._info.max), int(self._info.nmant), int(self._info.minexp)

    @property
    def element_bits(self) -> int:
        return self._info.bits

    @property
    def law(self) -> tuple[float, ...] | None:
        return (ROUND, *self._format, self.block)

    def span(self, component: str, row: int) -> int:
        return self.block or 1

    def bits_per_element(self, stored: float, component: str, lengths: Sequence[int] = (), row: int = 0) -> float:
        return self.element_bits + (SCALE_BITS / self.block if self.block else 0)

    def apply(self, x: np.ndarray, draws: Draws | None) -> None:
        from ..engine.callback.rounding import round_array, round_blocks  # compiled: only where the callback does not round (its law)

        largest, nmant, minexp = self._format
        if self.block:
            round_blocks(row_groups(x, self.block, "'float': block"), largest, nmant, minexp)
        else:
            round_array(x, largest, nmant, minexp)
