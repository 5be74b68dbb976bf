"""Bit flips in the fp16 representation (hardware-fault studies): at a rate, or a fixed number per item."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import numpy as np

from ..exceptions import InjectionError, SpecError
from .base import Draws, ErrorModel, register

_FP16_FIELDS = {"sign": 0x8000, "exponent": 0x7C00, "mantissa": 0x03FF, "any": 0xFFFF}


def _rounded(x: np.ndarray) -> np.ndarray:
    """The value rounded to fp16, which the flips start from: the realized statistics count the
    flips, not that rounding, which an f16 cache (the default) makes anyway."""
    return x.astype(np.float16).astype(np.float32)


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
        _bits(self.name, self.field, self.bit)

    def draw(self, rng: np.random.Generator, n: int) -> np.ndarray:
        mask = np.zeros(n, dtype=np.uint16)
        for bit in _bits(self.name, self.field, self.bit):
            mask |= (rng.random(n, dtype=np.float32) < self.p).astype(np.uint16) << np.uint16(bit)
        return mask

    def apply(self, x: np.ndarray, draws: Draws | None) -> None:
        _flip(x, draws)

    unchanged = staticmethod(_rounded)


@register
@dataclass(frozen=True)
class Faults(ErrorModel):
    count: int
    field: str = "any"
    bit: int | None = None
    name: ClassVar[str] = "faults"
    syntax: ClassVar[str] = "faults:K[,field=sign|exponent|mantissa|any][,bit=N]"
    summary: ClassVar[str] = (
        "Exactly K single-bit faults per item, at values drawn uniformly among the K/V its prompt writes to the targeted layers, "
        "each flipping one bit of the fp16 value, in a field or bit N if asked (fault campaigns: docs/faults.md)."
    )
    example: ClassVar[str] = "faults:1,bit=14"

    def __post_init__(self) -> None:
        if self.count < 1:
            raise SpecError(f"'faults': K must be >= 1, got {self.count}")
        _bits(self.name, self.field, self.bit)

    @property
    def random(self) -> bool:
        return True

    @property
    def placed(self) -> bool:
        return True

    def stream(self, rng: np.random.Generator, horizon: int | None) -> Draws:
        if horizon is None:  # a sequence no benchmark item began: fails if it is ever decoded
            return _Unplaced()
        at = np.sort(rng.choice(horizon, size=min(self.count, horizon), replace=False))
        masks = np.left_shift(1, rng.choice(_bits(self.name, self.field, self.bit), size=len(at))).astype(np.uint16)
        return _Faults(at, masks)

    def apply(self, x: np.ndarray, draws: Draws | None) -> None:
        _flip(x, draws)

    unchanged = staticmethod(_rounded)


class _Faults(Draws):
    """An item's stream of XOR masks holding exactly its faults: ``masks[i]`` at value ``at[i]``
    of the stream, every other value untouched."""

    def __init__(self, at: np.ndarray, masks: np.ndarray):
        self._at, self._masks, self._pos = at, masks, 0

    def take(self, n: int) -> np.ndarray:
        out = np.zeros(n, np.uint16)
        lo, hi = np.searchsorted(self._at, [self._pos, self._pos + n])
        out[self._at[lo:hi] - self._pos] = self._masks[lo:hi]
        self._pos += n
        return out


class _Unplaced(Draws):
    def __init__(self) -> None:
        pass

    def take(self, n: int) -> np.ndarray:
        raise InjectionError("'faults' places its faults in each item's prompt: run it through a benchmark (kvinject run or sweep)")


def _bits(model: str, field: str, bit: int | None) -> list[int]:
    """The bit positions a fault may flip: those of ``field``, or ``bit``."""
    if field not in _FP16_FIELDS:
        raise SpecError(f"'{model}': field must be one of {', '.join(_FP16_FIELDS)}, got '{field}'")
    if bit is None:
        return [b for b in range(16) if _FP16_FIELDS[field] >> b & 1]
    if not 0 <= bit <= 15:
        raise SpecError(f"'{model}': bit must be in 0..15 (the bits of an fp16), got {bit}")
    if field != "any":
        raise SpecError(f"'{model}': give a field or a bit, not both")
    return [bit]


def _flip(x: np.ndarray, draws: Draws | None) -> None:
    half = x.astype(np.float16)
    half.view(np.uint16)[...] ^= draws.take(x.size).reshape(x.shape)
    x[...] = half
