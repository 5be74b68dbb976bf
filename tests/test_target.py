import pytest

from kvinject.exceptions import SpecError
from kvinject.target import Target, format_layers, parse_layers


def test_parse_layers_reads_ranges_and_lists() -> None:
    assert parse_layers("0-3,10") == {0, 1, 2, 3, 10}
    assert parse_layers("all") is None and parse_layers(None) is None
    assert format_layers(parse_layers("0-3,10,12-13")) == "0-3,10,12-13"


@pytest.mark.parametrize("text", ["a", "3-1", "-2", "1,,x"])
def test_bad_layers_fail(text: str) -> None:
    with pytest.raises(SpecError):
        parse_layers(text)


def test_target_selects_components_and_layers() -> None:
    t = Target.parse("k", "1")
    assert t.wants("k", 1) and not t.wants("v", 1) and not t.wants("k", 0)
    with pytest.raises(SpecError, match="model has layers 0-1"):
        Target.parse("kv", "2").check(2)
    with pytest.raises(SpecError):
        Target.parse("q")
