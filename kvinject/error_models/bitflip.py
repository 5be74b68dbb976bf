"""Bit flips in the stored representation (hardware-fault studies): at a rate, or a fixed
number per item. The format is the cache's: fp16 for an f16 cache (the default), bf16 or f32
for those caches, unless ``format=`` names one. For a quantized cache ``bitflip`` flips fp16,
as before (llama.cpp quantizes the float32 value, here flipped as fp16), while ``faults`` flips
bits of the q8_0 or q4_0 blocks themselves: a scale's or a code's (kvinject/engine/quant_blocks.py)."""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, ClassVar

import numpy as np

from ..engine import laws
from ..engine.perturbation import EntryModel, ErrorModel
from ..engine.quant_blocks import BLOCK_FORMATS, VALUES, BlockFormat
from ..engine.rowbits import SCALE_SHIFT, RowLayout, land
from ..engine.sites import Placed
from ..engine.variates import Draws
from ..exceptions import InjectionError, SpecError
from .fault_models import FAULT_MODELS, Space, fault_model
from .registry import register

if TYPE_CHECKING:
    from ..engine.options import CacheOptions

FIELDS = ("sign", "exponent", "mantissa", "any")
BLOCK_FIELDS = ("scale", "code", "any")
STAGES = ("prompt", "generated", "any")  # where faults go: the prompt's tokens (the default), the generated ones, either


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


class _Flips(EntryModel):
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
    stage: str | None = None
    only: int | None = None  # keep only the ONLY-th of the K faults drawn (from 0): one replayed alone
    kind: str | None = None  # a fault model of kvinject/error_models/fault_models; None: a single-bit flip ('model' names the error model in grids)
    bits: int | None = None  # a burst's bits
    ecc: str | None = None  # secded: the cache's memory read through SECDED (kvinject/engine/secded.py)
    name: ClassVar[str] = "faults"
    syntax: ClassVar[str] = (
        f"faults:K[,field=F][,bit=N][,format=f16|bf16|f32|q8_0|q4_0][,stage=prompt|generated|any][,kind={'|'.join(FAULT_MODELS)}][,bits=M][,ecc=none|secded]"
    )
    summary: ClassVar[str] = (
        "Exactly K single-bit faults per item, at bits drawn uniformly among those of the K/V its prompt (or stage=generated: its generated "
        "tokens, or any) writes to the targeted layers as the cache stores them: a float's (as bitflip) or a q8_0/q4_0 block's fp16 scale or "
        "codes; in field F (sign, exponent, mantissa; scale, code; any) or bit N of it if asked; kind= another fault model (double, adjacent, "
        "burst with bits=M, random, zero, stuck0, stuck1, word), ecc=secded the memory read through SECDED (fault campaigns: docs/faults.md)."
    )
    example: ClassVar[str] = "faults:1,bit=14"

    @property
    def spares_prompt(self) -> bool:
        return self.stage == "generated"

    def __post_init__(self) -> None:
        if self.count < 1:
            raise SpecError(f"'faults': K must be >= 1, got {self.count}")
        if self.only is not None and not 0 <= self.only < self.count:
            raise SpecError(f"'faults': only names one of the K faults drawn, 0..{self.count - 1}, got {self.only}")
        if self.stage not in (None, *STAGES):
            raise SpecError(f"'faults': stage must be one of {', '.join(STAGES)}, got '{self.stage}'")
        if self.format in BLOCK_FORMATS or self.field in ("scale", "code"):
            self._check_blocks()
        else:
            self._check()
        if self.ecc not in (None, "none", "secded"):
            raise SpecError(f"'faults': ecc must be none or secded, got '{self.ecc}'")
        if self.kind is None and self.bits is not None:
            raise SpecError("'faults': bits=M is a burst's: give kind=burst")
        if self.kind is not None:
            model = fault_model(self.kind, self.bits)
            given = [o for o, v in (("field", self.field != "any"), ("bit", self.bit is not None), ("bits", self.bits is not None)) if v]
            if taken := [o for o in given if o not in model.options]:
                raise SpecError(f"'faults': kind={self.kind} takes no {taken[0]}= (it takes {', '.join(model.options) or 'none of field, bit, bits'})")

    def _check_blocks(self) -> None:
        if self.format is not None and self.format not in BLOCK_FORMATS:
            raise SpecError(f"'faults': field={self.field} is a quantized block's, so format must be q8_0 or q4_0 (or left to the cache), got '{self.format}'")
        if self.field not in BLOCK_FIELDS:
            raise SpecError(f"'faults': a {self.format} block's fields are {', '.join(BLOCK_FIELDS)}, got '{self.field}'")
        if self.bit is None:
            return
        if self.field == "any":
            raise SpecError(f"'faults': bit {self.bit} of a block is its scale's or its codes': give field=scale or field=code")
        widest = 16 if self.field == "scale" else BLOCK_FORMATS[self.format or "q8_0"].code
        if not 0 <= self.bit < widest:
            raise SpecError(f"'faults': bit must be in 0..{widest - 1} (the bits of a {self.format or 'q8_0'} {self.field}), got {self.bit}")

    def stored(self, cache: CacheOptions, components: str) -> ErrorModel:
        types = {c: t for c, t in (("k", cache.type_k), ("v", cache.type_v)) if c in components}
        blocks = [t for t in types.values() if t in BLOCK_FORMATS]
        if self.format in FORMATS or (self.format is None and not blocks and self.field not in ("scale", "code")):
            other = sorted({t for t in types.values() if t not in FORMATS} if self.format is None else ())
            if other:  # their blocks are not modeled, and flipping the float before quantization is another experiment
                raise SpecError(
                    f"'{self.name}' flips bits of q8_0 and q4_0 blocks, not of a {other[0]} cache's: "
                    "give format=f16 to flip the value as fp16 before llama.cpp quantizes it"
                )
            return super().stored(cache, components)
        fmt = self.format or (blocks[0] if blocks else None)
        stores = " and ".join(f"{c.upper()} as {t}" for c, t in types.items())
        if fmt is None:
            raise SpecError(f"'{self.name}': field={self.field} is a quantized block's, and this cache stores {stores}: give a q8_0 or q4_0 cache (@q8_0)")
        if any(t != fmt for t in types.values()):
            raise SpecError(f"'{self.name}' flips bits of {fmt} blocks, and this cache stores {stores}: target one (--target k or v) or give both that type")
        return replace(self, format=fmt)  # checked again: a code's bit within this format's

    @property
    def blocks(self) -> BlockFormat | None:
        return BLOCK_FORMATS.get(self.format or "")

    @property
    def device_law(self) -> tuple[float, ...] | None:
        return None if self.blocks or self._changes else super().device_law

    @property
    def secded(self) -> bool:
        return self.ecc == "secded"

    @property
    def _changes(self) -> bool:
        """Lands as a fault model's changes (kvinject/engine/rowbits.py) rather than XOR masks alone."""
        return self.kind is not None or self.secded

    @property
    def random(self) -> bool:
        return True

    @property
    def placed(self) -> bool:
        return True

    def stream(self, rng: np.random.Generator, span: tuple[int, int, int] | None) -> Draws:
        if span is None:  # a sequence no benchmark item began: fails if it is ever decoded
            return _Unplaced()
        prompt, generated, *rest = span
        row = rest[0] if rest else 0
        # The values the faults may hit: the prompt's, then those its generated tokens may write
        # (a fault placed past where the generation stopped never lands, and is not recorded).
        first, horizon = {"prompt": (0, prompt), "generated": (prompt, generated), "any": (0, prompt + generated)}[self.stage or "prompt"]
        if self.kind is not None:
            return self._modelled(rng, first, horizon, prompt, row)
        blocks = self.blocks
        # A block's bits: a flat index over (block, bit of the block), its scale's put on its first value.
        sites = blocks.sites(self.field, self.bit) if blocks else None
        space = horizon // VALUES * len(sites) if blocks else horizon
        if self.count > space:  # placing fewer would run something other than the label says
            unit = f"{space} bits of {blocks.name} blocks that may be hit" if blocks else f"{horizon} values"
            where = {"prompt": "whose prompt writes", "generated": "whose generated tokens may write", "any": "whose prompt and generated tokens may write"}
            raise SpecError(
                f"'{self.spec}' asks for {self.count} faults in an item {where[self.stage or 'prompt']} {unit} to the targeted layers: ask for at most {space}"
            )
        if blocks:
            block, k = np.divmod(rng.choice(space, size=self.count, replace=False), len(sites))
            at = block * VALUES + np.array([j for j, _ in sites])[k]
            masks = np.array([m for _, m in sites], np.uint32)[k]
            order = np.argsort(at, kind="stable")
            at, masks = at[order], masks[order]
        else:
            at = np.sort(rng.choice(horizon, size=self.count, replace=False))
            uint = self._format.uint
            masks = np.left_shift(uint(1), rng.choice(self._bits(), size=len(at)).astype(uint))
        keep = slice(None) if self.only is None else slice(self.only, self.only + 1)  # drawn all the same: the same fault
        if self.secded:  # the same faults as without ECC, landed through the code
            return Placed(first + at[keep], masks[keep].astype(np.uint64), self._landing, prompt, np.arange(len(at[keep])), "flip", row)
        return Placed(first + at[keep], masks[keep], self.describe, prompt)

    def _modelled(self, rng: np.random.Generator, first: int, horizon: int, prompt: int, row: int) -> Placed:
        """A fault model's faults among values ``first .. first + horizon`` of the item's stream."""
        blocks = self.blocks
        if blocks:
            space = Space(horizon // VALUES, VALUES, blocks.sites(self.field, self.bit), row, blocks.layout)
        else:
            space = Space(horizon, 1, [(0, 1 << b) for b in self._bits()], row, RowLayout(size=np.dtype(self._format.uint).itemsize))
        try:
            drawn = fault_model(self.kind, self.bits).draw(rng, space, self.count)
        except SpecError as e:
            raise SpecError(f"'{self.spec}' {e}") from None
        keep = np.ones(len(drawn.at), bool) if self.only is None else drawn.fault == self.only
        order = np.argsort(drawn.at[keep], kind="stable")
        packed = (drawn.clear << np.uint64(32) | drawn.xor)[keep][order]
        return Placed(first + drawn.at[keep][order], packed, self._landing, prompt, drawn.fault[keep][order], self.kind, row)

    def describe(self, mask: int) -> dict[str, object]:
        return self.blocks.describe(mask) if self.blocks else super().describe(mask)

    def apply(self, x: np.ndarray, draws: Draws | None) -> None:
        if not self._changes:
            return super().apply(x, draws)
        packed = draws.take(x.size).reshape(x.shape)
        bits = self._format.encode(x)
        rows, values = np.nonzero(packed)
        if rows.size:
            changes = [(r, v, int(packed[r, v]) >> 32, int(packed[r, v]) & 0xFFFFFFFF) for r, v in zip(rows.tolist(), values.tolist())]
            draws.note(land(RowLayout(size=bits.itemsize), bits.view(np.uint8), changes, self.secded), x.shape[1])
        x[...] = self._format.decode(bits)

    def _landing(self, packed: int) -> dict[str, object]:
        """A fault model's first change, for its record: the fields of the stored format its bits
        (cleared or flipped) lie in, "+"-joined, and the highest of them."""
        bits = packed >> 32 | packed & 0xFFFFFFFF
        if self.blocks:
            parts = [(f, m) for f, m in (("scale", bits >> SCALE_SHIFT), ("code", bits & 0xFFFF)) if m]
            return {"bit": parts[0][1].bit_length() - 1, "field": "+".join(f for f, _ in parts), "format": self.format}
        fields = [f for f in ("sign", "exponent", "mantissa") if self._format.mask(f) & bits]
        return {"bit": bits.bit_length() - 1, "field": "+".join(fields), "format": self.format or "f16"}


class _Unplaced(Draws):
    def __init__(self) -> None:
        pass

    def take(self, n: int) -> np.ndarray:
        raise InjectionError("'faults' places its faults in each item's prompt: run it through a benchmark (kvinject run or sweep)")
