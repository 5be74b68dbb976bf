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

import math
from typing import Callable

import numpy as np
from numba import njit

# Recorded in every result's manifest: results depend on it through the noise.
GENERATOR = "splitmix64 counter, ziggurat-256 normals (kvinject.variates v1)"

# Laws of a multiplicative factor, (kind, a, b): a + b*U with U uniform on [0, 1); a + b*Z with
# Z standard normal; -1 with probability a, else 1.
UNIFORM, NORMAL, SIGN = 0, 1, 2

_GAMMA = np.uint64(0x9E3779B97F4A7C15)
_M1, _M2 = np.uint64(0xBF58476D1CE4E5B9), np.uint64(0x94D049BB133111EB)
_S30, _S27, _S31, _S40, _S11, _S8 = (np.uint64(s) for s in (30, 27, 31, 40, 11, 8))
_ONE, _LAYER, _U24 = np.uint64(1), np.uint64(255), 2.0**-24


def _ziggurat(layers: int = 256, r: float = 3.6541528853610088, v: float = 4.92867323399e-3) -> tuple[np.ndarray, ...]:
    """Marsaglia and Tsang's layers for exp(-x^2/2): right edges x[0] > ... > x[layers] = 0, each
    layer of area v (x[0] = v / f(r) widens the base layer to hold the tail beyond r), and f at them."""
    x = np.zeros(layers + 1)
    x[0], x[1] = v / np.exp(-0.5 * r * r), r
    for i in range(1, layers - 1):
        x[i + 1] = np.sqrt(-2 * np.log(np.exp(-0.5 * x[i] ** 2) + v / x[i]))
    accept = np.ceil(x[1:] / x[:-1] / _U24).astype(np.int64)  # u24 < accept[i]  <=>  u24 * 2^-24 * x[i] < x[i+1]
    return x, np.exp(-0.5 * x * x), accept, (x[:-1] * _U24).astype(np.float32)


_X, _F, _ACCEPT, _WIDTH = _ziggurat()


@njit(inline="always")
def _times(x, y):
    """``x * y``, rounded before any addition: CUDA's compiler fuses a multiply and an add into
    one rounding unless told not to, so kvinject/engine/device_kernels.py binds this name to a
    multiply it leaves alone, and the device's factors are the host's bits."""
    return x * y


@njit(inline="always")
def _mix(z):
    z = (z ^ (z >> _S30)) * _M1
    z = (z ^ (z >> _S27)) * _M2
    return z ^ (z >> _S31)


@njit(inline="always")
def hash_at(key, n):
    """The 64 random bits of value ``n`` of stream ``key``."""
    return _mix(key + (np.uint64(n) + _ONE) * _GAMMA)


@njit(inline="always")
def _unit(h):
    """A float64 on (0, 1] from 53 bits (a logarithm's argument)."""
    return 1.0 - np.float64(np.int64(h >> _S11)) * 2.0**-53


@njit(cache=True)
def _normal_slow(h):
    """The ziggurat's rare cases: the tail beyond the base layer, the wedges, and a fresh try
    after a rejection, each from further hashes of ``h``."""
    x, f = _X, _F
    k = np.uint64(0)
    while True:
        i = np.int64(h & _LAYER)
        u = np.int64(h >> _S40)
        sign = 1.0 - 2.0 * np.float64(np.int64((h >> _S8) & _ONE))
        z = u * _U24 * x[i]
        if z < x[i + 1]:
            return sign * z
        if i == 0:  # the tail: Marsaglia's exponential rejection
            while True:
                k += _ONE
                a = -math.log(_unit(_mix(h + k * _GAMMA))) / x[1]
                k += _ONE
                b = -math.log(_unit(_mix(h + k * _GAMMA)))
                if b + b > a * a:
                    return sign * (x[1] + a)
        k += _ONE
        if f[i] + _times(1.0 - _unit(_mix(h + k * _GAMMA)), f[i + 1] - f[i]) < math.exp(-0.5 * z * z):
            return sign * z
        k += _ONE
        h = _mix(h + k * _GAMMA)


@njit(inline="always")
def normal(h):
    """A standard normal float32 from the bits ``h``: 98.8% of the time one layer lookup."""
    i = np.int64(h & _LAYER)
    u = np.int64(h >> _S40)
    if u < _ACCEPT[i]:
        # The sign by arithmetic: a branch on a random bit mispredicts half the time (8.4
        # against 3.5 ns a value on the development machine).
        return np.float32(u) * _WIDTH[i] * (np.float32(1.0) - np.float32(2.0) * np.float32(np.int64((h >> _S8) & _ONE)))
    return np.float32(_normal_slow(h))


@njit(inline="always")
def uniform(h):
    """A float32 on [0, 1) from the top 24 bits of ``h``."""
    return np.float32(np.int64(h >> _S40)) * np.float32(_U24)


@njit(inline="always")
def factor(kind, a, b, h):
    """The multiplicative factor of law ``(kind, a, b)`` (float32 ``a``, ``b``) from the bits ``h``."""
    if kind == NORMAL:
        return a + _times(b, normal(h))
    u = uniform(h)
    if kind == UNIFORM:
        return a + _times(b, u)
    return np.float32(1.0) - np.float32(2.0) * np.float32(u < a)


@njit(cache=True)
def _fill(kind, a, b, key, start, out):
    for c in range(len(out)):
        out[c] = factor(kind, a, b, hash_at(key, start + c))


def factors(law: tuple[int, float, float], key: int, start: int, n: int) -> np.ndarray:
    """Values ``start .. start + n - 1`` of the stream ``key`` under ``law``, as float32."""
    out = np.empty(n, np.float32)
    kind, a, b = law
    _fill(kind, np.float32(a), np.float32(b), np.uint64(key), start, out)
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

    def __init__(self, blocks: list[tuple[np.ndarray | Block, int]]):
        self.blocks = blocks
        self._rows = sum(rows for _, rows in blocks)
        self.at = 0  # components per row consumed before the current site

    def take(self, n: int) -> np.ndarray:
        r = n // self._rows  # whole rows: the compiled callback checked the cache write's size
        pieces = [block[self.at * rows : (self.at + r) * rows] for block, rows in self.blocks]
        return pieces[0] if len(pieces) == 1 else np.concatenate(pieces)
