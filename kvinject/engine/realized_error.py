"""Realized-error accounting: what the hook actually did to K and to V."""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field, fields
from typing import Callable, Sequence

import numpy as np


def sumsq(x: np.ndarray) -> float:
    """Sum of squares in float64 without BLAS: OpenBLAS threads left spinning after a dot
    product compete with llama.cpp's threads for the cores and halve decode speed."""
    return float(np.square(x, dtype=np.float64).sum())


class Workspace:
    """Temporaries for :meth:`RealizedStats.add`, kept between calls: for the values of a
    decode, fresh arrays cost more in page faults than the arithmetic."""

    def __init__(self) -> None:
        self._floats = np.empty((2, 0), np.float32)
        self._mask = np.empty(0, bool)

    def take(self, n: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        if self._mask.size < n:
            self._floats = np.empty((2, n), np.float32)
            self._mask = np.empty(n, bool)
        return self._floats[0, :n], self._floats[1, :n], self._mask[:n]


class Staging:
    """The values before and after the change at each site of one decode, for K or for V, in
    arrays kept from decode to decode (fresh arrays every decode cost page faults)."""

    def __init__(self) -> None:
        self.before = self.after = np.empty(0, np.float32)
        self.n = 0  # values staged in this decode
        self.sites = 0
        self.parts: list[Sequence[tuple[int, np.ndarray | None]]] = []  # per site, a composite's parts there and their columns

    def slots(self, size: int, parts: Sequence[tuple[int, np.ndarray | None]] = ()) -> tuple[np.ndarray, np.ndarray]:
        end = self.n + size
        if end > self.before.size:
            capacity = max(end, 2 * self.before.size)
            self.before = np.concatenate([self.before[: self.n], np.empty(capacity - self.n, np.float32)])
            self.after = np.concatenate([self.after[: self.n], np.empty(capacity - self.n, np.float32)])
        slots = self.before[self.n : end], self.after[self.n : end]
        self.n, self.sites = end, self.sites + 1
        self.parts.append(parts)
        return slots

    def clear(self) -> None:
        self.n = self.sites = 0
        self.parts.clear()

    def fold(
        self,
        component: str,
        row: int,
        keep: np.ndarray | None,
        unchanged: Callable[[np.ndarray], np.ndarray],
        realized: Realized,
        outside: Realized,
        work: Workspace,
    ) -> None:
        """Add this decode's staged values of ``component`` (rows of ``row``) to ``realized``,
        measured from ``unchanged(before)``; ``keep``: the (rows, row) values a selection left
        out, which ``outside`` gets too; a composite's parts each their own in ``realized.parts``."""
        before, after = self.before[: self.n], self.after[: self.n]
        start = unchanged(before)
        if keep is not None:
            shape = (self.sites, *keep.shape)
            if start is not before:  # the values left out are the same as before
                start.reshape(shape)[:, keep] = before.reshape(shape)[:, keep]
            getattr(outside, component).add(before.reshape(shape)[:, keep], after.reshape(shape)[:, keep], self.sites, work)  # site by site
        getattr(realized, component).add(start, after, self.sites, work)
        by_part: dict[int, tuple[list[int], np.ndarray | None]] = {}
        for site, parts in enumerate(self.parts):
            for index, columns in parts:  # a part's heads are the same in every layer
                by_part.setdefault(index, ([], columns))[0].append(site)
        for index, (sites, columns) in by_part.items():
            cols = slice(None) if columns is None else columns
            a, b = (x.reshape(self.sites, -1, row)[sites][:, :, cols] for x in (start, after))
            getattr(realized.parts.setdefault(index, Realized.empty()), component).add(a, b, len(sites), work)


@dataclass
class RealizedStats:
    """Running sums over every component written to the cache for one of K or V.

    The relative error ``(kv'-kv)/kv`` is taken over components that were nonzero before;
    a non-finite result (an exponent bit flipped to Inf, say) counts in ``nonfinite``.
    """

    values: int = 0
    sites: int = 0
    changed: int = 0
    nonfinite: int = 0
    rel_n: int = 0
    rel_sum: float = 0.0
    rel_sumsq: float = 0.0
    sign_flips: int = 0
    signal: float = 0.0
    noise: float = 0.0

    def add(self, before: np.ndarray, after: np.ndarray, sites: int = 1, work: Workspace | None = None) -> None:
        # float32 arithmetic into reused arrays, float64 sums: this runs after every decode.
        b, a = before.ravel(), after.ravel()
        self.values += b.size
        self.sites += sites
        diff, tmp, mask = (work or Workspace()).take(b.size)
        with np.errstate(all="ignore"):
            np.subtract(a, b, out=diff)
            noise = float(np.square(diff, out=tmp).sum(dtype=np.float64))
            signal = float(np.square(b, out=tmp).sum(dtype=np.float64))
            rel_sum = float(np.divide(diff, b, out=tmp).sum(dtype=np.float64))
            rel_sumsq = float(np.square(tmp, out=tmp).sum(dtype=np.float64))
        if not math.isfinite(noise + signal + rel_sum + rel_sumsq):  # a non-finite value, a zero before, an overflow
            self._add_masked(b, a)
            return
        self.changed += int(np.count_nonzero(diff))
        self.signal += signal
        self.noise += noise
        self.rel_n += b.size
        self.rel_sum += rel_sum
        self.rel_sumsq += rel_sumsq
        with np.errstate(over="ignore", under="ignore"):
            self.sign_flips += int(np.count_nonzero(np.less(np.multiply(a, b, out=tmp), 0, out=mask)))

    def _add_masked(self, b: np.ndarray, a: np.ndarray) -> None:
        self.changed += int(np.count_nonzero((a != b) & ~(np.isnan(a) & np.isnan(b))))  # a NaN left NaN is no change
        finite = np.isfinite(a)
        n_finite = int(np.count_nonzero(finite))
        self.nonfinite += b.size - n_finite
        if n_finite < b.size:
            b, a = b[finite], a[finite]
        diff = a - b
        self.signal += sumsq(b)
        self.noise += sumsq(diff)
        if np.count_nonzero(b) < b.size:
            nonzero = b != 0
            b, a, diff = b[nonzero], a[nonzero], diff[nonzero]
        with np.errstate(over="ignore"):  # past float32 (a flipped exponent bit): inf, as the compiled path has it
            rel = diff / b
            self.sign_flips += int(np.count_nonzero(a * b < 0))  # a value rounded to zero is no flip
        self.rel_n += rel.size
        self.rel_sum += float(rel.sum(dtype=np.float64))
        self.rel_sumsq += sumsq(rel)

    @classmethod
    def from_sums(cls, sums: np.ndarray) -> RealizedStats:
        """Statistics from an array of the sums, in field order (the compiled hook's)."""
        return cls(*(type(f.default)(v) for f, v in zip(fields(cls), sums)))

    def merge(self, other: RealizedStats) -> None:
        for key, value in asdict(other).items():
            setattr(self, key, getattr(self, key) + value)

    def without(self, part: RealizedStats) -> RealizedStats:
        """These statistics less ``part`` of their values, over the same cache writes (sites)."""
        return RealizedStats(**{k: v if k == "sites" else v - getattr(part, k) for k, v in asdict(self).items()})

    @property
    def rel_err_mean(self) -> float:
        return self.rel_sum / self.rel_n if self.rel_n else math.nan

    @property
    def rel_err_std(self) -> float:
        if self.rel_n < 2:
            return math.nan
        if math.isinf(self.rel_sumsq):  # a relative error past float32 (a flipped exponent bit): no finite spread
            return math.inf
        var = (self.rel_sumsq - self.rel_sum**2 / self.rel_n) / (self.rel_n - 1)
        return math.sqrt(max(var, 0.0))

    @property
    def sign_flip_frac(self) -> float:
        return self.sign_flips / self.rel_n if self.rel_n else math.nan

    @property
    def snr_db(self) -> float:
        """10·log10(signal power / error power) over the values that stayed finite; +inf when
        nothing changed, -inf when all that changed became NaN or Inf (error without bound)."""
        if self.noise == 0:
            if self.nonfinite:
                return -math.inf
            return math.inf if self.values else math.nan
        return 10 * math.log10(self.signal / self.noise) if self.signal else -math.inf

    def summary(self) -> dict[str, float | int]:
        return {
            "values": self.values,
            "sites": self.sites,
            "changed": self.changed,
            "nonfinite": self.nonfinite,
            "rel_err_mean": self.rel_err_mean,
            "rel_err_std": self.rel_err_std,
            "sign_flip_frac": self.sign_flip_frac,
            "snr_db": self.snr_db,
        }


@dataclass
class Realized:
    """Realized statistics for K and V of one configuration. With ``--positions`` or ``--heads``,
    ``outside`` holds the part of them that the selection left out (their values, unchanged), so
    that the summary says what the selected and the other values received."""

    k: RealizedStats
    v: RealizedStats
    outside: Realized | None = None
    parts: dict[int, Realized] = field(default_factory=dict)  # a composite's parts, by their place in its spec

    @classmethod
    def empty(cls) -> Realized:
        return cls(RealizedStats(), RealizedStats())

    def merge(self, other: Realized) -> None:
        self.k.merge(other.k)
        self.v.merge(other.v)
        for index, part in other.parts.items():
            self.parts.setdefault(index, Realized.empty()).merge(part)
        if other.outside is not None:
            if self.outside is None:
                self.outside = Realized.empty()
            self.outside.merge(other.outside)

    def less(self, before: Realized) -> Realized:
        """What was counted after ``before``, an earlier state of these statistics."""
        k, v = (RealizedStats(**{f: x - getattr(b, f) for f, x in asdict(a).items()}) for a, b in ((self.k, before.k), (self.v, before.v)))
        parts = {i: p.less(before.parts[i]) if i in before.parts else p for i, p in self.parts.items()}
        outside = self.outside.less(before.outside) if self.outside is not None and before.outside is not None else self.outside
        return Realized(k, v, outside, parts)

    def summary(self) -> dict[str, dict[str, float | int]]:
        out: dict[str, dict] = {"k": self.k.summary(), "v": self.v.summary()}
        if self.outside is not None:
            o = self.outside
            out["selection"] = {"selected": Realized(self.k.without(o.k), self.v.without(o.v)).summary(), "other": o.summary()}
        if self.parts:  # keyed by the part's place, as a record's realized holds tables
            out["parts"] = {str(i): self.parts[i].summary() for i in sorted(self.parts)}
        return out
