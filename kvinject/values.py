"""Values as users type them, read one way everywhere (error specs, bench options, grids,
lm-eval's --model_args): the one parser of a dataclass field's value.

Python's int() and float() accept more than a user means: "1_000", "nan", "inf", " 5 ".
Here a number is plain decimal (an optional sign, digits, a point, an exponent) and finite.
"""

from __future__ import annotations

import math
import re
import typing
from typing import Any

from .exceptions import SpecError

_BOOL = {"true": True, "on": True, "yes": True, "false": False, "off": False, "no": False}
_INT = re.compile(r"[+-]?[0-9]+")  # ASCII digits: \d also matches the Arabic-Indic ones, which int() reads
_FLOAT = re.compile(r"[+-]?([0-9]+\.?[0-9]*|\.[0-9]+)([eE][+-]?[0-9]+)?")


# Runs of one configuration: every run is listed before the first is made (10^9 runs filled the memory first).
MAX_RUNS = 10_000


def check_runs(name: str, runs: int) -> int:
    """A number of runs per configuration (--runs, a grid's sweep.runs): 1 to MAX_RUNS."""
    if not 1 <= runs <= MAX_RUNS:
        raise SpecError(f"{name} must be between 1 and {MAX_RUNS}, got {runs}")
    return runs


def parse_int(name: str, value: object) -> int:
    """An integer from an int (not a bool) or its decimal text."""
    if isinstance(value, int) and not isinstance(value, bool):
        return value
    if isinstance(value, str) and _INT.fullmatch(value.strip()):
        return int(value)
    raise SpecError(f"{name} must be an integer, got {value!r}")


def parse_float(name: str, value: object) -> float:
    """A finite number from an int or float (not a bool) or its decimal text."""
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        number = float(value)
    elif isinstance(value, str) and _FLOAT.fullmatch(value.strip()):
        number = float(value)
    else:
        raise SpecError(f"{name} must be a number, got {value!r}")
    if not math.isfinite(number):
        raise SpecError(f"{name} must be a finite number, got {value!r}")
    return number


def optional(hint: Any) -> tuple[Any, bool]:
    """The type inside ``X | None``, and whether None is allowed."""
    args = typing.get_args(hint)
    if type(None) in args:
        (inner,) = [a for a in args if a is not type(None)]
        return inner, True
    return hint, False


def parse_scalar(name: str, typ: type, value: object) -> object:
    """A bool, int, float or non-empty str from itself or the text a user typed for it."""
    if typ is bool:
        if isinstance(value, bool):
            return value
        if isinstance(value, str) and value.strip().lower() in _BOOL:
            return _BOOL[value.strip().lower()]
        raise SpecError(f"{name} must be true or false, got {value!r}")
    if typ is int:
        return parse_int(name, value)
    if typ is float:
        return parse_float(name, value)
    if typ is str:
        if isinstance(value, str) and value.strip():
            return value.strip()
        raise SpecError(f"{name} must be a non-empty string, got {value!r}")
    raise TypeError(f"fields of type {typ} are not supported")  # a plug-in author's mistake


def split_list(name: str, value: object) -> list[object]:
    """A comma-separated list as given: ``"a,b"``, a list (``["a", "b"]`` from TOML or Python),
    or repeated flags whose values may hold commas (``["a,b", "c"]``); text items stripped. An
    empty item (``"a,,b"``, a trailing comma) is refused: it is a typo, not a value."""
    given = value if isinstance(value, (list, tuple)) else [value]
    items: list[object] = []
    for part in given:
        pieces = [p.strip() for p in part.split(",")] if isinstance(part, str) else [part]
        if "" in pieces:
            raise SpecError(f"{name} has an empty item in {part!r}: remove the extra comma")
        items += pieces
    return items


def unique(name: str, values: typing.Iterable[Any], key: typing.Callable[[Any], Any] | None = None) -> list[Any]:
    """The values of a list (a comma-separated option, a repeated flag, a grid's list) in order,
    each once: the one check of every list kvinject reads. A value given twice (as its ``key``
    reads it: 1024 and 1024.0, normal:0,.25 and normal:0,0.25) would repeat identical items,
    cells or configurations, whose scores would then count as independent: refused."""
    out: list[Any] = []
    seen: dict[Any, Any] = {}
    for value in values:
        k = value if key is None else key(value)
        if k in seen:
            same = "" if seen[k] == value else f" (as '{seen[k]}')"
            raise SpecError(f"{name} gives '{value}' twice{same}: give each value once")
        seen[k] = value
        out.append(value)
    return out
