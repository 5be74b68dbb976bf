"""KIVI (Liu et al., ICML 2024): K quantized per channel, V per token, the newest tokens exact.

As the reference code does it (github.com/jy-yuan/KIVI, models/llama_kivi.py,
``LlamaAttention_KIVI.forward``; quant/new_pack.py, ``triton_quantize_and_pack_along_last_dim``):
asymmetric min/max quantization of groups of G values, ``scale = (max - min) / (2^bits - 1)``,
``q = round(clamp((x - min) / scale, 0, 2^bits - 1))`` (round half to even), dequantized as
``q * scale + min``.

- K, per channel, groups of G consecutive tokens: K stays exact until R (residual) tokens have
  accumulated since the last quantized block, then the whole block of R is quantized (after
  the step's attention). With n tokens in a sequence, tokens below ``(n // R) * R`` are quantized.
- V, per token, groups of G consecutive channels of one head: the last R tokens stay exact; as
  each token arrives the oldest exact one is quantized. Tokens below ``n - R`` are quantized.

The prefill branch does the same with n the prompt's length, after attending in full precision;
so applying the rule after every llama_decode is KIVI's behaviour step for step.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, ClassVar, Sequence

import numpy as np

from ..engine.perturbation import CacheResident
from ..exceptions import SpecError
from .registry import register

if TYPE_CHECKING:
    from ..engine.cache.resident_cache import ResidentCache
    from ..engine.model import Shape
    from ..engine.options import CacheOptions
    from ..engine.target import Target


def quantize(x: np.ndarray, bits: int, axis: int) -> np.ndarray:
    """KIVI's asymmetric round-to-nearest quantization of the groups along ``axis``, dequantized."""
    mn = x.min(axis, keepdims=True)
    scale = (x.max(axis, keepdims=True) - mn) / np.float32(2**bits - 1)
    # A constant group (scale 0) dequantizes to its minimum, itself, as in KIVI.
    levels = np.rint(np.clip((x - mn) / np.where(scale == 0, np.float32(1), scale), 0, 2**bits - 1))
    return levels * scale + mn


@register
@dataclass(frozen=True)
class Kivi(CacheResident):
    bits: int
    group: int = 32
    residual: int = 128
    name: ClassVar[str] = "kivi"
    syntax: ClassVar[str] = "kivi:BITS[,group=G,residual=R]"
    summary: ClassVar[str] = (
        "KIVI: K quantized per channel over groups of G tokens once R exact ones have accumulated, "
        "V per token in groups of G channels except the last R; asymmetric min/max, BITS bits (default G=32, R=128)."
    )
    example: ClassVar[str] = "kivi:2,group=32,residual=128"

    def __post_init__(self) -> None:
        if not 1 <= self.bits <= 16:
            raise SpecError(f"'kivi': BITS must be in 1..16, got {self.bits}")
        if self.group < 1:
            raise SpecError(f"'kivi': group must be >= 1, got {self.group}")
        if self.residual < self.group or self.residual % self.group:
            raise SpecError(f"'kivi': residual must be a multiple of group ({self.group}), got {self.residual}")

    def check_target(self, target: Target, cache: CacheOptions) -> None:
        super().check_target(target, cache)
        for component, kind in (("k", cache.type_k), ("v", cache.type_v)):
            if component in target.components and kind not in ("f32", "f16", "bf16"):
                raise SpecError(
                    f"'{self.name}' changes {component.upper()} in the cache, which cannot be done in a {kind} cache: "
                    f"use --cache-type-{component} f16 (or f32, bf16)"
                )

    def check(self, shape: Shape, target: Target, cache: CacheOptions) -> None:
        super().check(shape, target, cache)
        if "v" in target.components and shape.head_dim_v % self.group:
            raise SpecError(f"'{self.name}': group {self.group} does not divide the head dimension {shape.head_dim_v} that V is quantized along")

    def quantized(self, component: str, n: int) -> int:
        """How many of a sequence's first ``n`` tokens KIVI holds quantized: K in whole blocks of
        R, V all but the last R."""
        return n // self.residual * self.residual if component == "k" else max(n - self.residual, 0)

    def bits_per_element(self, stored: float, component: str, lengths: Sequence[int] = (), row: int = 0) -> float:
        """BITS plus an fp16 scale and minimum per group of G (as KIVI stores them); the exact
        window at the cache's bits, in the share it holds of ``lengths`` (none known: long sequences)."""
        quantized = self.bits + 32 / self.group
        total = sum(lengths)
        if not total:
            return quantized
        q = sum(self.quantized(component, n) for n in lengths)
        return (q * quantized + (total - q) * stored) / total

    def after_decode(self, cache: ResidentCache, grown: list[tuple[int, int, int]]) -> None:
        due = {c: [(seq, self.quantized(c, n0), self.quantized(c, n1)) for seq, n0, n1 in grown] for c in "kv"}
        for component in "kv":
            sites = [site for site in cache.sites if site[0] == component]
            spans = [(seq, a, b) for seq, a, b in due[component] if a < b]
            if not sites or not spans:
                continue
            # Every targeted layer at once; whole groups of G tokens per sequence for K (blocks of R).
            layers = np.array([layer for _, layer in sites])
            cells = np.concatenate([cache.cells(seq, layers, a, b) for seq, a, b in spans], axis=1)
            x = cache.read(sites, cells)
            n_sites, n_tokens, width = x.shape
            if component == "k":
                after = quantize(x.reshape(n_sites, n_tokens // self.group, self.group, width), self.bits, 2)
            else:
                after = quantize(x.reshape(n_sites, n_tokens, width // self.group, self.group), self.bits, 3)
            cache.write(sites, cells, x, after.reshape(x.shape))
