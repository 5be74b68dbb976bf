"""Bit flips in the stored float representation (hardware-fault studies): at a rate, or a fixed
number per item. The format is the cache's: fp16 for an f16 cache (the default), bf16 or f32
for those caches, unless ``format=`` names one. A quantized cache keeps fp16, as before: its
blocks' bits are not modeled (llama.cpp quantizes the float32 value, here flipped as fp16)."""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, ClassVar

import numpy as np

from ..engine import laws
from ..engine.perturbation import ErrorModel
from ..engine.sites import Placed
from ..engine.variates import Draws
from ..exceptions import InjectionError, SpecError
from .registry import register

if TYPE_CHECKING:
    from ..engine.options import CacheOptions

FIELDS = ("sign", "exponent", "mantissa", "any")


@dataclass(frozen=True)
class _Format:
    """A float format's bit layout: the unsigned integer of its width and its mantissa and
    exponent bits (the sign is the top bit)."""

    uint: type
    mantissa: int
    exponent: int

    @property
    def width(self) -> int:
        return 1 + self.exponent + self.mantissa

    def mask(self, field: str) -> int:
        return {
            "sign": 1 << (self.width - 1),
            "exponent": ((1 << self.exponent) - 1) << self.mantissa,
            "mantissa": (1 << self.mantissa) - 1,
            "any": (1 << self.width) - 1,
        }[field]

    def encode(self, x: np.ndarray) -> np.ndarray:
        """``x`` (float32) in this format, as its unsigned integers, rounded to nearest even as
        llama.cpp's conversions round."""
        if self.uint is np.uint32:
            return x.view(np.uint32).copy()
        if self.mantissa == 10:
            return x.astype(np.float16).view(np.uint16)
        u = x.view(np.uint32)  # bf16: ggml_compute_fp32_to_bf16, NaNs kept quiet
        nan = (u & 0x7FFFFFFF) > 0x7F800000
        return np.where(nan, (u >> 16) | 64, (u + (0x7FFF + ((u >> 16) & 1))) >> 16).astype(np.uint16)

    def decode(self, bits: np.ndarray) -> np.ndarray:
        """The values of ``bits``, as float16 or float32 (exactly)."""
        if self.uint is np.uint32:
            return bits.view(np.float32)
        if self.mantissa == 10:
            return bits.view(np.float16)
        return (bits.astype(np.uint32) << 16).view(np.float32)


FORMATS = {"f16": _Format(np.uint16, 10, 5), "bf16": _Format(np.uint16, 7, 8), "f32": _Format(np.uint32, 23, 8)}


class _Flips(ErrorModel):
    """What bit flips share: the bits they may flip, the stored format they flip them in, and
    the value they start from."""

    field: str
    bit: int | None
    format: str | None

    def _check(self) -> None:
        if self.field not in FIELDS:
            raise SpecError(f"'{self.name}': field must be one of {', '.join(FIELDS)}, got '{self.field}'")
        if self.format is not None and self.format not in FORMATS:
            raise SpecError(f"'{self.name}': format must be one of {', '.join(FORMATS)}, got '{self.format}'")
        if self.bit is not None and self.field != "any":
            raise SpecError(f"'{self.name}': give a field or a bit, not both")
        widest = FORMATS[self.format or "f32"].width
        if self.bit is not None and not 0 <= self.bit < widest:
            raise SpecError(f"'{self.name}': bit must be in 0..{widest - 1} (the bits of {self.format or 'an f32'}), got {self.bit}")

    @property
    def _format(self) -> _Format:
        return FORMATS[self.format or "f16"]

    def _bits(self) -> list[int]:
        """The bit positions a flip may take: those of the field, or the bit."""
        if self.bit is not None:
            return [self.bit]
        mask = self._format.mask(self.field)
        return [b for b in range(self._format.width) if mask >> b & 1]

    def stored(self, cache: CacheOptions, components: str) -> ErrorModel:
        fmt = self.format
        if fmt is None:
            types = {c: t for c, t in (("k", cache.type_k), ("v", cache.type_v)) if c in components}
            formats = {c: t if t in FORMATS else "f16" for c, t in types.items()}  # a quantized cache's blocks: fp16, as before
            if len(set(formats.values())) > 1:
                raise SpecError(
                    f"'{self.name}' flips bits of the stored format, and this cache stores K as {types['k']} and V as {types['v']} "
                    f"(flipped as {formats['k']} and {formats['v']}): target one (--target k or v) or name the format (format=f16, bf16 or f32)"
                )
            fmt = next(iter(formats.values()))
        if self.bit is not None and self.bit >= FORMATS[fmt].width:
            raise SpecError(f"'{self.name}': bit {self.bit} is beyond the {FORMATS[fmt].width} bits of {fmt}, the stored format here (an f32 cache has 32)")
        # fp16 keeps the spec it had (and the store keys); another format is in the spec, so that
        # results from before bit flips followed the cache (fp16 bits in an f32 cache) keep theirs.
        return self if fmt == "f16" and self.format is None else replace(self, format=fmt)

    @property
    def device_law(self) -> tuple[float, ...]:
        """The masks are drawn on the host, as for :meth:`apply`, and XORed on the device."""
        return (laws.FLIP, {"f32": laws.F32, "f16": laws.F16, "bf16": laws.BF16}[self.format or "f16"])

    def apply(self, x: np.ndarray, draws: Draws | None) -> None:
        bits = self._format.encode(x)
        bits ^= draws.take(x.size).reshape(x.shape)
        x[...] = self._format.decode(bits)

    def describe(self, mask: int) -> dict[str, object]:
        """A fault's bit and the field of the stored format it lies in, for its record."""
        bit = mask.bit_length() - 1
        fmt = self._format
        return {"bit": bit, "field": next(f for f in ("sign", "exponent", "mantissa") if fmt.mask(f) >> bit & 1), "format": self.format or "f16"}

    def unchanged(self, x: np.ndarray) -> np.ndarray:
        """The value in the stored format, which the flips start from: the realized statistics
        count the flips, not that rounding, which the cache makes anyway."""
        return x if self._format.uint is np.uint32 else self._format.decode(self._format.encode(x)).astype(np.float32, copy=False)


@register
@dataclass(frozen=True)
class BitFlip(_Flips):
    p: float
    field: str = "any"
    bit: int | None = None
    format: str | None = None
    name: ClassVar[str] = "bitflip"
    syntax: ClassVar[str] = "bitflip:P[,field=sign|exponent|mantissa|any][,bit=N][,format=f16|bf16|f32]"
    summary: ClassVar[str] = (
        "Flip each bit of the component's stored representation (the cache's f16, bf16 or f32; fp16 for a quantized cache) with probability P, "
        "restricted to one field, or to bit N (fp16: 15 sign, 10-14 exponent), if asked (hardware-fault studies: docs/faults.md)."
    )
    example: ClassVar[str] = "bitflip:0.001,field=exponent"

    def __post_init__(self) -> None:
        if not 0 <= self.p <= 1:
            raise SpecError(f"'bitflip': P must be in [0, 1], got {self.p}")
        self._check()

    def draw(self, rng: np.random.Generator, n: int) -> np.ndarray:
        uint = self._format.uint
        mask = np.zeros(n, dtype=uint)
        for bit in self._bits():
            mask |= (rng.random(n, dtype=np.float32) < self.p).astype(uint) << uint(bit)
        return mask


@register
@dataclass(frozen=True)
class Faults(_Flips):
    count: int
    field: str = "any"
    bit: int | None = None
    format: str | None = None
    name: ClassVar[str] = "faults"
    syntax: ClassVar[str] = "faults:K[,field=sign|exponent|mantissa|any][,bit=N][,format=f16|bf16|f32]"
    summary: ClassVar[str] = (
        "Exactly K single-bit faults per item, at values drawn uniformly among the K/V its prompt writes to the targeted layers, "
        "each flipping one bit of the stored value (as bitflip), in a field or bit N if asked (fault campaigns: docs/faults.md)."
    )
    example: ClassVar[str] = "faults:1,bit=14"

    def __post_init__(self) -> None:
        if self.count < 1:
            raise SpecError(f"'faults': K must be >= 1, got {self.count}")
        self._check()

    @property
    def random(self) -> bool:
        return True

    @property
    def placed(self) -> bool:
        return True

    def stream(self, rng: np.random.Generator, horizon: int | None) -> Draws:
        if horizon is None:  # a sequence no benchmark item began: fails if it is ever decoded
            return _Unplaced()
        if self.count > horizon:  # placing fewer would run something other than the label says
            raise SpecError(
                f"'{self.spec}' asks for {self.count} faults in an item whose prompt writes {horizon} values to the targeted layers: ask for at most {horizon}"
            )
        at = np.sort(rng.choice(horizon, size=self.count, replace=False))
        uint = self._format.uint
        masks = np.left_shift(uint(1), rng.choice(self._bits(), size=len(at)).astype(uint))
        return Placed(at, masks, self.describe)


class _Unplaced(Draws):
    def __init__(self) -> None:
        pass

    def take(self, n: int) -> np.ndarray:
        raise InjectionError("'faults' places its faults in each item's prompt: run it through a benchmark (kvinject run or sweep)")
