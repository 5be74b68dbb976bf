"""Bits per K/V element: what a configuration's cache would hold, to compare compressors at
equal memory."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

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
    parts = error.parts_on(target) if error.injects else ()
    for component, row, cache_type in (("k", row_k, cache.type_k), ("v", row_v, cache.type_v)):
        stored = BITS_PER_VALUE[cache_type]
        for il in range(n_layer):
            # Per head of the layer: the stored bits scaled by each part's ratio (a compressor's
            # on its values, eviction's on every token), a part that stacks on another multiplying.
            heads = np.ones(n_head_kv)
            for model, where in parts:
                if where.wants(component, il):
                    selected = row if where.heads is None else len(where.heads) * row // n_head_kv  # what a compressor's per-row overhead spreads over
                    ratio = min(stored, model.bits_per_element(stored, component, lengths, selected)) / stored
                    heads[sorted(where.heads) if where.heads is not None else slice(None)] *= ratio
            total += row * stored * heads.mean()
    kept_fraction = sum(kept) / sum(lengths) if sum(kept) else 1.0
    return total / (n_layer * (row_k + row_v)) * kept_fraction
