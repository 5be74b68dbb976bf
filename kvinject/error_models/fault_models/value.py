"""A stored element set outright (NVBitFI's random value and zero value): a float, or a q8_0/
q4_0 block's scale or one code (``field=scale`` or ``code`` picks which, every element of the
block equally likely otherwise)."""

from __future__ import annotations

import numpy as np

from .base import Drawn, FaultModel, Space, register


class _Value(FaultModel):
    options = ("field",)

    def draw(self, rng: np.random.Generator, space: Space, count: int) -> Drawn:
        elements = space.elements()
        unit, k = space.pick(rng, count, len(elements), "stored elements")
        out = []
        for i, (u, c) in enumerate(zip(unit.tolist(), k.tolist())):
            j, mask = elements[c]
            out.append((i, u * space.per_unit + j, mask, self.value(rng, mask)))
        return Drawn.of(out)

    def value(self, rng: np.random.Generator, mask: int) -> int:
        return 0


@register
class Random(_Value):
    name = "random"
    summary = "a stored element replaced by uniformly random bits"

    def value(self, rng: np.random.Generator, mask: int) -> int:
        return int(rng.integers(0, 1 << 32, dtype=np.uint64)) & mask


@register
class Zero(_Value):
    name = "zero"
    summary = "a stored element set to zero bits"
