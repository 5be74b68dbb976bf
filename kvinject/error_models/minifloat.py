"""Rounding to a minifloat: fp8 (e4m3, e5m2), fp6 (e3m2, e2m3), fp4 (e2m1), and fp16/bf16.

Formats as the OCP 8-bit floating point specification (FP8 v1.0) and the OCP Microscaling
specification (MX v1.0) define them, converted by ml_dtypes (the converters of JAX): round
to nearest, ties to even, subnormals kept. Values beyond the largest finite value saturate
to it, OCP's conversion mode for machine learning (e4m3, fp6 and fp4 have no infinity).
``block=N`` adds MX's shared scale: each block of N components of a row is divided by the
power of two 2^(floor(log2(max |x|)) - emax), emax being the exponent of the element
format's largest normal value (MX v1.0, section 6.3), rounded, and multiplied back; the
scale is stored as an 8-bit exponent (E8M0).
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property
from typing import ClassVar, Sequence

import ml_dtypes
import numpy as np

from ..exceptions import SpecError
from .base import Draws, ErrorModel, register, row_groups

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
SCALE_EXPONENTS = (-127, 127)  # what E8M0 represents (its all-ones code is NaN)


@register
@dataclass(frozen=True)
class Minifloat(ErrorModel):
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

    # Cached: the hook applies the model once per layer, K and V, every decode, where building
    # finfo and the clip bounds cost more than rounding a decode's few rows.
    @cached_property
    def _info(self) -> ml_dtypes.finfo:
        return ml_dtypes.finfo(FORMATS[self.format])

    @cached_property
    def _largest(self) -> np.float32:
        return np.float32(self._info.max)

    @property
    def element_bits(self) -> int:
        return self._info.bits

    def bits_per_element(self, stored: float, component: str, lengths: Sequence[int] = (), row: int = 0) -> float:
        return self.element_bits + (SCALE_BITS / self.block if self.block else 0)

    def apply(self, x: np.ndarray, draws: Draws | None) -> None:
        largest, dtype = self._largest, FORMATS[self.format]
        if not self.block:
            x[...] = _round(x, dtype, largest)
            return
        g = row_groups(x, self.block, "'float': block")
        amax = np.abs(g).max(axis=1, keepdims=True)
        emax = np.frexp(largest)[1] - 1
        shared = np.clip(np.frexp(amax)[1] - 1 - emax, *SCALE_EXPONENTS)  # frexp: amax = m * 2^e, m in [0.5, 1)
        scale = np.ldexp(np.float32(1), shared)
        g[...] = _round(g / scale, dtype, largest) * scale


def _round(x: np.ndarray, dtype: type, largest: np.float32) -> np.ndarray:
    # np.minimum/np.maximum rather than np.clip: the same values at a third of the call's cost
    y = np.maximum(np.minimum(x, largest), -largest).astype(dtype).astype(np.float32)
    if dtype in NO_NAN:
        y[np.isnan(x)] = np.nan  # ml_dtypes makes NaN 0 in formats without one
    return y


NO_NAN = frozenset(t for t in FORMATS.values() if not np.isnan(np.float32(np.nan).astype(t).astype(np.float32)))
