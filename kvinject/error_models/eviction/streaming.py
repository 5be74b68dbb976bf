"""``streaming``: StreamingLLM (kvpress ``StreamingLLMPress``): the first ``sinks`` tokens (at
most B - 1) and the last B - sinks."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from . import Method, register


@register
@dataclass(frozen=True)
class Streaming(Method):
    sinks: int = 4
    name = "streaming"
    summary = "sinks + recent"

    def keep(self, cache, seq, held, budget):
        sinks = min(self.sinks, budget - 1)
        return np.concatenate([np.arange(sinks), np.arange(len(held) - (budget - sinks), len(held))])
