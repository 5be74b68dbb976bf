"""Integer and real options read as kvinject reads every number (kvinject/values.py): Typer's
own coercion takes whatever pydantic takes, so that `--runs 1_000` ran a thousand runs and
`--fit-per-mbit nan` was a rate, where a spec field or a grid key refuses them. An option's
`min`/`max` are checked here too, in the words bench options use ("at least 1"), not
pydantic's ("Input should be greater than or equal to 1")."""

from __future__ import annotations

from typing import Any

import typer

from ..exceptions import SpecError
from ..values import parse_float, parse_int

PARSERS = {int: parse_int, float: parse_float}


def strict(command: Any) -> Any:
    """``command`` (Typer's click command) and its subcommands, each integer and real option
    first checked by values.py's parser of its kind; returned for chaining."""
    for param in command.params:
        parse = PARSERS.get(getattr(param, "type_descriptor", None) and param.type_descriptor.annotation)
        if parse is not None:
            param.process_value = _checked(param, param.process_value, parse)
    for sub in getattr(command, "commands", {}).values():
        strict(sub)
    return command


def _checked(param: Any, process: Any, parse: Any) -> Any:
    def process_value(ctx: Any, value: Any) -> Any:
        for text in value if isinstance(value, (list, tuple)) else [value]:
            if isinstance(text, str):
                try:
                    _in_range(param, parse("it", text), text)
                except SpecError as e:
                    raise typer.BadParameter(str(e).removeprefix("it "), ctx=ctx, param=param) from None
        return process(ctx, value)

    return process_value


def _in_range(param: Any, number: float, text: str) -> None:
    if param.min is not None and number < param.min:
        raise SpecError(f"it must be at least {param.min}, got {text.strip()}")
    if param.max is not None and number > param.max:
        raise SpecError(f"it must be at most {param.max}, got {text.strip()}")
