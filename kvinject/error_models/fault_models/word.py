"""A whole-word fault: every bit of one 64-bit word of a cache row flipped (a row-like failure);
words count from the row's first byte (kvinject/engine/rowbits.py)."""

from __future__ import annotations

import numpy as np

from ...engine.rowbits import WORD
from .base import Drawn, FaultModel, Space, register


@register
class Word(FaultModel):
    name = "word"
    summary = "every bit of one 64-bit word of a cache row flipped"

    def draw(self, rng: np.random.Generator, space: Space, count: int) -> Drawn:
        nbytes = space.layout.nbytes(space.row)
        first, word = space.rows(rng, count, -(-nbytes // WORD), "words")
        out = []
        for i, (v, w) in enumerate(zip(first.tolist(), word.tolist())):
            hit: dict[int, int] = {}
            for offset in range(w * WORD, min((w + 1) * WORD, nbytes)):
                for j, m in space.layout.values_of(offset, 0xFF):
                    hit[j] = hit.get(j, 0) | m
            out += [(i, v + j, 0, m) for j, m in sorted(hit.items())]
        return Drawn.of(out)
