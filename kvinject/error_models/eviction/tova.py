"""``tova``: TOVA (kvpress ``TOVAPress``; schwartz-lab-NLP/TOVA): the decode's last query's
attention, the lowest evicted."""

from __future__ import annotations

from dataclasses import dataclass

from . import Scored, register


@register
@dataclass(frozen=True)
class Tova(Scored):
    name = "tova"
    summary = "last query's attention"
    reads = "attention"

    def scores(self, cache, seq, held):
        return cache.attention(seq)[-1]
