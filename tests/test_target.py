import pytest

from kvinject.engine.target import Target, format_indices, parse_heads, parse_layers
from kvinject.exceptions import SpecError


def test_parse_layers_reads_ranges_and_lists() -> None:
    assert parse_layers("0-3,10") == {0, 1, 2, 3, 10}
    assert parse_layers("all") is None and parse_layers(None) is None
    assert format_indices(parse_layers("0-3,10,12-13")) == "0-3,10,12-13"


@pytest.mark.parametrize(
    "text,message",
    [
        ("a", "use layer numbers and ranges"),
        ("3-1", "'3-1' counts down: write 1-3"),
        ("-2", "use layer numbers and ranges"),
        ("1,,x", "empty item in .1,,x."),
        ("2,0-3,2", "gives .2. twice"),
    ],
)
def test_bad_layers_fail(text: str, message: str) -> None:
    with pytest.raises(SpecError, match=message):
        parse_layers(text)


def test_target_selects_components_and_layers() -> None:
    t = Target.parse("k", "1")
    assert t.wants("k", 1) and not t.wants("v", 1) and not t.wants("k", 0)
    with pytest.raises(SpecError, match="model has layers 0-1"):
        Target.parse("kv", "2").check(2, 1)
    with pytest.raises(SpecError, match="target must be one of kv, k, v, got 'q'"):
        Target.parse("q")


def test_heads_select_the_components_of_their_head() -> None:
    assert parse_heads("0,2") == {0, 2} and parse_heads("all") is None
    t = Target.parse("kv", heads="0,2")
    # 3 KV heads of 4 components each, laid out head after head as llama.cpp's K rows.
    assert t.columns(12, 3).tolist() == [True] * 4 + [False] * 4 + [True] * 4
    assert Target().columns(12, 3) is None
    assert t.columns(6, 3).tolist() == [True, True, False, False, True, True], "V's heads may be narrower than K's"
    assert t.share(3) == 2 / 3 and Target().share(3) == 1
    with pytest.raises(SpecError, match="model has KV heads 0-1"):
        t.check(4, 2)
    with pytest.raises(SpecError, match="bad --heads '1-x'"):
        parse_heads("1-x")
