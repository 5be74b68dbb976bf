"""Where a fixed set of changes lands in the cache (fault campaigns): a stream that holds
them, and the sites its values map to."""

from __future__ import annotations

from typing import Callable

import numpy as np

from .rowbits import WORST
from .variates import Draws


class Placed(Draws):
    """A stream of XOR masks holding a fixed set of changes: ``masks[i]`` at value ``at[i]``
    (sorted; two changes of one value are ORed), every other value 0 (fault campaigns). It notes the blocks it is read in, one
    per decode of its item's rows, so that the hook can say where each change landed
    (:func:`locate`); ``describe(mask)`` names a change for its record."""

    def __init__(
        self,
        at: np.ndarray,
        masks: np.ndarray,
        describe: Callable[[int], dict[str, object]],
        prompt: int,
        faults: np.ndarray | None = None,
        kind: str = "",
        row: int = 0,
    ):
        self._at, self._masks, self._pos = at, masks, 0
        self.describe = describe
        self.prompt = prompt  # values the item's prompt writes: those after are its generated tokens'
        self.blocks: list[tuple[int, int]] = []  # (first value, values) of each read
        # A fault model's changes (kvinject/error_models/fault_models): which fault each belongs to,
        # and what each value it changed became as it landed (:meth:`note`); None: single flips.
        self.faults, self.kind, self.row = faults, kind, row  # row: values a cache row holds
        self.landed: dict[int, tuple[int, str | None]] = {}

    def note(self, value: int, mask: int, status: str | None) -> None:
        """Value ``value`` of the stream landed differing in bits ``mask``, ECC's read giving ``status``."""
        self.landed[value] = (mask, status)

    def spares(self, n: int) -> bool:
        """No change falls among the stream's first ``n`` values (its item's prompt: Context.resume)."""
        return self._at.size == 0 or int(self._at[0]) >= n

    def take(self, n: int) -> np.ndarray:
        out = np.zeros(n, self._masks.dtype)
        lo, hi = np.searchsorted(self._at, [self._pos, self._pos + n])
        np.bitwise_or.at(out, self._at[lo:hi] - self._pos, self._masks[lo:hi])
        self.blocks.append((self._pos, n))
        self._pos += n
        return out

    def within(self, start: int, n: int) -> list[tuple[int, int]]:
        """The changes among values start..start+n: (value, mask); of a fault model, its faults'
        first changes, as (value, mask) too."""
        lo, hi = np.searchsorted(self._at, [start, start + n])
        if self.faults is None:
            return [(int(a), int(m)) for a, m in zip(self._at[lo:hi], self._masks[lo:hi])]
        _, first = np.unique(self.faults[lo:hi], return_index=True)
        return [(int(self._at[lo + i]), int(self._masks[lo + i])) for i in sorted(first)]

    def landing(self, value: int) -> dict[str, object]:
        """The record of the fault whose first change is ``value`` (a fault model's): its model,
        each value of its row it changed as (offset from ``value``, bits), and ECC's outcome."""
        i = int(np.searchsorted(self._at, value))
        others = set(self._at[self.faults != self.faults[i]].tolist())
        start = value - value % self.row  # rows lie whole in the stream: their starts are multiples of it
        row = [v for v in sorted(self.landed) if start <= v < start + self.row and v not in others]
        statuses = [self.landed[v][1] for v in row if self.landed[v][1] is not None]
        out: dict[str, object] = {"kind": self.kind, "changes": [[v - value, self.landed[v][0]] for v in row]}
        if statuses:
            out["ecc"] = min(statuses, key=WORST.index)
        return out


def locate(placed: Placed, at: dict[tuple[str, int], int], row: dict[str, int], width: int, n_head_kv: int) -> list[dict[str, object]]:
    """Where each change of ``placed`` that its item's decodes read landed: layer, K or V, the
    token's position in its sequence, KV head and element, and what ``placed`` says of it. An
    item's rows are decoded from position 0 in consecutive pieces, each reading one block of
    ``rows * width`` values, laid out site by site as the compiled callback reads them (``at``:
    each site's first component in a row, ``row``: K's and V's components), then row by row."""
    sites = sorted(at.items(), key=lambda s: s[1])
    out: list[dict[str, object]] = []
    before = 0
    for start, n in placed.blocks:
        rows = n // width
        for value, mask in placed.within(start, n):
            offset = value - start
            (component, layer), first = next(s for s in sites if offset < (s[1] + row[s[0][0]]) * rows)
            r, column = divmod(offset - first * rows, row[component])
            head_dim = row[component] // n_head_kv
            site = {
                "layer": layer,
                "kv": component,
                "position": before + r,
                "head": column // head_dim,
                "element": column % head_dim,
                "stage": "prompt" if value < placed.prompt else "generated",
            }
            out.append(site | placed.describe(mask) | (placed.landing(value) if placed.faults is not None else {}))
        before += rows
    return out
