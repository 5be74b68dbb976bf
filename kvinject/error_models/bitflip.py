"""Bit flips in the fp16 representation (hardware-fault studies)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import numpy as np

from ..exceptions import SpecError
from .base import Draws, ErrorModel, register

_FP16_FIELDS = {"sign": 0x8000, "exponent": 0x7C00, "mantissa": 0x03FF, "any": 0xFFFF}


@register
@dataclass(frozen=True)
class BitFlip(ErrorModel):
    p: float
    field: str = "any"
    bit: int | None = None
    name: ClassVar[str] = "bitflip"
    syntax: ClassVar[str] = "bitflip:P[,field=sign|exponent|mantissa|any][,bit=N]"
    summary: ClassVar[str] = (
        "Flip each bit of the component's fp16 representation with probability P, restricted "
        "to one field, or to bit N (0-15: 15 sign, 10-14 exponent), if asked (hardware-fault studies; the value is rounded to fp16 first)."
    )
    example: ClassVar[str] = "bitflip:0.001,field=exponent"

    def __post_init__(self) -> None:
        if not 0 <= self.p <= 1:
            raise SpecError(f"'bitflip': P must be in [0, 1], got {self.p}")
        if self.field not in _FP16_FIELDS:
            raise SpecError(f"'bitflip': field must be one of {', '.join(_FP16_FIELDS)}, got '{self.field}'")
        if self.bit is not None and not 0 <= self.bit <= 15:
            raise SpecError(f"'bitflip': bit must be in 0..15 (the bits of an fp16), got {self.bit}")
        if self.bit is not None and self.field != "any":
            raise SpecError("'bitflip': give a field or a bit, not both")

    def draw(self, rng: np.random.Generator, n: int) -> np.ndarray:
        mask = np.zeros(n, dtype=np.uint16)
        field = _FP16_FIELDS[self.field] if self.bit is None else 1 << self.bit
        for bit in range(16):
            if field >> bit & 1:
                mask |= (rng.random(n, dtype=np.float32) < self.p).astype(np.uint16) << np.uint16(bit)
        return mask

    def apply(self, x: np.ndarray, draws: Draws | None) -> None:
        half = x.astype(np.float16)
        half.view(np.uint16)[...] ^= draws.take(x.size).reshape(x.shape)
        x[...] = half
