"""``random``: the newest token and B - 1 others at random (kvpress ``RandomPress``). Each token
gets a score from the item's seeded stream once, when it arrives, and the highest are kept, so
a prompt is cut to a uniform sample of its tokens and the lowest score goes after each generated
token (scores drawn anew at each decode would favour recent tokens, the older having survived
more draws)."""

from __future__ import annotations

from dataclasses import dataclass

from . import Scored, register, scored_on_arrival


@register
@dataclass(frozen=True)
class Random(Scored):
    name = "random"
    summary = "a uniform sample"
    reads = "draws"

    def observe(self, cache, seq, held, n0, n1):
        scored_on_arrival(cache, seq, cache.draws(seq).take(n1 - n0))

    def scores(self, cache, seq, held):
        return cache.state(seq)["scores"][held]
