"""Expected failure rates in the field from a fault campaign's vulnerability factors (AVF-style).

A campaign injects faults uniformly over the bits its configurations may hit, so the share of
them ending in SDC (or DUE) is the vulnerability factor of that structure: the probability that
a raw fault there becomes one. With a raw rate of R FIT per Mbit (failures in 10^9 device-hours
per 2^20 bits) that the user supplies, a KV cache of B bits has R * B / 2^20 raw faults per 10^9
hours, and its SDC FIT is that times the SDC factor; a map's row is the part of the cache its
faults landed in, whose share of the cache's bits is its share of the injections (the faults
being uniform over the bits), so the rows of a map add up to the whole cache's FIT. The
intervals are the factors' (Wilson's) scaled alike: the share and the size are taken as exact.

Assumptions (docs/faults.md): one raw rate for every bit; every cell of a cache of ``ctx`` tokens
holds live data all the time (a cache emptier on average has proportionally fewer faults that
matter); a fault is present from when its value is written, so every later read sees it (one
arriving later in the value's life is seen by fewer); and the campaign's stage (the prompt's
values, by default) stands for every value the cache holds.
"""

from __future__ import annotations

import pandas as pd

from ..exceptions import KvinjectError

MBIT = 1 << 20
GROUP = ["model", "bench", "format", "kind", "ecc"]  # the injections a row's share is of


def cache_bits(shape, fmt: str, ctx: int) -> float:
    """Bits of a KV cache of ``ctx`` tokens, K and V of every layer stored as ``fmt``."""
    from ..engine.ggml import BITS_PER_VALUE  # loads llama.cpp, which a report without --fit-per-mbit does not need

    return shape.n_layer * shape.n_head_kv * (shape.head_dim_k + shape.head_dim_v) * ctx * BITS_PER_VALUE[fmt]


def model_shapes(models: list[str]) -> dict[str, object]:
    """Each model's shape (layers, KV heads, head sizes), read from its file."""
    from ..engine.model import Model, resolve_model

    shapes = {}
    for name in models:
        try:
            path = resolve_model(name)
        except KvinjectError as e:
            raise KvinjectError(f"--fit-per-mbit sizes the cache from the model's shape, and {e}") from None
        with Model(str(path)) as model:
            shapes[name] = model.shape
    return shapes


def with_fit(table: pd.DataFrame, rate: float, ctx: int, shapes: dict[str, object]) -> pd.DataFrame:
    """``table`` (a fault map) with each row's expected SDC and DUE FIT and their intervals:
    ``rate`` FIT per Mbit raw, a cache of ``ctx`` tokens."""
    if rate <= 0 or ctx <= 0:
        raise KvinjectError(f"--fit-per-mbit and --ctx must be positive, got {rate:g} and {ctx}")
    out = table.copy()
    keys = [c for c in GROUP if c in out.columns]
    share = out["faults"] / out.groupby(keys)["faults"].transform("sum")
    mbit = [cache_bits(shapes[m], f, ctx) / MBIT for m, f in zip(out["model"], out["format"])]
    raw = rate * share * pd.Series(mbit, index=out.index)
    out.insert(out.columns.get_loc("faults") + 1, "mbit", pd.Series(mbit, index=out.index) * share)
    for o in ("sdc", "due"):
        out[f"{o}_fit"] = raw * out[o]
        out[f"{o}_fit_ci"] = [[r * lo, r * hi] for r, (lo, hi) in zip(raw, out[f"{o}_ci"])]
    return out


def check_fit(rate: float | None, ctx: int | None, faults: str | None) -> None:
    """--fit-per-mbit and --ctx go together, with --faults."""
    if (rate is None) != (ctx is None):
        raise KvinjectError("--fit-per-mbit and --ctx go together: the raw rate and the context length whose cache it falls on")
    if rate is not None and not faults:
        raise KvinjectError("--fit-per-mbit scales a fault map's SDC and DUE factors: give --faults too (--faults format for the whole cache)")
