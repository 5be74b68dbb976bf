"""The error-model base: the registry, spec parsing, and the noise streams models draw from.

Each model is a small frozen dataclass registered under a name, parsed from a spec such as
``normal:0,0.25`` and applied in place to a float32 array of K or V rows. Multiplicative
models give a law whose factors the compiled callback computes as it applies them
(kvinject/variates.py); other models that need randomness draw it in large blocks (``draw``)
from a :class:`Draws` stream, so the hook pays for one slice per cache write instead of one
random-number call.
"""

from __future__ import annotations

import difflib
from abc import ABC, abstractmethod
from dataclasses import MISSING, fields
from typing import TYPE_CHECKING, Callable, ClassVar, Sequence

import numpy as np

from ..exceptions import SpecError
from ..values import parse_float, parse_int
from ..variates import Variates

if TYPE_CHECKING:
    from ..model import Model
    from ..options import CacheOptions
    from ..resident import ResidentCache
    from ..target import Target

REGISTRY: dict[str, type[ErrorModel]] = {}

# Values drawn per refill: large enough that drawing is one numpy call per many decodes,
# small enough to stay in cache.
BLOCK = 1 << 16


def register(cls: type[ErrorModel]) -> type[ErrorModel]:
    REGISTRY[cls.name] = cls
    return cls


class Draws:
    """A reproducible stream of random values, generated in blocks by ``draw(rng, n)``."""

    def __init__(self, draw: Callable[[np.random.Generator, int], np.ndarray], rng: np.random.Generator):
        self._draw = draw
        self._rng = rng
        self._block = draw(rng, BLOCK)
        self._pos = 0

    def block(self, n: int) -> np.ndarray:
        """The next ``n`` values (as :meth:`Variates.block`)."""
        return self.take(n)

    def take(self, n: int) -> np.ndarray:
        if self._pos + n <= len(self._block):
            out = self._block[self._pos : self._pos + n]
            self._pos += n
            return out
        rest = self._block[self._pos :]
        fresh = self._draw(self._rng, max(BLOCK, n - len(rest)))
        out = np.concatenate([rest, fresh[: n - len(rest)]])
        self._block, self._pos = fresh, n - len(rest)
        return out


class ErrorModel(ABC):
    """One kind of error. Subclasses set ``name``, ``syntax`` and ``summary`` and implement
    ``apply``; those that need randomness also implement ``draw``."""

    name: ClassVar[str]
    syntax: ClassVar[str]
    summary: ClassVar[str]
    example: ClassVar[str]

    @classmethod
    def parse(cls, args: list[str], options: dict[str, str]) -> ErrorModel:
        """Positional args fill the dataclass fields in order; options are ``key=value``."""
        names = [f.name for f in fields(cls)]
        if len(args) > len(names):
            raise SpecError(f"'{cls.name}' takes at most {len(names)} values, got {len(args)}")
        values: dict[str, str] = dict(zip(names, args))
        for key, value in options.items():
            if key not in names:
                raise SpecError(f"'{cls.name}' has no option '{key}' (options: {', '.join(names)})")
            if key in values:
                raise SpecError(f"'{cls.name}': '{key}' given twice")
            values[key] = value
        kwargs = {}
        for f in fields(cls):
            if f.name not in values:
                if f.default is not MISSING:
                    continue
                raise SpecError(f"'{cls.name}' needs a value for '{f.name}'")
            kwargs[f.name] = _convert(cls.name, f.name, f.type, values[f.name])
        return cls(**kwargs)

    @property
    def spec(self) -> str:
        """The canonical spec string, parseable back into an equal model."""
        # Fields with a default (options such as group=, field=) are written as key=value; an
        # option whose default is None only when given, so that adding one changes no spec.
        values = ",".join(
            _fmt(getattr(self, f.name)) if f.default is MISSING else f"{f.name}={_fmt(getattr(self, f.name))}"
            for f in fields(self)
            if not (f.default is None and getattr(self, f.name) is None)
        )
        return f"{self.name}:{values}" if values else self.name

    @property
    def injects(self) -> bool:
        return True

    def bits_per_element(self, stored: float, component: str, lengths: Sequence[int] = (), row: int = 0) -> float:
        """Bits per element of K or V (``component``) a compressor producing this model's values
        would store, scales and zero points included, when the cache stores ``stored`` bits per
        element and holds sequences of ``lengths`` tokens (none known: long ones) in rows of
        ``row`` components (0: not known). Noise and faults compress nothing."""
        return stored

    @property
    def pre_rope(self) -> bool:
        """Change K where RoPE reads it rather than where the cache write does (kvinject/hook.py)."""
        return False

    @property
    def cache_free(self) -> bool:
        """Generate without reusing cached K/V (kvinject/recompute.py)."""
        return False

    @property
    def law(self) -> tuple[float, ...] | None:
        """What the compiled callback computes itself in its pass over host memory, ``(kind,
        ...)``: a factor law of kvinject/variates.py or a rounding (kvinject/rounding.py). None:
        :meth:`apply` runs in Python."""
        return None

    def stream(self, rng: np.random.Generator, horizon: int | None) -> Draws | None:
        """The random values of one item, drawn from ``rng``; ``horizon``: how many values the
        item's prompt writes to the targeted sites (None where unknown)."""
        return Draws(self.draw, rng) if self.random else None

    def draw(self, rng: np.random.Generator, n: int) -> np.ndarray:
        raise NotImplementedError(f"{self.name} draws no random values")

    @property
    def random(self) -> bool:
        return type(self).draw is not ErrorModel.draw

    @abstractmethod
    def apply(self, x: np.ndarray, draws: Draws | None) -> None:
        """Change ``x`` (float32, shape (rows, components)) in place."""

    def apply_at(self, x: np.ndarray, draws: Draws | None, component: str, layer: int) -> None:
        """:meth:`apply` to the K or V rows (``component``) of one layer, for models whose
        parameters differ from layer to layer."""
        self.apply(x, draws)

    def stored(self, cache: CacheOptions, components: str) -> ErrorModel:
        """The model as it acts on the values a cache of these types stores for ``components``
        ("k", "v" or "kv"): itself, or one resolved to the stored format (bit flips); raises
        SpecError where the two do not go together. A configuration holds the model so resolved."""
        return self

    def fit(self, model: Model, cache: CacheOptions) -> ErrorModel:
        """The model as a context of ``model`` applies it: calibrated on the model where it needs
        to be (kvquant's K ranges), itself otherwise."""
        return self

    def unchanged(self, x: np.ndarray) -> np.ndarray:
        """The values the realized statistics measure the change from: ``x`` itself, or the
        value a model starts from where it is not ``x`` (bit flips act on the stored format's)."""
        return x

    @property
    def sink_tokens(self) -> int:
        """The first positions of every sequence the model leaves exact (attention sinks)."""
        return 0

    def span(self, component: str, row: int) -> int:
        """How many consecutive components of a K or V row of ``row`` the model computes together
        (a quantization group, an MX block, a whole row): 1 for a model of each value alone. With
        --heads a span must stay within a KV head, or the heads left out would shape the others."""
        return 1

    @property
    def placed(self) -> bool:
        """Places a fixed number of changes among every value an item writes to the targeted
        layers, so that a narrower selection (--positions, --heads) would lose some."""
        return False


def row_groups(x: np.ndarray, size: int, what: str) -> np.ndarray:
    """``x``'s rows cut into groups of ``size`` components, a view (``what``: the model's name
    and option, for the error when ``size`` does not divide a row)."""
    if x.shape[1] % size:
        raise SpecError(f"{what} {size} does not divide the row length {x.shape[1]}")
    return x.reshape(-1, size)


def _fmt(value: object) -> str:
    if isinstance(value, float):
        return repr(value).removesuffix(".0") if value.is_integer() else repr(value)
    return str(value)


def _convert(model: str, field: str, typ: object, text: str) -> object:
    if isinstance(typ, str):  # annotations are strings here; "int | None" is an optional int
        typ = {"float": float, "int": int, "str": str}.get(typ.removesuffix(" | None"), typ)
    if typ is int:
        return parse_int(f"'{model}': {field}", text)
    if typ is float:
        return parse_float(f"'{model}': {field}", text)
    return text


class Multiplicative(ErrorModel):
    """kv = kv * factor, one random factor per component under ``law`` (kvinject/variates.py),
    which the compiled callback computes as it multiplies."""

    @property
    @abstractmethod
    def law(self) -> tuple[int, float, float]:
        """``(kind, a, b)``, a factor law of kvinject/variates.py."""

    @property
    def random(self) -> bool:
        return True

    def stream(self, rng: np.random.Generator, horizon: int | None) -> Variates:
        return Variates(self.law, int(rng.integers(0, 2**64, dtype=np.uint64)))

    def apply(self, x: np.ndarray, draws: Draws | Variates | None) -> None:
        x *= draws.take(x.size).reshape(x.shape)


class CacheResident(ErrorModel):
    """A model that changes cells already in the cache after each decode instead of values as
    they enter it: what cannot be decided for one vector alone (KIVI quantizes K over groups of
    tokens and keeps the most recent ones exact until they age out). The hook claims nothing for
    it; the context calls :meth:`check` before it creates its llama context and
    :meth:`after_decode` after every decode (kvinject/resident.py)."""

    def apply(self, x: np.ndarray, draws: Draws | None) -> None:
        """Nothing happens at entry."""

    @property
    def attention(self) -> bool:
        """Needs each decode's attention weights (:meth:`ResidentCache.attention`)."""
        return False

    def check_target(self, target: Target, cache: CacheOptions) -> None:
        """Refuse, in one line, a target or cache this transform cannot work with: when a
        configuration is parsed, before anything runs (and again by :meth:`check`)."""

    def check(self, model: Model, target: Target, cache: CacheOptions) -> None:
        """Refuse, in one line, a model, target or cache this transform cannot work on."""
        self.check_target(target, cache)

    @abstractmethod
    def after_decode(self, cache: ResidentCache, grown: list[tuple[int, int, int]]) -> None:
        """Change cells of ``cache``; ``grown`` holds ``(seq, tokens before, tokens after)`` for
        each sequence the decode extended."""


def parse_error(spec: str) -> ErrorModel:
    """Parse ``NAME[:V1,V2,...,key=value]`` into a registered error model."""
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
