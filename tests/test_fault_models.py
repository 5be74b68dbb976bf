"""Fault models (faults:K,kind=...) read back from the cache: each changes exactly the bits it
names, where its record says, in every stored format; ECC (ecc=secded) lands them as a literal
Hamming(72,64) decodes them."""

import numpy as np
import pytest

from kvinject.engine.context import Context
from kvinject.engine.generation.batching import generate_all
from kvinject.engine.options import CacheOptions
from kvinject.engine.target import Target
from kvinject.error_models.configuration import Configuration
from kvinject.exceptions import SpecError

from .cache_state import read_cells
from .test_secded import _decode, _encode
from .tiny_model import HEAD_DIM

PROMPTS = ["The quick brown fox jumps over the lazy dog.", "One two three four five six seven eight nine ten eleven."]
# Each format's bytes a value (floats), or its block's bytes and bits a code (ggml-common.h).
FLOATS = {"f16": 2, "bf16": 2, "f32": 4}
BLOCKS = {"q8_0": (34, 8), "q4_0": (18, 4)}
QUIET = {"f16": 1 << 9, "bf16": 1 << 6, "f32": 0}  # the bit llama.cpp's conversions set in a NaN


def _stored(fmt: str, rows: np.ndarray) -> np.ndarray:
    """A cache's rows as the bytes it stores (read_cells gives floats exactly, blocks as bytes)."""
    if fmt in BLOCKS:
        return rows
    if fmt == "f16":
        return np.ascontiguousarray(rows.astype(np.float16)).view(np.uint8)
    if fmt == "bf16":
        return np.ascontiguousarray((rows.view(np.uint32) >> 16).astype(np.uint16)).view(np.uint8)
    return np.ascontiguousarray(rows).view(np.uint8)


def _bit_addresses(fmt: str, column: int, mask: int) -> set[int]:
    """The bits of a row's memory (byte * 8 + bit) that bits ``mask`` of value ``column`` are,
    from the formats' definitions: little-endian floats; a block's fp16 scale (mask bits 16-31 on
    its first value) then q8_0's int8 codes (value j at byte 2 + j) or q4_0's nibbles (value j < 16
    low in byte 2 + j, j + 16 high)."""
    bits = [b for b in range(32) if mask >> b & 1]
    if fmt in FLOATS:
        return {column * FLOATS[fmt] * 8 + b for b in bits}
    nbytes, code = BLOCKS[fmt]
    block, j = divmod(column, 32)
    start = block * nbytes * 8
    out = {start + b - 16 for b in bits if b >= 16}
    low = [b for b in bits if b < 16]
    if code == 8:
        return out | {start + (2 + j) * 8 + b for b in low}
    return out | {start + (2 + j % 16) * 8 + b + (4 if j >= 16 else 0) for b in low}


def _run(tiny, fmt: str, spec: str, tokens: int = 4):
    """Per prompt: the positions and stored bytes of layer 1's cache once the item is done, and
    the item's generation (its faults)."""
    target = Target.parse("kv", "1")
    config = Configuration.parse(f"{spec}@{fmt}", target)
    prompts = [tiny.tokenize(p) for p in PROMPTS]
    with Context(tiny, CacheOptions(fmt, fmt, "on"), config.error, target, seed=7, n_ctx=128) as ctx:
        done = dict((i, (read_cells(ctx), gen)) for i, gen in generate_all(ctx, prompts, tokens, items=[0, 1], ignore_eos=True))
    out = []
    for i, prompt in enumerate(prompts):
        (pos, cells), gen = done[i]
        order = np.argsort(pos)[: len(prompt)]
        out.append(({c: _stored(fmt, cells[c, 1][order]) for c in "kv"}, gen))
    return out


def _changed(clean: dict, faulty: dict) -> set[tuple[str, int, int]]:
    """(K or V, position, bit address in the row) of every bit that differs."""
    out = set()
    for c in "kv":
        diff = np.unpackbits(clean[c] ^ faulty[c], axis=1, bitorder="little")
        out |= {(c, int(p), int(a)) for p, a in zip(*np.nonzero(diff))}
    return out


def _named(fmt: str, fault: dict) -> set[tuple[str, int, int]]:
    column = fault["head"] * HEAD_DIM + fault["element"]
    return {(fault["kv"], fault["position"], a) for offset, mask in fault["changes"] for a in _bit_addresses(fmt, column + offset, mask)}


def _quieted(fmt: str, clean: dict, faulty: dict, extra: set) -> bool:
    """The bits found beyond those named are the quiet bit of a NaN the fault made."""
    width = FLOATS.get(fmt, 0) * 8
    return all(fmt in FLOATS and a % width == QUIET[fmt].bit_length() - 1 for _, _, a in extra)


MODELS = {
    "double": lambda f: len(f["changes"]) == 1 and bin(f["changes"][0][1]).count("1") == 2,
    "adjacent": lambda f: len(f["changes"]) == 1 and bin(f["changes"][0][1]).count("1") == 2 and "11" in bin(f["changes"][0][1]),
    "burst,bits=5": lambda f: sum(bin(m).count("1") for _, m in f["changes"]) == 5,
    "word": lambda f: sum(bin(m).count("1") for _, m in f["changes"]) <= 64,
    "random": lambda f: len(f["changes"]) <= 1,
    "zero": lambda f: len(f["changes"]) <= 1,
    "stuck0": lambda f: len(f["changes"]) == 1 and bin(f["changes"][0][1]).count("1") <= 1,
    "stuck1": lambda f: len(f["changes"]) == 1 and bin(f["changes"][0][1]).count("1") <= 1,
}


@pytest.mark.parametrize("fmt", [*FLOATS, *BLOCKS])
@pytest.mark.parametrize("model", list(MODELS))
def test_each_fault_model_changes_exactly_the_bits_it_names(tiny, fmt, model):
    """In the last layer (which no other cached value depends on), each item's prompt rows differ
    from the control's in exactly the bits its faults' records name, at their sites; a burst's
    are neighbours in the row's memory, a word's one aligned 64-bit word."""
    clean = _run(tiny, fmt, "none")
    faulty = _run(tiny, fmt, f"faults:2,kind={model}")
    for (clean_rows, _), (rows, gen) in zip(clean, faulty):
        assert len(gen.faults) == 2 and all(f["kind"] == model.split(",")[0] and f["format"] == fmt for f in gen.faults)
        assert all(MODELS[model](f) for f in gen.faults), gen.faults
        named = set().union(*(_named(fmt, f) for f in gen.faults))
        found = _changed(clean_rows, rows)
        assert named <= found and _quieted(fmt, clean_rows, rows, found - named), (named ^ found, gen.faults)
        for f in gen.faults:
            addresses = sorted(a for _, _, a in _named(fmt, f))
            if model.startswith("burst"):
                assert addresses == list(range(addresses[0], addresses[0] + 5)), "neighbouring bits of memory"
            if model == "word":
                assert addresses[0] % 64 == 0 and addresses == list(range(addresses[0], addresses[0] + len(addresses)))
                assert len(addresses) == 64 or addresses[-1] == clean_rows["k"].shape[1] * 8 - 1, "a whole word, or the row's last"


@pytest.mark.parametrize("fmt", ["f16", "q4_0"])
@pytest.mark.parametrize("level", [0, 1])
def test_a_stuck_bit_holds_to_the_item_s_end(tiny, fmt, level):
    """A stuck bit reads as stuck in the cache once every token of the item is decoded (the prompt's
    and the generated ones'), and the record names a change exactly where the value had the other bit."""
    clean = _run(tiny, fmt, "none", tokens=6)
    faulty = _run(tiny, fmt, f"faults:3,kind=stuck{level},stage=any", tokens=6)
    for (clean_rows, _), (rows, gen) in zip(clean, faulty):
        for f in gen.faults:
            if f["position"] >= len(rows["k"]):
                continue  # a generated token's cell, compared with no control
            column = f["head"] * HEAD_DIM + f["element"]
            [address] = _bit_addresses(fmt, column, 1 << f["bit"] << (16 if f["field"] == "scale" else 0))
            byte, bit = divmod(address, 8)
            assert (rows[f["kv"]][f["position"], byte] >> bit) & 1 == level
            was = (clean_rows[f["kv"]][f["position"], byte] >> bit) & 1
            assert f["changes"] == [[0, 0 if was == level else (1 << f["bit"] << (16 if f["field"] == "scale" else 0))]]


def _literal_secded(error: np.ndarray) -> tuple[list[str], np.ndarray]:
    """A row's error bytes read through the literal Hamming(72,64), word by word from the row's
    start: each word's verdict and the error left."""
    padded = np.zeros(-(-error.size // 8) * 8, np.uint8)
    padded[: error.size] = error
    verdicts, left = [], padded.copy()
    for w, word in enumerate(padded.view(np.uint64).tolist()):
        if word:
            code = _encode(0)
            positions = [p for p in range(1, 72) if p & (p - 1)]
            for b in range(64):
                code[positions[b]] ^= word >> b & 1
            verdict, read = _decode(code)
            verdicts.append(verdict)
            left[8 * w : 8 * w + 8] = np.array([read], np.uint64).view(np.uint8)
    return verdicts, left[: error.size]


@pytest.mark.parametrize("fmt,model", [("f32", "double"), ("f32", "burst,bits=3"), ("q8_0", "word"), ("q8_0", "zero"), ("f32", "random")])
def test_secded_lands_each_fault_as_a_literal_hamming_72_64_reads_it(tiny, fmt, model):
    """The same faults with and without ECC: read through SECDED, each row holds what a literal
    Hamming(72,64) decoder returns for the error the fault made (corrected away, miscorrected, or
    left where detected or undetected), and the record says which."""
    clean = _run(tiny, fmt, "none")
    bare = _run(tiny, fmt, f"faults:1,kind={model}")
    coded = _run(tiny, fmt, f"faults:1,kind={model},ecc=secded")
    for (clean_rows, _), (bare_rows, bare_gen), (rows, gen) in zip(clean, bare, coded):
        [f] = gen.faults
        [g] = bare_gen.faults
        assert {k: v for k, v in f.items() if k not in ("changes", "ecc")} == {k: v for k, v in g.items() if k != "changes"}, "the same fault"
        c, p = f["kv"], f["position"]
        verdicts, left = _literal_secded(clean_rows[c][p] ^ bare_rows[c][p])
        assert np.array_equal(clean_rows[c][p] ^ rows[c][p], left)
        want = "detected" if "detected" in verdicts else "corrected" if not left.any() else "miscorrected" if "corrected" in verdicts else "undetected"
        assert f["ecc"] == want


def test_a_single_flip_under_secded_is_corrected_and_a_double_detected(tiny):
    clean = _run(tiny, "f16", "none")
    single = _run(tiny, "f16", "faults:2,ecc=secded")
    double = _run(tiny, "f16", "faults:2,kind=double,ecc=secded")
    for (clean_rows, _), (rows, gen), (_, gen2) in zip(clean, single, double):
        assert all(np.array_equal(clean_rows[c], rows[c]) for c in "kv"), "every single flip corrected"
        assert [f["ecc"] for f in gen.faults] == ["corrected"] * 2 and all(f["changes"] == [[0, 0]] for f in gen.faults)
        assert [f["ecc"] for f in gen2.faults] == ["detected"] * 2


def test_fault_model_options_are_checked():
    for spec, message in [
        ("faults:1,kind=burst", "needs bits=M"),
        ("faults:1,kind=word,field=sign", "takes no field="),
        ("faults:1,kind=double,bit=3", "takes no bit="),
        ("faults:1,bits=2", "give kind=burst"),
        ("faults:1,ecc=parity", "ecc must be none or secded"),
        ("faults:1,kind=twice", "kind must be one of"),
    ]:
        with pytest.raises(SpecError, match=message):
            Configuration.parse(spec)


@pytest.mark.parametrize(
    "spec,sites,values",
    [
        ("faults:1,kind=adjacent,format=f32", 4 * 31, 4),  # bits b and b + 1, b of 0..30 (15 and 16 too), of 4 values
        ("faults:1,kind=double,field=exponent,format=f16", 4 * 10, 4),
        ("faults:1,kind=stuck1,field=scale,format=q4_0", 16, 32),  # a block: its scale's bits
        ("faults:1,kind=zero,format=q8_0", 33, 32),  # a block: its scale and 32 codes
        ("faults:1,kind=word,format=bf16", 2, 8),  # a row of 8 values: 2 words
    ],
)
def test_fault_models_draw_uniformly_over_their_sites(spec, sites, values):
    """Over many items' draws each site a model may take (a pair of bits, an element, a word) is
    taken equally often (chi-square against the uniform, 30 expected per site)."""
    from scipy.stats import chisquare

    from kvinject.error_models import parse_error

    model = parse_error(spec)
    rng = np.random.default_rng(3)
    hits: dict[tuple, int] = {}
    for _ in range(30 * sites):
        packed = model.stream(rng, (values, 0, values)).take(values)
        key = tuple((int(v), int(packed[v])) for v in np.nonzero(packed)[0])
        hits[key] = hits.get(key, 0) + 1
    assert len(hits) == sites
    assert chisquare(list(hits.values())).pvalue > 0.001
    if "zero" in spec:
        assert {m >> 32 for key in hits for _, m in key} == {0xFF, 0xFFFF << 16}, "a whole code or the whole scale"
