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
- The first ``sinks`` tokens of every sequence stay exact (attention-sink aware quantization).

Calibration runs the model over the first ``calib`` tokens of the bundled encyclopedic
articles (KVQuant: 16 samples of 2048 Wikitext-2 tokens) and reads every layer's K at the site
it is quantized at; ``apply`` alone, without a model, takes the rows it is given as their own
calibration.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, ClassVar, Sequence

import numpy as np

from ..data import bench_data
from ..exceptions import SpecError
from ..target import Target
from .base import Draws, ErrorModel, register

if TYPE_CHECKING:
    from ..model import Model
    from ..options import CacheOptions

SITES = ("pre-rope", "post-rope")
CALIBRATION_TOKENS = 2048
OUTLIER_BITS = 16 + 16  # an outlier's fp16 value and its int16 index in the row (KVQuant's sparse rows)
POINTER_BITS = 32  # and one int32 row pointer per token of the sparse matrix
# Calibrated ranges: (model path, cache, site, calib, outliers, sinks) -> (lower, upper) per layer.
_CALIBRATED: dict[tuple, tuple[np.ndarray, np.ndarray]] = {}


def quantize(x: np.ndarray, lo: np.ndarray, hi: np.ndarray, bits: int) -> np.ndarray:
    """Asymmetric round-to-nearest onto 2^bits levels over [lo, hi] (broadcast), clipped; a
    range of zero width reads back as ``lo``."""
    scale = (hi - lo) / np.float32(2**bits - 1)
    levels = np.clip(np.rint((x - lo) / np.where(scale == 0, np.float32(1), scale)), 0, 2**bits - 1)
    return (lo + levels * scale).astype(np.float32)


def k_ranges(calibration: np.ndarray, outliers: float | None) -> tuple[np.ndarray, np.ndarray]:
    """Per-channel lower and upper thresholds of calibration rows (tokens, channels)."""
    if outliers is None:
        return calibration.min(axis=0), calibration.max(axis=0)
    lo, hi = np.percentile(calibration, [50 * outliers, 100 - 50 * outliers], axis=0)
    return lo.astype(np.float32), hi.astype(np.float32)


def quantize_k(x: np.ndarray, lo: np.ndarray, hi: np.ndarray, bits: int, outliers: float | None) -> None:
    """K rows in place, per channel over the calibrated [lo, hi]; beyond them exact with outliers."""
    q = quantize(x, lo, hi, bits)
    if outliers is not None:
        q = np.where((x < lo) | (x > hi), x, q)
    x[...] = q


def quantize_v(x: np.ndarray, bits: int, outliers: float | None) -> None:
    """V rows in place, per token; with outliers, each row's tails beyond its percentiles exact."""
    if outliers is None:
        x[...] = quantize(x, x.min(axis=1, keepdims=True), x.max(axis=1, keepdims=True), bits)
        return
    lo_t, hi_t = np.percentile(x, [50 * outliers, 100 - 50 * outliers], axis=1, keepdims=True)
    sparse = (x <= lo_t) | (x >= hi_t)
    lo = np.where(sparse, np.inf, x).min(axis=1, keepdims=True)
    hi = np.where(sparse, -np.inf, x).max(axis=1, keepdims=True)
    with np.errstate(invalid="ignore"):  # a constant row is all outliers: no dense range, nothing quantized
        x[...] = np.where(sparse, x, quantize(x, lo, hi, bits))


@register
@dataclass(frozen=True)
class KVQuant(ErrorModel):
    bits: int
    site: str = "pre-rope"
    outliers: float | None = None
    sinks: int | None = None
    calib: int | None = None
    name: ClassVar[str] = "kvquant"
    syntax: ClassVar[str] = "kvquant:BITS[,site=pre-rope|post-rope][,outliers=P][,sinks=N][,calib=T]"
    summary: ClassVar[str] = (
        "KVQuant: K per channel (before RoPE unless site=post-rope) over ranges calibrated on T tokens of bundled text (default 2048), "
        "V per token; the share P of outliers kept exact (dense-and-sparse), the first N tokens exact (attention sinks)."
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

    @property
    def pre_rope(self) -> bool:
        return self.site == "pre-rope"

    @property
    def sink_tokens(self) -> int:
        return self.sinks or 0

    def bits_per_element(self, stored: float, component: str, lengths: Sequence[int] = (), row: int = 0) -> float:
        """BITS, V's fp16 scale and zero point per token (K's per channel are the model's,
        calibrated once), and each outlier's value and index with a row pointer per token; the
        sink tokens at the cache's bits, in the share they hold of ``lengths``."""
        per_row = (32 if component == "v" else 0) + (POINTER_BITS if self.outliers is not None else 0)
        quantized = self.bits + (self.outliers or 0) * OUTLIER_BITS + (per_row / row if row else 0)
        total = sum(lengths)
        exact = sum(min(n, self.sink_tokens) for n in lengths) / total if total else 0
        return (1 - exact) * quantized + exact * stored

    def apply(self, x: np.ndarray, draws: Draws | None) -> None:
        """Without a model: K's ranges calibrated on ``x`` itself."""
        lo, hi = k_ranges(x, self.outliers)
        quantize_k(x, lo, hi, self.bits, self.outliers)

    def fit(self, model: Model, cache: CacheOptions) -> ErrorModel:
        calib = self.calib or CALIBRATION_TOKENS
        key = (str(model.path), cache, self.site, calib, self.outliers, self.sink_tokens)
        if key not in _CALIBRATED:
            rows = _calibration_rows(model, cache, self.pre_rope, calib)
            ranges = [k_ranges(r[self.sink_tokens :], self.outliers) for r in rows]
            _CALIBRATED[key] = tuple(np.stack(side) for side in zip(*ranges))
        return _Fitted(self, *_CALIBRATED[key])


class _Fitted(ErrorModel):
    """A kvquant model with its K ranges calibrated on one model: (layers, channels) each."""

    name = syntax = summary = example = "kvquant"

    def __init__(self, model: KVQuant, lo: np.ndarray, hi: np.ndarray):
        self.model, self.lo, self.hi = model, lo, hi

    @property
    def pre_rope(self) -> bool:
        return self.model.pre_rope

    def apply(self, x: np.ndarray, draws: Draws | None) -> None:
        self.model.apply(x, draws)

    def apply_at(self, x: np.ndarray, draws: Draws | None, component: str, layer: int) -> None:
        if component == "k":
            quantize_k(x, self.lo[layer], self.hi[layer], self.model.bits, self.model.outliers)
        else:
            quantize_v(x, self.model.bits, self.model.outliers)


class _Capture(ErrorModel):
    """Records every layer's K rows as they pass, before or after RoPE; changes nothing."""

    name = syntax = summary = example = "kvquant-calibration"

    def __init__(self, pre_rope: bool):
        self._pre_rope = pre_rope
        self.rows: dict[int, list[np.ndarray]] = {}

    @property
    def pre_rope(self) -> bool:
        return self._pre_rope

    def apply(self, x: np.ndarray, draws: Draws | None) -> None:
        raise NotImplementedError("the calibration capture reads rows per layer")

    def apply_at(self, x: np.ndarray, draws: Draws | None, component: str, layer: int) -> None:
        self.rows.setdefault(layer, []).append(x.copy())


def calibration_tokens(model: Model, n: int) -> list[int]:
    """The first ``n`` tokens of the bundled encyclopedic articles, in file order."""
    tokens: list[int] = []
    for path in sorted(bench_data("encyclopedia").glob("*.txt")):
        tokens += model.tokenize(path.read_text() + "\n\n", add_special=not tokens, parse_special=False)
        if len(tokens) >= n:
            return tokens[:n]
    raise SpecError(f"'kvquant': calib={n} asks for more tokens than the bundled articles hold ({len(tokens)})")


def _calibration_rows(model: Model, cache: CacheOptions, pre_rope: bool, n: int) -> list[np.ndarray]:
    """Every layer's K rows (tokens, channels) over the calibration tokens, unquantized."""
    capture = _Capture(pre_rope)
    with model.context(cache, capture, Target("k"), n_ctx=n) as ctx:
        ctx.prefill(calibration_tokens(model, n))
    return [np.concatenate(capture.rows[layer]) for layer in range(model.n_layer)]
