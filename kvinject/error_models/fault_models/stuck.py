"""Stuck-at faults: one bit of a stored element held at 0 or 1 for the whole item (a permanent
fault). In an item's decodes each cell of the cache is written once, by the token it holds, so
the bit is forced where that write lands and holds to the item's end."""

from __future__ import annotations

import numpy as np

from .base import Drawn, FaultModel, Space, register


class _Stuck(FaultModel):
    level = 0
    options = ("field", "bit")

    def draw(self, rng: np.random.Generator, space: Space, count: int) -> Drawn:
        unit, k = space.pick(rng, count, len(space.sites), "bits")
        sites = [space.sites[c] for c in k.tolist()]
        return Drawn.of([(i, u * space.per_unit + j, m, m * self.level) for i, (u, (j, m)) in enumerate(zip(unit.tolist(), sites))])


@register
class StuckAt0(_Stuck):
    name = "stuck0"
    summary = "one bit stuck at 0 for the item"


@register
class StuckAt1(_Stuck):
    name = "stuck1"
    level = 1
    summary = "one bit stuck at 1 for the item"
