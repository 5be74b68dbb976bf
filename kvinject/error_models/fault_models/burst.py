"""A multi-bit upset: ``bits=M`` neighbouring bits of the cache's memory, from a bit drawn
uniformly in a row (one token's K or V of one layer) so that all M lie in it: across the
neighbouring values, or a block's scale and codes, as they lie in memory."""

from __future__ import annotations

import numpy as np

from ...exceptions import SpecError
from .base import Drawn, FaultModel, Space, register


@register
class Burst(FaultModel):
    name = "burst"
    summary = "bits=M neighbouring bits of a cache row's memory (a multi-bit upset)"
    options = ("bits",)

    def check(self) -> None:
        if self.bits is None or self.bits < 2:
            raise SpecError(f"kind=burst needs bits=M, the bits it flips, at least 2, got {self.bits}")

    def draw(self, rng: np.random.Generator, space: Space, count: int) -> Drawn:
        span = space.layout.nbytes(space.row) * 8 - self.bits + 1 if space.row else 1
        if span < 1:
            raise SpecError(f"kind=burst flips {self.bits} bits, more than a row of the cache holds")
        first, start = space.rows(rng, count, span, "bursts")
        out = []
        for i, (v, a) in enumerate(zip(first.tolist(), start.tolist())):
            hit: dict[int, int] = {}
            for address in range(a, a + self.bits):
                for j, m in space.layout.values_of(address // 8, 1 << address % 8):
                    hit[j] = hit.get(j, 0) | m
            out += [(i, v + j, 0, m) for j, m in sorted(hit.items())]
        return Drawn.of(out)
