"""The control: no error, and no hook installed."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import numpy as np

from .base import Draws, ErrorModel, register


@register
@dataclass(frozen=True)
class NoError(ErrorModel):
    name: ClassVar[str] = "none"
    syntax: ClassVar[str] = "none"
    summary: ClassVar[str] = "Control: no hook is installed and the cache is left alone."
    example: ClassVar[str] = "none"

    @property
    def injects(self) -> bool:
        return False

    def apply(self, x: np.ndarray, draws: Draws | None) -> None:
        pass
