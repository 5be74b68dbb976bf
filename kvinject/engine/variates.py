"""Counter-based random variates: the noise of the multiplicative error models, computed where
it is applied.

Value ``n`` of the stream ``key`` depends on ``(key, n)`` alone: it is SplitMix64's output
function (Steele, Lea and Flood, OOPSLA 2014) applied to ``key + (n + 1) * GAMMA``, the state
SplitMix64 seeded with ``key`` holds at its ``n + 1``-th step. So the compiled callback computes
each component's factor in the pass that multiplies it, with nothing drawn ahead or stored,
and a slice of a stream costs the same whichever values were taken before it. Uniforms take
the top 24 bits of a hash (float32's precision, as numpy's float32 generator does); normals
come from Marsaglia and Tsang's ziggurat (J. Stat. Softw. 5(8), 2000) with 256 layers, the
layer, sign and abscissa from one hash and the rare rejections (1.2%) from further hashes of
it. Measured on the 2-core development machine: numpy's float32 ziggurat drew 11-12 ns a
value and a second pass multiplied; here a normal factor takes about 3.5 ns.
"""

from __future__ import annotations

from typing import Callable

import numpy as np

# Recorded in every result's manifest: results depend on it through the noise.
GENERATOR = "splitmix64 counter, ziggurat-256 normals (kvinject.variates v1)"


def factors(law: tuple[int, float, float], key: int, start: int, n: int) -> np.ndarray:
    """Values ``start .. start + n - 1`` of the stream ``key`` under ``law``, as float32."""
    from .callback.counter_rng import fill  # compiled on first use: a context that draws no noise never loads numba (~65 MB)

    out = np.empty(n, np.float32)
    kind, a, b = law
    fill(kind, np.float32(a), np.float32(b), np.uint64(key), start, out)
    return out


class Variates:
    """One item's stream of factors under ``law``, consumed in order: ``take`` computes the
    next values; ``block`` reserves them for the compiled callback, which computes them itself."""

    def __init__(self, law: tuple[int, float, float], key: int):
        self.law = law
        self.key = key
        self.pos = 0

    def take(self, n: int) -> np.ndarray:
        return self.block(n)[:]

    def block(self, n: int) -> Block:
        block = Block(self, self.pos, n)
        self.pos += n
        return block


class Block:
    """``n`` values of a stream from ``start`` on, computed when sliced."""

    def __init__(self, variates: Variates, start: int, n: int):
        self.variates, self.start, self.n = variates, start, n

    def __getitem__(self, part: slice) -> np.ndarray:
        lo, hi, _ = part.indices(self.n)
        return factors(self.variates.law, self.variates.key, self.start + lo, max(hi - lo, 0))


# Values drawn per refill: large enough that drawing is one numpy call per many decodes,
# small enough to stay in cache.
BLOCK = 1 << 16


class Draws:
    """A reproducible stream of random values, generated in blocks by ``draw(rng, n)``."""

    def __init__(self, draw: Callable[[np.random.Generator, int], np.ndarray], rng: np.random.Generator):
        self._draw = draw
        self._rng = rng
        self._block = draw(rng, BLOCK)
        self._pos = 0

    def block(self, n: int) -> np.ndarray:
        """The next ``n`` values (as :meth:`Variates.block`)."""
        return self.take(n)

    def take(self, n: int) -> np.ndarray:
        if self._pos + n <= len(self._block):
            out = self._block[self._pos : self._pos + n]
            self._pos += n
            return out
        rest = self._block[self._pos :]
        fresh = self._draw(self._rng, max(BLOCK, n - len(rest)))
        out = np.concatenate([rest, fresh[: n - len(rest)]])
        self._block, self._pos = fresh, n - len(rest)
        return out


class DecodeNoise:
    """The noise of one decode for error models applied in Python, site by site.

    Each segment's stream reserved ``rows * width`` values (``blocks``: arrays, or blocks of
    kvinject/engine/variates.py computed when sliced); a site whose rows hold ``r`` components each
    takes ``r`` per row from component ``at`` on, the layout the compiled callback reads too,
    so a stream is consumed site by site exactly as when its rows are decoded alone.
    """

    def __init__(self, blocks: list[tuple[np.ndarray | Block, int]], sources: list[object] | None = None):
        self.blocks = blocks
        self.sources = sources  # the stream each block was read from, for faults that note where they landed
        self._rows = sum(rows for _, rows in blocks)
        self.at = 0  # components per row consumed before the current site

    def take(self, n: int) -> np.ndarray:
        r = n // self._rows  # whole rows: the compiled callback checked the cache write's size
        pieces = [block[self.at * rows : (self.at + r) * rows] for block, rows in self.blocks]
        return pieces[0] if len(pieces) == 1 else np.concatenate(pieces)

    def note(self, landed: list[tuple[int, int, int, str | None]], row: int, at: int | None = None) -> None:
        """Hand each value a fault changed, (row of the decode's site, value of the row, the bits
        it changed, ECC's outcome), to the stream of the item the row belongs to, by its place in
        that stream (a site's rows of ``row`` values from component ``at`` on: the current one)."""
        at = self.at if at is None else at
        first = 0
        for (_, rows), source in zip(self.blocks, self.sources or ()):
            for r, value, mask, status in landed:
                if first <= r < first + rows and hasattr(source, "note"):
                    source.note(source.blocks[-1][0] + at * rows + (r - first) * row + value, mask, status)
            first += rows

    def noter(self) -> Callable[[list[tuple[int, int, int, str | None]], int], None]:
        """:meth:`note` for the current site, once the decode has moved on to others."""
        at = self.at
        return lambda landed, row: self.note(landed, row, at)
