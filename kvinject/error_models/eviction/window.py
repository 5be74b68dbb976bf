"""``window``: the last B tokens (a sliding window)."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from . import Method, register


@register
@dataclass(frozen=True)
class Window(Method):
    name = "window"
    summary = "the last B tokens"

    def keep(self, cache, seq, held, budget):
        return np.arange(len(held) - budget, len(held))
