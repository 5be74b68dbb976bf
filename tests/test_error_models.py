import numpy as np
import pytest

from kvinject.error_models import REGISTRY, Draws, ErrorModel, parse_error
from kvinject.exceptions import SpecError


def perturb(spec: str, x: np.ndarray, seed: int = 0) -> np.ndarray:
    model = parse_error(spec)
    draws = model.stream(np.random.default_rng(seed), (x.size, 0))  # an item whose prompt wrote all of x
    y = x.copy()
    if model.at_entry is not None:  # a cache-resident model, the control and cache-free decoding change nothing at entry
        model.at_entry.apply(y, draws)
    return y


@pytest.fixture
def x() -> np.ndarray:
    return np.random.default_rng(1).standard_normal((400, 128)).astype(np.float32)


@pytest.mark.parametrize("name", sorted(REGISTRY))
def test_every_model_parses_its_example_and_round_trips(name: str, x: np.ndarray) -> None:
    model = parse_error(REGISTRY[name].example)
    assert model.name == name
    assert parse_error(model.spec) == model
    y = perturb(model.spec, x)
    assert y.shape == x.shape and y.dtype == np.float32
    assert np.array_equal(y, perturb(model.spec, x), equal_nan=True), "same seed must give the same result"
    if model.random:
        assert not np.array_equal(y, perturb(model.spec, x, seed=1), equal_nan=True), "another seed must differ"


def test_normal_relative_error_has_the_spec_moments(x: np.ndarray) -> None:
    rel = (perturb("normal:0.1,0.25", x) - x) / x
    assert rel.mean() == pytest.approx(0.1, abs=0.003)
    assert rel.std() == pytest.approx(0.25, rel=0.01)


def test_uniform_relative_error_stays_in_bounds(x: np.ndarray) -> None:
    rel = (perturb("uniform:-1.5,0.5", x) - x) / x
    assert rel.min() >= -1.5 - 1e-5 and rel.max() <= 0.5 + 1e-5
    assert rel.mean() == pytest.approx(-0.5, abs=0.01)
    assert rel.std() == pytest.approx(2 / np.sqrt(12), rel=0.01)


def test_signflip_flips_the_asked_fraction_and_nothing_else(x: np.ndarray) -> None:
    y = perturb("signflip:0.2", x)
    assert np.array_equal(np.abs(y), np.abs(x))
    assert np.mean(np.sign(y) != np.sign(x)) == pytest.approx(0.2, abs=0.005)


@pytest.mark.parametrize("bits", [2, 4, 8])
def test_quant_puts_each_group_on_a_symmetric_integer_grid(bits: int, x: np.ndarray) -> None:
    y = perturb(f"quant:{bits},group=32", x).reshape(-1, 32)
    g = x.reshape(-1, 32)
    qmax = 2 ** (bits - 1) - 1
    scale = np.abs(g).max(axis=1, keepdims=True) / qmax
    levels = y / scale
    assert np.allclose(levels, np.rint(levels), atol=1e-3)
    assert np.abs(levels).max() <= qmax + 1e-3
    assert np.all(np.abs(y - g) <= scale / 2 + 1e-6)


def test_quant_needs_a_group_that_divides_the_row() -> None:
    with pytest.raises(SpecError, match="does not divide"):
        perturb("quant:4,group=48", np.ones((2, 64), np.float32))


@pytest.mark.parametrize("bits", [0, 7, 23])
def test_mantissa_truncates_to_n_bits(bits: int, x: np.ndarray) -> None:
    y = perturb(f"mantissa:{bits}", x)
    assert np.all(y.view(np.uint32) & ((1 << (23 - bits)) - 1) == 0)
    rel = (y - x) / x
    assert rel.max() <= 0 and rel.min() > -(2.0**-bits)


@pytest.mark.parametrize("field,mask", [("sign", 0x8000), ("exponent", 0x7C00), ("mantissa", 0x03FF)])
def test_bitflip_touches_only_its_field(field: str, mask: int, x: np.ndarray) -> None:
    half = x.astype(np.float16).view(np.uint16)
    flipped = perturb(f"bitflip:0.05,field={field}", x).astype(np.float16).view(np.uint16) ^ half
    assert np.all(flipped & ~np.uint16(mask) == 0)
    bits_per_value = bin(mask).count("1")
    assert np.unpackbits(flipped.view(np.uint8)).sum() / (x.size * bits_per_value) == pytest.approx(0.05, rel=0.05)


@pytest.mark.parametrize(
    "spec,message",
    [
        ("normal:0", "needs a value for 'std'"),
        ("normal:0,abc", "std must be a number"),
        ("normal:0,1_000", "std must be a number, got '1_000'"),
        ("normal:0,inf", "std must be a number, got 'inf'"),
        ("quant:4.0", "bits must be an integer, got '4.0'"),
        ("bitflip:0.1,field=exponent,field=sign", "option 'field' given twice"),
        ("normal:0,-1", "STD must be >= 0"),
        ("uniform:1,-1", "A <= B"),
        ("signflip:1.5", r"P must be in \[0, 1\]"),
        ("quant:4,size=8", "no option 'size'"),
        ("bitflip:0.1,field=top", "field must be one of"),
        ("mantissa:24", "N must be in 0..23"),
        ("normal:0,1,2", "at most 2 values"),
    ],
)
def test_bad_specs_say_what_is_wrong_and_show_the_valid_form(spec: str, message: str) -> None:
    with pytest.raises(SpecError, match=message) as info:
        parse_error(spec)
    assert "valid form" in str(info.value).lower()


@pytest.mark.parametrize("spec,nearest", [("normall:0,1", "normal"), ("normal 0,1", "normal"), ("Kivi2:2", "kivi"), ("gaussian:0,1", None)])
def test_an_unknown_model_is_one_line_naming_the_nearest_and_every_model(spec: str, nearest: str | None) -> None:
    with pytest.raises(SpecError, match=f"unknown error model '{spec.partition(':')[0]}'") as info:
        parse_error(spec)
    message = str(info.value)
    assert "\n" not in message
    assert (f"did you mean {nearest}?" in message) if nearest else ("did you mean" not in message)
    assert message.endswith(f"the models are {', '.join(REGISTRY)} (`kvinject errors` explains them)")


def test_draws_are_independent_of_how_they_are_sliced() -> None:
    # Draws refills its block as the takes require; values one per generator output (float64
    # uniforms) come out the same however they are taken. (The multiplicative models' streams:
    # test_variates.py.)
    a = Draws(lambda rng, n: rng.random(n), np.random.default_rng(3))
    b = Draws(lambda rng, n: rng.random(n), np.random.default_rng(3))
    whole = a.take(200_000)
    parts = np.concatenate([b.take(n) for n in (5, 70_000, 1, 129_994)])
    assert np.array_equal(whole, parts)


def test_specs_that_would_run_less_than_their_label_says_are_refused():
    """faults:K was capped at the values a prompt writes, and evict:streaming,B,sinks=S at B - 1
    sinks, with the label and store key keeping the number asked for."""
    with pytest.raises(SpecError, match="at most 100"):
        parse_error("faults:1000000000,bit=3").stream(np.random.default_rng(0), (100, 0))
    with pytest.raises(SpecError, match="whose generated tokens may write 0 values to the targeted layers: ask for at most 0"):
        parse_error("faults:1,stage=generated").stream(np.random.default_rng(0), (100, 0))
    assert parse_error("faults:100,bit=3").stream(np.random.default_rng(0), (100, 0)).take(100).all()
    with pytest.raises(SpecError, match="at most 3 sinks"):
        parse_error("evict:streaming,4,sinks=8")
    parse_error("evict:streaming,4,sinks=3")
    parse_error("evict:streaming,0.25,sinks=8")  # a ratio's budget depends on the length: capped per sequence, as documented


@pytest.mark.parametrize("name", sorted(REGISTRY))
def test_every_model_acts_at_entry_or_on_the_resident_cache_or_not_at_all(name: str) -> None:
    model = parse_error(REGISTRY[name].example)
    entry, resident = model.at_entry, model.resident
    assert entry is None or resident is None, "one part changes the cache: both would account the same values twice"
    assert model.injects == (entry is not None or resident is not None)
    assert entry in (None, model) and resident in (None, model)
    assert model.injects == (name not in ("none", "recompute"))


def test_a_model_written_against_the_one_class_contract_is_refused_at_definition() -> None:
    with pytest.raises(TypeError, match="defines apply: subclass EntryModel"):

        class Halve(ErrorModel):
            def apply(self, x, draws):
                x *= 0.5

    with pytest.raises(TypeError, match="defines after_decode: subclass CacheResident"):

        class Forget(ErrorModel):
            def after_decode(self, cache, grown):
                pass
