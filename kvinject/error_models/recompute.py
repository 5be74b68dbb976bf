"""The cache-free reference: no error, and no token's logits from K/V cached by earlier decodes.

A decoding mode rather than an error: registered under its name so that ``recompute@f32`` is
written, stored and listed as a configuration, it injects nothing, and a configuration holding
it is cache-free (``Configuration.cache_free``), which the executor decodes accordingly."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from ..engine.perturbation import ErrorModel
from .registry import register


@register
@dataclass(frozen=True)
class Recompute(ErrorModel):
    name: ClassVar[str] = "recompute"
    syntax: ClassVar[str] = "recompute"
    summary: ClassVar[str] = (
        "No error; greedy generation in which every token's logits come from one batched pass over its prefix, not from cached K/V "
        "(the cache-free reference; as the control, it measures every configuration's token flips and logit drift: docs/recompute.md)."
    )
    example: ClassVar[str] = "recompute"
