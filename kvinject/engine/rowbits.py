"""A cache row's bytes as they lie in memory, where a fault lands: faults that change bits of
several values (a burst, a word) and ECC over 64-bit words act on them.

A row is one token's K or V of one layer: its values one after another, little-endian (f16 and
bf16 2 bytes each, f32 4), or q8_0/q4_0 blocks (kvinject/engine/quant_blocks.py). A change is given
per value in the masks faults are drawn in: a float's bits, or a block value's (its code's bits
0-7, and on a block's first value its scale's bits as 16-31), as ``clear`` (bits set to 0) then
``xor`` (bits flipped), so that a flip, a stuck bit and a value set outright are one operation.
Words are counted from the row's first byte: exact where a row is a whole number of words (a
float row of a head size divisible by 4), and as if a row were padded to one otherwise (a q8_0
row of 192 values takes 204 bytes).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from . import secded

VALUES = 32  # a q8_0 or q4_0 block's
SCALE_SHIFT = 16  # a block value's mask holds the scale's bits from here
WORD = 8  # bytes a word of ECC covers


@dataclass(frozen=True)
class RowLayout:
    """Where each value's bits lie in a row: ``size`` bytes a value (floats), or blocks of
    ``block`` bytes holding codes of ``code`` bits (q8_0: 34 and 8, q4_0: 18 and 4)."""

    size: int = 0
    block: int = 0
    code: int = 0

    def nbytes(self, values: int) -> int:
        return values // VALUES * self.block if self.block else values * self.size

    def bytes_of(self, value: int, mask: int) -> list[tuple[int, int]]:
        """The bytes of a row that bits ``mask`` of value ``value`` lie in: (offset, byte mask)."""
        if not self.block:
            return [(value * self.size + k, (mask >> 8 * k) & 0xFF) for k in range(self.size) if (mask >> 8 * k) & 0xFF]
        block, j = divmod(value, VALUES)
        start, scale, code = block * self.block, mask >> SCALE_SHIFT, mask & 0xFF
        out = [(start + k, (scale >> 8 * k) & 0xFF) for k in range(2) if (scale >> 8 * k) & 0xFF]
        if code and self.code == 8:
            out.append((start + 2 + j, code))
        elif code:
            out.append((start + 2 + j % 16, code << (4 if j >= 16 else 0)))
        return out

    def values_of(self, offset: int, byte: int) -> list[tuple[int, int]]:
        """The values whose bits ``byte`` (a mask) of the row's byte ``offset`` are: (value, mask)."""
        if not self.block:
            return [(offset // self.size, byte << 8 * (offset % self.size))] if byte else []
        block, at = divmod(offset, self.block)
        first = block * VALUES
        if at < 2:
            return [(first, byte << (SCALE_SHIFT + 8 * at))] if byte else []
        if self.code == 8:
            return [(first + at - 2, byte)] if byte else []
        return [(v, m) for v, m in ((first + at - 2, byte & 0xF), (first + at - 2 + 16, byte >> 4)) if m]


# Which outcome a value changed in several words takes: the worst.
WORST = (secded.DETECTED, secded.MISCORRECTED, secded.UNDETECTED, secded.CORRECTED, secded.NONE)


def land(layout: RowLayout, raw: np.ndarray, changes: list[tuple[int, int, int, int]], ecc: bool) -> list[tuple[int, int, int, str | None]]:
    """Make ``changes`` (row, value, clear, xor) in ``raw`` (rows, bytes: the rows as stored, changed
    in place), read through SECDED where ``ecc``. Returns each value changed or named: (row, value,
    the bits it differs in from before, the read's outcome (secded.STATUSES) or None without ECC)."""
    touched = sorted({r for r, *_ in changes})
    before = {r: raw[r].copy() for r in touched}
    named: dict[tuple[int, int], int] = {}
    for r, value, clear, xor in changes:
        named[r, value] = named.get((r, value), 0) | clear | xor
        for offset, c in layout.bytes_of(value, clear):
            raw[r, offset] &= np.uint8(~c & 0xFF)
        for offset, x in layout.bytes_of(value, xor):
            raw[r, offset] ^= np.uint8(x)
    out = []
    for r in touched:
        error = raw[r] ^ before[r]
        status = None
        if ecc:
            padded = np.zeros(-(-error.size // WORD) * WORD, np.uint8)
            padded[: error.size] = error
            codes, left = secded.decode(padded.view(np.uint64))
            error = left.view(np.uint8)[: error.size]
            raw[r] = before[r] ^ error
            status = [secded.STATUSES[c] for c in codes]
        masks: dict[int, int] = {}
        for offset in np.nonzero(error)[0].tolist():
            for value, mask in layout.values_of(offset, int(error[offset])):
                masks[value] = masks.get(value, 0) | mask
        # A value named keeps its entry where ECC corrected it (0); one a miscorrection changed is added.
        for value in sorted(masks.keys() | {v for row, v in named if row == r}):
            mask = masks.get(value, 0)
            words = {offset // WORD for offset, _ in layout.bytes_of(value, mask | named.get((r, value), 0))}
            outcome = min((status[w] for w in words), key=WORST.index) if status is not None and words else None
            out.append((r, value, mask, outcome))
    return out
