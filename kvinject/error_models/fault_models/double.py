"""Double-bit flips: two bits of one stored element (a float, or a block's scale or code), any
two of those the field allows (``double``) or two neighbours (``adjacent``)."""

from __future__ import annotations

import numpy as np

from .base import Drawn, FaultModel, Space, register


def _pairs(mask: int, adjacent: bool) -> list[int]:
    bits = [b for b in range(mask.bit_length()) if mask >> b & 1]
    if adjacent:
        return [1 << b | 1 << (b + 1) for b in bits if b + 1 in bits]
    return [1 << a | 1 << b for i, a in enumerate(bits) for b in bits[i + 1 :]]


class _Double(FaultModel):
    adjacent = False
    options = ("field",)

    def draw(self, rng: np.random.Generator, space: Space, count: int) -> Drawn:
        # Every pair of an element's allowed bits equally likely, over every element of the space.
        choices = [(j, pair) for j, mask in space.elements() for pair in _pairs(mask, self.adjacent)]
        unit, k = space.pick(rng, count, len(choices), "pairs of bits")
        return Drawn.of([(i, u * space.per_unit + choices[c][0], 0, choices[c][1]) for i, (u, c) in enumerate(zip(unit.tolist(), k.tolist()))])


@register
class Double(_Double):
    name = "double"
    summary = "two bits of one stored element, any two the field allows (NVBitFI's double-bit flip)"


@register
class Adjacent(_Double):
    name = "adjacent"
    adjacent = True
    summary = "two neighbouring bits of one stored element"
