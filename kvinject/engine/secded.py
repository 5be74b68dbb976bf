"""SECDED over 64-bit words as memories deploy it: Hamming(72,64), an extended Hamming code.

The 64 data bits take the positions 1..71 of a Hamming codeword that are not powers of two (data
bit i the i-th of them), the 7 check bits the powers of two, and an overall parity bit covers all
71. A read recomputes the syndrome, the XOR of the positions of the bits that differ, and the
overall parity: parity odd and the syndrome a data bit's position, that bit is flipped back (a
check bit's, the data are left as read); parity odd and the syndrome no position, or parity even
and the syndrome not zero, the word is uncorrectable (detected); both zero, it is read as it is.

Faults here land in data bits only (the cache's values; the check bits are not part of a fault
space), so a word's error is its 64-bit pattern ``e`` of flipped data bits and what the decoder
makes of it depends on ``e`` alone: one bit is corrected, two are detected, three or more may be
detected, corrected into a fourth (miscorrected) or read as they are (undetected).
"""

from __future__ import annotations

import numpy as np

# Outcomes of a word's read, as fault records name them.
NONE, CORRECTED, DETECTED, MISCORRECTED, UNDETECTED = "none", "corrected", "detected", "miscorrected", "undetected"
STATUSES = (NONE, CORRECTED, DETECTED, MISCORRECTED, UNDETECTED)

POSITIONS = np.array([p for p in range(1, 72) if p & (p - 1)], np.int64)  # data bit i's codeword position
assert POSITIONS.size == 64
_DATA_BIT = np.full(128, -1, np.int64)  # a syndrome's data bit, -1 for a check bit's or none
_DATA_BIT[POSITIONS] = np.arange(64)
# The syndrome of a word's error, byte by byte: XOR of the positions of the bits set in byte b.
_BITS = (np.arange(256)[:, None] >> np.arange(8)) & 1  # (byte value, bit)
_BYTE_SYNDROME = np.array([np.bitwise_xor.reduce(np.where(_BITS == 1, POSITIONS[8 * b : 8 * b + 8], 0), axis=1) for b in range(8)])


def decode(errors: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """For each word's error pattern (uint64 of data bits flipped), the read's outcome (an index
    into STATUSES) and the error left in the data after it (uint64)."""
    errors = np.asarray(errors, np.uint64)
    octets = errors.reshape(-1, 1).view(np.uint8).reshape(-1, 8)  # little-endian: byte b holds data bits 8b..8b+7
    syndrome = np.bitwise_xor.reduce(_BYTE_SYNDROME[np.arange(8), octets], axis=1)
    odd = np.unpackbits(octets, axis=1).sum(axis=1) % 2 == 1
    bit = _DATA_BIT[syndrome]
    flip = np.where(odd & (bit >= 0), np.left_shift(np.uint64(1), np.maximum(bit, 0).astype(np.uint64)), np.uint64(0))
    left = (errors.reshape(-1) ^ flip).astype(np.uint64)
    detected = (odd & (syndrome > 71)) | (~odd & (syndrome != 0))
    status = np.where(
        errors.reshape(-1) == 0,
        STATUSES.index(NONE),
        np.where(
            detected,
            STATUSES.index(DETECTED),
            np.where(left == 0, STATUSES.index(CORRECTED), np.where(odd, STATUSES.index(MISCORRECTED), STATUSES.index(UNDETECTED))),
        ),
    )
    return status.reshape(errors.shape), left.reshape(errors.shape)
