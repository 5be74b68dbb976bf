"""The error models' registry and the parser of their specs (``NAME[:V1,V2,...,key=value]``);
the contract models implement is kvinject/engine/perturbation.py."""

from __future__ import annotations

import difflib

import numpy as np

from ..engine.perturbation import ErrorModel
from ..exceptions import SpecError
from .composite import Composite, Part, is_composite, parse_where, split_parts

REGISTRY: dict[str, type[ErrorModel]] = {}


def register(cls: type[ErrorModel]) -> type[ErrorModel]:
    """Register ``cls`` under its name; a name already taken is refused (a plug-in must not
    replace a model whose results stores already hold under that name)."""
    taken = REGISTRY.get(cls.name)
    if taken is not None and taken is not cls:
        raise SpecError(f"the error model name '{cls.name}' is taken by {taken.__module__}.{taken.__qualname__}")
    REGISTRY[cls.name] = cls
    return cls


def row_groups(x: np.ndarray, size: int, what: str) -> np.ndarray:
    """``x``'s rows cut into groups of ``size`` components, a view (``what``: the model's name
    and option, for the error when ``size`` does not divide a row)."""
    if x.shape[1] % size:
        raise SpecError(f"{what} {size} does not divide the row length {x.shape[1]}")
    return x.reshape(-1, size)


def parse_error(spec: str) -> ErrorModel:
    """Parse ``NAME[:V1,V2,...,key=value]`` into a registered error model, or a composite's
    parts joined by ``+`` (kvinject/error_models/composite.py) into a :class:`Composite`."""
    if is_composite(spec):
        return Composite(tuple(Part(_parse_one(error), parse_where(spec, where)) for error, where in split_parts(spec)))
    return _parse_one(spec)


def _parse_one(spec: str) -> ErrorModel:
    name, _, rest = spec.strip().partition(":")
    cls = REGISTRY.get(name.strip().lower())
    if cls is None:
        close = difflib.get_close_matches(name.strip().lower(), REGISTRY, n=1)
        hint = f"did you mean {close[0]}? " if close else ""
        raise SpecError(f"unknown error model '{name}' in '{spec}': {hint}the models are {', '.join(REGISTRY)} (`kvinject errors` explains them)")
    args: list[str] = []
    options: dict[str, str] = {}
    for part in filter(None, (p.strip() for p in rest.split(","))) if rest.strip() else ():
        if "=" in part:
            key, _, value = part.partition("=")
            if key.strip() in options:
                raise SpecError(f"bad error spec '{spec}': option '{key.strip()}' given twice\nvalid form: {cls.syntax} (e.g. {cls.example})")
            options[key.strip()] = value.strip()
        elif options:
            raise SpecError(f"'{spec}': positional value '{part}' after key=value options")
        else:
            args.append(part)
    try:
        return cls.parse(args, options)
    except SpecError as e:
        raise SpecError(f"bad error spec '{spec}': {e}\nvalid form: {cls.syntax} (e.g. {cls.example})") from None
