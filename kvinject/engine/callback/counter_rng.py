"""The counter-based generator of kvinject/engine/variates.py, compiled by numba: SplitMix64's
output function of ``(key, n)``, uniforms from its top 24 bits and ziggurat normals, which the
compiled callback inlines where it multiplies (kvinject/engine/callback/graph_callback.py) and the device
kernel compiles again (kvinject/engine/gpu/device_kernels.py). Apart from kvinject/engine/variates.py,
whose streams every error model imports, so that a run with nothing to inject (a control, a
native cache type) does not load numba (about 65 MB)."""

from __future__ import annotations

import math

import numpy as np
from numba import njit

from ..laws import NORMAL, UNIFORM

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
    one rounding unless told not to, so kvinject/engine/gpu/device_kernels.py binds this name to a
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
def fill(kind, a, b, key, start, out):
    """``out[c]`` = value ``start + c`` of the stream ``key`` under the law ``(kind, a, b)``."""
    for c in range(len(out)):
        out[c] = factor(kind, a, b, hash_at(key, start + c))
