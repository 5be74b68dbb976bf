"""KVQuant (Hooper et al., NeurIPS 2024, arXiv 2401.18079): K per channel before RoPE, V per token.

As its reference code does it (github.com/SqueezeAILab/KVQuant, quant/llama_simquant.py and
quant/kvquant/simquant_module_quantizer.py):

- K, per channel, with ranges calibrated offline: for every layer and channel, the lower and
  upper percentiles ``p/2`` and ``1 - p/2`` of the channel's calibration values (``p``: the
  outlier share; without outliers, their minimum and maximum). At inference a value outside
  them is an outlier, kept exact (dense-and-sparse), or, without outliers, clipped.
- V, per token, online: the token's own percentiles ``p/2`` and ``1 - p/2`` (linear
  interpolation); values at or beyond them are outliers, kept exact, and the others are
  quantized over their own minimum and maximum.
- Both asymmetric round-to-nearest over [lo, hi]: ``scale = (hi - lo) / (2^bits - 1)``,
  ``x' = lo + clip(round((x - lo) / scale), 0, 2^bits - 1) * scale``.
- The first ``sinks`` tokens of every sequence stay exact (attention-sink aware quantization);
  calibration counts them in K's ranges and leaves them out of nuq's k-means, as KVQuant's.
- ``levels=nuq``: KVQuant's non-uniform datatype, without its sensitivity weights (they need
  the model's gradients; its code's ``fisher=None`` path): per layer, for K and for V, the
  2^bits centroids of a 1-D k-means over the calibration values normalized to [-1, 1] by their
  ranges (outliers left out); at inference a value is normalized the same way, rounded to the
  nearest centroid and scaled back (``quant_fn_nuq_recon``).

Calibration runs the model over the first ``calib`` tokens of the bundled encyclopedic
articles (KVQuant: 16 samples of 2048 Wikitext-2 tokens) and reads every layer's K at the site
it is quantized at (and V, for ``nuq``); ``apply`` alone, without a model, takes the rows it is
given as their own calibration.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, ClassVar, Sequence

import numpy as np

from ..data import bench_data
from ..engine.perturbation import EntryModel
from ..engine.target import Target
from ..engine.variates import Draws
from ..exceptions import SpecError
from .registry import register

if TYPE_CHECKING:
    from ..engine.model import Model
    from ..engine.options import CacheOptions

SITES = ("pre-rope", "post-rope")
LEVELS = ("uniform", "nuq")
LLOYD_ITERATIONS = 10_000  # a bound only: Lloyd's algorithm stops once no value changes level
CALIBRATION_TOKENS = 2048
OUTLIER_BITS = 16 + 16  # an outlier's fp16 value and its int16 index in the row (KVQuant's sparse rows)
POINTER_BITS = 32  # and one int32 row pointer per token of the sparse matrix
# Calibrated K ranges and levels: (model path, cache, options) -> _Fitted's arrays, per layer.
_CALIBRATED: dict[tuple, tuple[np.ndarray, ...]] = {}


def quantize(x: np.ndarray, lo: np.ndarray, hi: np.ndarray, bits: int) -> np.ndarray:
    """Asymmetric round-to-nearest onto 2^bits levels over [lo, hi] (broadcast), clipped; a
    range of zero width reads back as ``lo``."""
    scale = (hi - lo) / np.float32(2**bits - 1)
    levels = np.clip(np.rint((x - lo) / np.where(scale == 0, np.float32(1), scale)), 0, 2**bits - 1)
    return (lo + levels * scale).astype(np.float32)


def nuq_levels(normalized: np.ndarray, bits: int) -> np.ndarray:
    """The 2^bits levels, sorted, of a 1-D k-means over normalized calibration values; those
    beyond [-1, 1] (outliers) are left out, as in KVQuant's fit. Lloyd's algorithm from the
    values' quantiles until no value changes level (KVQuant: scikit-learn's k-means++, at most 50
    iterations; docs/compressors.md); in one dimension each level holds a run of the sorted
    values, so an iteration is a search and a difference of sums."""
    values = np.sort(normalized[np.abs(normalized) <= 1].astype(np.float64))
    k = 2**bits
    sums = np.concatenate([[0], np.cumsum(values)])
    levels = np.quantile(values, (np.arange(k) + 0.5) / k)
    for _ in range(LLOYD_ITERATIONS):
        # A value halfway between two levels goes to the lower, as an argmin over levels sends it.
        bounds = np.concatenate([[0], np.searchsorted(values, (levels[1:] + levels[:-1]) / 2, side="right"), [len(values)]])
        counts = np.diff(bounds)
        new = np.where(counts > 0, (sums[bounds[1:]] - sums[bounds[:-1]]) / np.maximum(counts, 1), levels)
        if np.array_equal(new, levels):
            break
        levels = new
    return levels.astype(np.float32)


def halves(lo: np.ndarray, hi: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The middle of [lo, hi] and its half width: KVQuant's offset and range, by which nuq
    normalizes to [-1, 1]."""
    return (hi + lo) / np.float32(2), (hi - lo) / np.float32(2)


def quantize_nuq(x: np.ndarray, lo: np.ndarray, hi: np.ndarray, levels: np.ndarray) -> np.ndarray:
    """Normalize to [-1, 1] over [lo, hi] (broadcast), round to the nearest level (the lower one
    on a tie, as KVQuant's argmin) and scale back; a range of zero width reads back as its middle."""
    middle, half = halves(lo, hi)
    normalized = (x - middle) / np.where(half == 0, np.float32(1), half)
    nearest = levels[np.searchsorted((levels[1:] + levels[:-1]) / np.float32(2), normalized)]
    return (middle + half * nearest).astype(np.float32)


def k_ranges(calibration: np.ndarray, outliers: float | None) -> tuple[np.ndarray, np.ndarray]:
    """Per-channel lower and upper thresholds of calibration rows (tokens, channels)."""
    if outliers is None:
        return calibration.min(axis=0), calibration.max(axis=0)
    lo, hi = np.percentile(calibration, [50 * outliers, 100 - 50 * outliers], axis=0)
    return lo.astype(np.float32), hi.astype(np.float32)


def quantize_k(x: np.ndarray, lo: np.ndarray, hi: np.ndarray, bits: int, outliers: float | None, levels: np.ndarray | None = None) -> None:
    """K rows in place, per channel over the calibrated [lo, hi] (onto ``levels`` if given);
    beyond them exact with outliers."""
    q = quantize(x, lo, hi, bits) if levels is None else quantize_nuq(x, lo, hi, levels)
    if outliers is not None:
        q = np.where((x < lo) | (x > hi), x, q)
    x[...] = q


def v_ranges(x: np.ndarray, outliers: float | None) -> tuple[np.ndarray, np.ndarray, np.ndarray | None]:
    """Each row's dense range and its outliers: with ``outliers``, the values at or beyond the
    row's percentiles, and the others' minimum and maximum; without, the row's."""
    if outliers is None:
        return x.min(axis=1, keepdims=True), x.max(axis=1, keepdims=True), None
    lo_t, hi_t = np.percentile(x, [50 * outliers, 100 - 50 * outliers], axis=1, keepdims=True)
    sparse = (x <= lo_t) | (x >= hi_t)
    return np.where(sparse, np.inf, x).min(axis=1, keepdims=True), np.where(sparse, -np.inf, x).max(axis=1, keepdims=True), sparse


def quantize_v(x: np.ndarray, bits: int, outliers: float | None, levels: np.ndarray | None = None) -> None:
    """V rows in place, per token over each row's dense range (onto ``levels`` if given); with
    outliers, each row's tails beyond its percentiles exact."""
    lo, hi, sparse = v_ranges(x, outliers)
    with np.errstate(invalid="ignore"):  # a constant row is all outliers: no dense range, nothing quantized
        q = quantize(x, lo, hi, bits) if levels is None else quantize_nuq(x, lo, hi, levels)
        x[...] = q if sparse is None else np.where(sparse, x, q)


@register
@dataclass(frozen=True)
class KVQuant(EntryModel):
    bits: int
    site: str = "pre-rope"
    outliers: float | None = None
    sinks: int | None = None
    calib: int | None = None
    levels: str | None = None  # None: uniform
    name: ClassVar[str] = "kvquant"
    syntax: ClassVar[str] = "kvquant:BITS[,site=pre-rope|post-rope][,outliers=P][,sinks=N][,calib=T][,levels=uniform|nuq]"
    summary: ClassVar[str] = (
        "KVQuant: K per channel (before RoPE unless site=post-rope) over ranges calibrated on T tokens of bundled text (default 2048), "
        "V per token; the share P of outliers kept exact (dense-and-sparse), the first N tokens exact (attention sinks); "
        "levels=nuq: per-layer non-uniform levels from k-means on the calibration values."
    )
    example: ClassVar[str] = "kvquant:4,outliers=0.01"

    def __post_init__(self) -> None:
        if not 1 <= self.bits <= 16:
            raise SpecError(f"'kvquant': BITS must be in 1..16, got {self.bits}")
        if self.site not in SITES:
            raise SpecError(f"'kvquant': site must be {' or '.join(SITES)}, got '{self.site}'")
        if self.outliers is not None and not 0 < self.outliers < 1:
            raise SpecError(f"'kvquant': outliers is a share in (0, 1), e.g. 0.01, got {self.outliers}")
        if self.sinks is not None and self.sinks < 1:
            raise SpecError(f"'kvquant': sinks must be >= 1 (leave it out for none), got {self.sinks}")
        if self.calib is not None and self.calib < 2:
            raise SpecError(f"'kvquant': calib must be >= 2 tokens, got {self.calib}")
        if self.levels is not None and self.levels not in LEVELS:
            raise SpecError(f"'kvquant': levels must be {' or '.join(LEVELS)}, got '{self.levels}'")
        if self.levels == "uniform":  # the default, written once: one spec, one store key
            object.__setattr__(self, "levels", None)

    @property
    def pre_rope(self) -> bool:
        return self.site == "pre-rope"

    @property
    def sink_tokens(self) -> int:
        return self.sinks or 0

    def span(self, component: str, row: int) -> int:
        return row if component == "v" else 1  # V's range and outliers per token; K's per channel

    @property
    def nuq(self) -> bool:
        return self.levels == "nuq"

    def bits_per_element(self, stored: float, component: str, lengths: Sequence[int] = (), row: int = 0) -> float:
        """BITS, V's fp16 scale and zero point per token (K's per channel are the model's,
        calibrated once), and each outlier's value and index with a row pointer per token; the
        sink tokens at the cache's bits, in the share they hold of ``lengths``. ``nuq``'s levels
        are the model's too (2^BITS per layer)."""
        per_row = (32 if component == "v" else 0) + (POINTER_BITS if self.outliers is not None else 0)
        quantized = self.bits + (self.outliers or 0) * OUTLIER_BITS + (per_row / row if row else 0)
        total = sum(lengths)
        exact = sum(min(n, self.sink_tokens) for n in lengths) / total if total else 0
        return (1 - exact) * quantized + exact * stored

    def apply(self, x: np.ndarray, draws: Draws | None) -> None:
        """Without a model: K's ranges (and levels) calibrated on ``x`` itself."""
        lo, hi = k_ranges(x, self.outliers)
        quantize_k(x, lo, hi, self.bits, self.outliers, self.k_levels(x, lo, hi) if self.nuq else None)

    def k_levels(self, calibration: np.ndarray, lo: np.ndarray, hi: np.ndarray) -> np.ndarray:
        """nuq's K levels: calibration rows normalized per channel by the calibrated ranges."""
        middle, half = halves(lo, hi)
        return nuq_levels((calibration - middle) / np.where(half == 0, 1, half), self.bits)

    def v_levels(self, calibration: np.ndarray) -> np.ndarray:
        """nuq's V levels: calibration rows normalized per token as at inference, outliers out."""
        lo, hi, sparse = v_ranges(calibration, self.outliers)
        middle, half = halves(lo, hi)
        with np.errstate(invalid="ignore", divide="ignore"):
            normalized = (calibration - middle) / half
        return nuq_levels(normalized if sparse is None else normalized[~sparse], self.bits)

    def fit(self, model: Model, cache: CacheOptions) -> EntryModel:
        calib = self.calib or CALIBRATION_TOKENS
        key = (str(model.path), cache, self.site, calib, self.outliers, self.sink_tokens, self.bits if self.nuq else None)
        if key not in _CALIBRATED:
            rows = _calibration_rows(model, cache, self.pre_rope, calib, self.nuq)
            # K's ranges over every calibration token, sinks included, as SimQuant.quantize takes
            # its percentiles; its first_few_fp16 mask leaves the sinks out of nuq's k-means only.
            lo, hi = (np.stack(side) for side in zip(*(k_ranges(r, self.outliers) for r in rows["k"])))
            k, v = ([r[self.sink_tokens :] for r in rows[c]] for c in "kv")
            levels = (np.stack([self.k_levels(*a) for a in zip(k, lo, hi)]), np.stack([self.v_levels(r) for r in v])) if self.nuq else ()
            _CALIBRATED[key] = (lo, hi, *levels)
        return _Fitted(self, *_CALIBRATED[key])


class _Fitted(EntryModel):
    """A kvquant model calibrated on one model: K's ranges, (layers, channels) each, and with
    nuq the levels of K and of V, (layers, 2^bits) each."""

    name = syntax = summary = example = "kvquant"

    def __init__(self, model: KVQuant, lo: np.ndarray, hi: np.ndarray, k_levels: np.ndarray | None = None, v_levels: np.ndarray | None = None):
        self.model, self.lo, self.hi, self.k_levels, self.v_levels = model, lo, hi, k_levels, v_levels

    @property
    def pre_rope(self) -> bool:
        return self.model.pre_rope

    def apply(self, x: np.ndarray, draws: Draws | None) -> None:
        self.model.apply(x, draws)

    def apply_at(self, x: np.ndarray, draws: Draws | None, component: str, layer: int) -> None:
        if component == "k":
            quantize_k(x, self.lo[layer], self.hi[layer], self.model.bits, self.model.outliers, None if self.k_levels is None else self.k_levels[layer])
        else:
            quantize_v(x, self.model.bits, self.model.outliers, None if self.v_levels is None else self.v_levels[layer])


class _Capture(EntryModel):
    """Records every layer's K (K before or after RoPE) or V rows as they pass; changes nothing."""

    name = syntax = summary = example = "kvquant-calibration"

    def __init__(self, pre_rope: bool):
        self._pre_rope = pre_rope
        self.rows: dict[tuple[str, int], list[np.ndarray]] = {}

    @property
    def pre_rope(self) -> bool:
        return self._pre_rope

    def apply(self, x: np.ndarray, draws: Draws | None) -> None:
        raise NotImplementedError("the calibration capture reads rows per layer")

    def apply_at(self, x: np.ndarray, draws: Draws | None, component: str, layer: int) -> None:
        self.rows.setdefault((component, layer), []).append(x.copy())


def calibration_tokens(model: Model, n: int) -> list[int]:
    """The first ``n`` tokens of the bundled encyclopedic articles, in file order."""
    tokens: list[int] = []
    for path in sorted(bench_data("encyclopedia").glob("*.txt")):
        tokens += model.tokenize(path.read_text() + "\n\n", add_special=not tokens, parse_special=False)
        if len(tokens) >= n:
            return tokens[:n]
    raise SpecError(f"'kvquant': calib={n} asks for more tokens than the bundled articles hold ({len(tokens)})")


def _calibration_rows(model: Model, cache: CacheOptions, pre_rope: bool, n: int, v: bool) -> dict[str, list[np.ndarray]]:
    """Every layer's K rows (tokens, channels) over the calibration tokens, unquantized, and
    with ``v`` its V rows: per component, a list over layers (V's empty without ``v``)."""
    from ..engine.context import Context  # here: parsing specs need not load llama.cpp

    if n > model.n_ctx_train:  # before a context of n cells is allocated
        raise SpecError(f"'kvquant': calib={n} tokens is more than {model.path.name}'s training context of {model.n_ctx_train}")
    tokens = calibration_tokens(model, n)
    capture = _Capture(pre_rope)
    components = "kv" if v else "k"
    with Context(model, cache, capture, Target(components), n_ctx=n) as ctx:
        ctx.prefill(tokens)
    return {c: [np.concatenate(capture.rows[c, layer]) for layer in range(model.n_layer)] if c in components else [] for c in "kv"}
