"""``tova``: TOVA (kvpress ``TOVAPress``; schwartz-lab-NLP/TOVA): the decode's last query's
attention, the lowest evicted."""

from __future__ import annotations

from dataclasses import dataclass

from . import Method, newest_kept, register


@register
@dataclass(frozen=True)
class Tova(Method):
    name = "tova"
    summary = "last query's attention"
    reads = "attention"

    def keep(self, cache, seq, held, budget):
        return newest_kept(cache.attention(seq)[-1], budget)
