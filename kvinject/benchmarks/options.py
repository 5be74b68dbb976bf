"""A benchmark's options: one frozen dataclass per benchmark.

Its fields (name, type, default, help) are the single source of the benchmark's `kvinject
run` flags, of the keys of its `[bench.NAME]` table in grid files and of its listing in
`kvinject benchmarks`; ``Options.parse`` checks every value, whether it comes as a string
from the command line or as a TOML or Python value, in one place.
"""

from __future__ import annotations

import typing
from dataclasses import Field, dataclass, field, fields
from typing import Any, Mapping

from ..exceptions import SpecError
from ..values import optional, parse_scalar, split_list, unique


def option(
    default: Any,
    help: str,
    *,
    minimum: float | None = None,
    maximum: float | None = None,
    choices: tuple[str, ...] | None = None,
    only: tuple[str, tuple[Any, ...]] | None = None,
) -> Any:
    """A field of an Options dataclass: its default, one line of help, the bounds its value (or
    each element of a tuple value) must keep, and ``only`` = (option, values): it has an effect
    only where that option has one of those values, and is refused where given otherwise."""
    return field(default=default, metadata={"help": help, "minimum": minimum, "maximum": maximum, "choices": choices, "only": only})


@dataclass(frozen=True)
class Options:
    """The options every benchmark has; a benchmark's own Options subclass adds fields."""

    data: str | None = option(None, "Data file, folder or hf:NAME[:CONFIG][@SPLIT]. Default: the bundled set.")
    limit: int | None = option(None, "Items to evaluate (default: all).", minimum=1)

    @classmethod
    def parse(cls, values: Mapping[str, Any], cli: bool = False) -> Options:
        """Options from ``values`` (unknown keys and None left out are errors and defaults);
        ``cli`` names them as flags (--max-tokens) in messages, else as keys (max_tokens)."""
        known = {f.name: f for f in fields(cls)}
        unknown = sorted(set(values) - set(known))
        if unknown:
            raise SpecError(f"has no option {unknown[0]!r} (options: {', '.join(known)})")
        hints = typing.get_type_hints(cls)
        kwargs = {}
        for name, value in values.items():
            if value is not None:
                kwargs[name] = _convert(flag(name) if cli else name, known[name], hints[name], value)
        options = cls(**kwargs)
        for name in kwargs:
            _check_applies(options, name, known[name].metadata.get("only"), flag if cli else str)
        return options

    def given(self) -> dict[str, Any]:
        """The options that differ from their defaults, as a grid's ``[bench.NAME]`` table gives
        them (lists for tuples): what a results store records of a bench."""
        out = {}
        for f in fields(self):
            value = getattr(self, f.name)
            if value != f.default:
                out[f.name] = list(value) if isinstance(value, tuple) else value
        return out


def flag(name: str) -> str:
    return "--" + name.replace("_", "-")


def value_type(options: type[Options], name: str) -> tuple[type, bool]:
    """The scalar type of an option, and whether it takes a list of them."""
    base, _ = optional(typing.get_type_hints(options)[name])
    if typing.get_origin(base) is tuple:
        return typing.get_args(base)[0], True
    return base, False


def metavar(options: type[Options], name: str) -> str:
    """How --help and `kvinject benchmarks` name an option's value: INTEGER, NUMBER, TEXT[,...]."""
    typ, many = value_type(options, name)
    return {int: "INTEGER", float: "NUMBER", bool: "BOOLEAN"}.get(typ, "TEXT") + ("[,...]" if many else "")


def describe(options: type[Options]) -> list[tuple[str, str, str, str]]:
    """(name, value, default, help) of each option, as `kvinject benchmarks` shows them."""
    return [(f.name, metavar(options, f.name), shown_default(f), f.metadata.get("help", "")) for f in fields(options)]


def shown_default(f: Field) -> str:
    return "-" if f.default is None or f.default == () else ",".join(map(str, f.default)) if isinstance(f.default, tuple) else str(f.default)


def _convert(name: str, f: Field, hint: Any, value: Any) -> Any:
    base, _ = optional(hint)
    if typing.get_origin(base) is tuple:
        (element, _) = typing.get_args(base)
        if not isinstance(value, (str, list, tuple)):
            raise SpecError(f"{name} takes a list (comma-separated on the command line), got {value!r}")
        items = tuple(unique(name, [parse_scalar(name, element, p) for p in split_list(name, value)]))
        for item in items:
            _check(name, f, item)
        return items
    converted = parse_scalar(name, base, value)
    _check(name, f, converted)
    return converted


def _number(value: float) -> str:
    return f"{value:g}" if isinstance(value, float) else str(value)  # 100000000, not 1e+08


# A count or size past this reaches llama.cpp's int32 fields or Python's islice as an overflow, not a message.
MAX_INT = 2**31 - 1


def _check_applies(options: Options, name: str, only: tuple[str, tuple[Any, ...]] | None, named: Any) -> None:
    """An option given where it changes nothing (niah's --needles with --family single) was
    accepted and dropped without a word: refused, saying where it applies."""
    if only is None or getattr(options, only[0]) in only[1]:
        return
    other, allowed = only
    if allowed == (None,):
        raise SpecError(f"{named(name)} applies only without {named(other)}, which replaces what it sets: leave one out")
    current = getattr(options, other)
    listed = " or ".join(map(str, allowed)) if len(allowed) < 3 else f"{', '.join(map(str, allowed[:-1]))} or {allowed[-1]}"
    raise SpecError(f"{named(name)} applies only with {named(other)} {listed}, not {current}: leave it out or choose one of those")


def _check(name: str, f: Field, value: Any) -> None:
    minimum, maximum, choices = f.metadata.get("minimum"), f.metadata.get("maximum"), f.metadata.get("choices")
    if maximum is None and isinstance(value, int) and not isinstance(value, bool):
        maximum = MAX_INT
    if minimum is not None and value < minimum:
        raise SpecError(f"{name} must be at least {_number(minimum)}, got {_number(value)}")
    if maximum is not None and value > maximum:
        raise SpecError(f"{name} must be at most {_number(maximum)}, got {_number(value)}")
    if choices is not None and value not in choices:
        raise SpecError(f"{name} must be one of {', '.join(choices)}, got {value!r}")
