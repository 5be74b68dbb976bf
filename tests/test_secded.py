"""SECDED (kvinject/engine/secded.py) against a literal Hamming(72,64): a codeword built bit by bit,
its check bits computed by their parity groups, bits flipped, and decoded as the textbook does."""

import itertools

import numpy as np

from kvinject.engine import secded


def _encode(data: int) -> list[int]:
    """The 72 bits of the codeword of ``data``: position 0 the overall parity, 1..71 Hamming's,
    check bits at the powers of two, data bits at the other positions in order."""
    word = [0] * 72
    data_positions = [p for p in range(1, 72) if p not in (1, 2, 4, 8, 16, 32, 64)]
    for i, p in enumerate(data_positions):
        word[p] = (data >> i) & 1
    for c in (1, 2, 4, 8, 16, 32, 64):
        word[c] = sum(word[p] for p in range(1, 72) if p & c and p != c) % 2
    word[0] = sum(word[1:]) % 2
    return word


def _decode(word: list[int]) -> tuple[str, int]:
    """The textbook decoder: (what it concluded, the data it returns)."""
    syndrome = 0
    for p in range(1, 72):
        if word[p]:
            syndrome ^= p
    parity = sum(word) % 2
    word = list(word)
    if syndrome == 0 and parity == 0:
        verdict = "clean"
    elif parity == 1 and syndrome <= 71:
        word[syndrome] ^= 1  # syndrome 0: the overall parity bit itself
        verdict = "corrected"
    else:
        verdict = "detected"
    data_positions = [p for p in range(1, 72) if p not in (1, 2, 4, 8, 16, 32, 64)]
    return verdict, sum(word[p] << i for i, p in enumerate(data_positions))


def _literal(data: int, bits: tuple[int, ...]) -> tuple[str, int]:
    """Flip data bits ``bits`` of ``data``'s codeword, decode: the status secded names, and the
    error left in the data."""
    word = _encode(data)
    data_positions = [p for p in range(1, 72) if p not in (1, 2, 4, 8, 16, 32, 64)]
    for b in bits:
        word[data_positions[b]] ^= 1
    verdict, read = _decode(word)
    left = read ^ data
    if verdict == "detected":
        return secded.DETECTED, left
    if not bits:
        return secded.NONE, left
    if left == 0:
        return secded.CORRECTED, left
    return (secded.MISCORRECTED if verdict == "corrected" else secded.UNDETECTED), left


def _check(patterns: list[tuple[int, ...]], data: int) -> None:
    errors = np.array([sum(1 << b for b in bits) for bits in patterns], np.uint64)
    status, left = secded.decode(errors)
    got = [(secded.STATUSES[s], int(x)) for s, x in zip(status, left)]
    want = [_literal(data, bits) for bits in patterns]
    assert got == want


def test_every_single_and_double_bit_error_against_a_literal_hamming_72_64():
    singles = [(b,) for b in range(64)]
    doubles = list(itertools.combinations(range(64), 2))
    _check([(), *singles, *doubles], 0x0123456789ABCDEF)
    status, _ = secded.decode(np.array([sum(1 << b for b in bits) for bits in singles + doubles], np.uint64))
    assert set(status[:64].tolist()) == {secded.STATUSES.index(secded.CORRECTED)}
    assert set(status[64:].tolist()) == {secded.STATUSES.index(secded.DETECTED)}


def test_triples_and_more_against_a_literal_hamming_72_64():
    rng = np.random.default_rng(0)
    triples = [tuple(sorted(rng.choice(64, 3, replace=False).tolist())) for _ in range(400)]
    quads = [tuple(sorted(rng.choice(64, 4, replace=False).tolist())) for _ in range(200)]
    _check(triples + quads + [tuple(range(64))], 0xFEDCBA9876543210)
    status = {secded.STATUSES[s] for s in secded.decode(np.array([sum(1 << b for b in t) for t in triples], np.uint64))[0]}
    assert secded.MISCORRECTED in status and secded.DETECTED in status, "three bits: miscorrected or detected, as the code does"
