"""Bits per K/V element: what a configuration's cache would hold, to compare compressors at
equal memory."""

from __future__ import annotations

from collections.abc import Sequence

from .ggml import BITS_PER_VALUE
from .options import CacheOptions
from .perturbation import ErrorModel
from .target import Target


def cache_bits(
    error: ErrorModel,
    target: Target,
    cache: CacheOptions,
    n_layer: int,
    n_head_kv: int,
    head_dim_k: int,
    head_dim_v: int,
    lengths: Sequence[int] = (),
    kept: Sequence[float] = (),
) -> float:
    """The mean over every layer's K and V components: a targeted one at the error model's bits
    (a compressor stores no more than the cache type holds), the others at their cache type's;
    with --heads, the targeted heads' share of a targeted layer.
    ``lengths``: the tokens of the sequences the run held, for models whose bits depend on them
    (KIVI's exact window). Every layer counts as caching every token (sliding-window layers hold
    fewer cells). ``kept``: the tokens of each of those sequences still cached at its end; an
    evicted token stores nothing, so the bits scale by the kept fraction."""
    total = 0.0
    row_k, row_v = n_head_kv * head_dim_k, n_head_kv * head_dim_v
    for component, row, cache_type in (("k", row_k, cache.type_k), ("v", row_v, cache.type_v)):
        stored = BITS_PER_VALUE[cache_type]
        selected = row if target.heads is None else len(target.heads) * row // n_head_kv  # what a compressor's per-row overhead spreads over
        compressed = min(stored, error.bits_per_element(stored, component, lengths, selected))
        targeted = sum(target.wants(component, il) for il in range(n_layer)) * target.share(n_head_kv) if error.injects else 0
        total += row * (targeted * compressed + (n_layer - targeted) * stored)
    kept_fraction = sum(kept) / sum(lengths) if sum(kept) else 1.0
    return total / (n_layer * (row_k + row_v)) * kept_fraction
