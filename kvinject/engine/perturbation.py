"""The contract between the engine and error models: what the hook and a context call on the
model a configuration holds, and the noise streams models draw from.

Each model is a small frozen dataclass, parsed from a spec such as ``normal:0,0.25``, and acts in
one of two parts: an :class:`EntryModel` changes a float32 array of K or V rows in place as they
enter the cache (the hook asks ``error.at_entry``), a :class:`CacheResident` changes cells
already in the cache after each decode (the context asks ``error.resident``). Multiplicative
models give a law whose factors the compiled callback computes as it applies them
(kvinject/engine/variates.py); other models that need randomness draw it in large blocks
(``draw``) from a :class:`Draws` stream, so the hook pays for one slice per cache write instead
of one random-number call. The models
themselves, their registry and the spec parser live in kvinject/error_models/.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import MISSING, dataclass, fields
from typing import TYPE_CHECKING, ClassVar, Sequence

import numpy as np

from ..exceptions import SpecError
from ..values import optional, parse_scalar
from .variates import Draws, Variates

if TYPE_CHECKING:
    from .cache.resident_cache import ResidentCache
    from .model import Model, Shape
    from .options import CacheOptions
    from .quant_blocks import BlockFormat
    from .realized_error import Realized
    from .target import Target


class ErrorModel(ABC):
    """One kind of error, in three parts that its users ask for: what it does to a K or V vector
    as it enters the cache (:attr:`at_entry`, an :class:`EntryModel`), what it does to the cells
    already in the cache between decodes (:attr:`resident`, a :class:`CacheResident`), and how
    many bits a compressor producing its values stores (:meth:`bits_per_element`). Besides those:
    its spec, its randomness, and the checks and resolutions a configuration makes before
    anything runs. A model subclasses :class:`EntryModel` or :class:`CacheResident`; one that
    subclasses neither changes nothing (the control, cache-free decoding)."""

    name: ClassVar[str]
    syntax: ClassVar[str]
    summary: ClassVar[str]
    example: ClassVar[str]

    def __init_subclass__(cls, **kwargs: object) -> None:
        # A model written against the old one-class contract (apply on ErrorModel) would be
        # registered, hooked nowhere and silently change nothing.
        super().__init_subclass__(**kwargs)
        for method, part in (("apply", "EntryModel"), ("after_decode", "CacheResident")):
            if hasattr(cls, method) and not any(b.__name__ == part and b.__module__ == __name__ for b in cls.__mro__):
                raise TypeError(f"{cls.__qualname__} defines {method}: subclass {part} (kvinject.error_models), not ErrorModel")

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
    def at_entry(self) -> EntryModel | None:
        """What the hook applies to K/V as they enter the cache; None: nothing."""
        return None

    @property
    def resident(self) -> CacheResident | None:
        """What the context runs on the cache after each decode; None: nothing."""
        return None

    @property
    def injects(self) -> bool:
        """Puts error into the cache, at entry or resident: a context hooks its graph for it."""
        return self.at_entry is not None or self.resident is not None

    @property
    def changes_values(self) -> bool:
        """Changes values of the cache (eviction removes tokens instead, and may stack on a model
        that changes them, kvinject/error_models/composite.py)."""
        return self.injects

    def parts_on(self, target: Target) -> tuple[tuple[ErrorModel, Target], ...]:
        """The models a configuration applies and where each acts: itself on ``target`` (a
        composite: each part on its own)."""
        return ((self, target),)

    def split(self, target: Target) -> tuple[Target, Target]:
        """Where its entry part and its resident part act: both on ``target`` (a composite's
        parts each on their own K/V and layers)."""
        return target, target

    def bits_per_element(self, stored: float, component: str, lengths: Sequence[int] = (), row: int = 0) -> float:
        """Bits per element of K or V (``component``) a compressor producing this model's values
        would store, scales and zero points included, when the cache stores ``stored`` bits per
        element and holds sequences of ``lengths`` tokens (none known: long ones) in rows of
        ``row`` components (0: not known). Noise and faults compress nothing."""
        return stored

    def stream(self, rng: np.random.Generator, span: tuple[int, int, int] | None) -> Draws | None:
        """The random values of one item, drawn from ``rng``; ``span``: how many values the
        item's prompt writes to the targeted sites and how many its generated tokens may write
        after it, and the values of one cache row of them (0 where K's and V's differ; None where
        unknown)."""
        return Draws(self.draw, rng) if self.random else None

    def draw(self, rng: np.random.Generator, n: int) -> np.ndarray:
        raise NotImplementedError(f"{self.name} draws no random values")

    @property
    def random(self) -> bool:
        """Differs from run to run: a configuration holding it is repeated (--runs)."""
        return type(self).draw is not ErrorModel.draw

    @property
    def placed(self) -> bool:
        """Places a fixed number of changes among every value an item writes to the targeted
        layers, so that a narrower selection (--positions, --heads) would lose some."""
        return False

    @property
    def spares_prompt(self) -> bool:
        """Places its changes only after each item's prompt, so that configurations may share
        the prompt's decode (kvinject/engine/cache/prefills.py; each item is checked as it starts)."""
        return False

    def stored(self, cache: CacheOptions, components: str) -> ErrorModel:
        """The model as it acts on the values a cache of these types stores for ``components``
        ("k", "v" or "kv"): itself, or one resolved to the stored format (bit flips); raises
        SpecError where the two do not go together. A configuration holds the model so resolved."""
        return self

    def fit(self, model: Model, cache: CacheOptions) -> ErrorModel:
        """The model as a context of ``model`` applies it: calibrated on the model where it needs
        to be (kvquant's K ranges), itself otherwise."""
        return self

    def span(self, component: str, row: int) -> int:
        """How many consecutive components of a K or V row of ``row`` the model computes together
        (a quantization group, an MX block, a whole row): 1 for a model of each value alone. With
        --heads a span must stay within a KV head, or the heads left out would shape the others."""
        return 1

    def check_target(self, target: Target, cache: CacheOptions) -> None:
        """Refuse, in one line, a target or cache types this model cannot work with: when a
        configuration is parsed, before any model loads. A model that places a fixed number of
        faults would lose those placed outside --positions or --heads."""
        if self.placed and (option := _selecting(target)):
            raise SpecError(
                f"{option} does not apply to '{self.name}', which places its faults among every value of the targeted layers "
                "(those outside would be lost): use bitflip:P with a bit or field"
            )

    def check(self, shape: Shape, target: Target, cache: CacheOptions) -> None:
        """Refuse, in one line, what needs the model's shape besides :meth:`check_target`: each
        group the model computes together (:meth:`span`) must tile the targeted K or V rows, and
        with --heads stay within one KV head."""
        self.check_target(target, cache)
        for component, dim in (("k", shape.head_dim_k), ("v", shape.head_dim_v)):
            row = shape.n_head_kv * dim
            span = self.span(component, row)
            if component not in target.components:
                continue
            if row % span:
                raise SpecError(f"'{self.spec}' computes groups of {span} components, which do not divide the {component.upper()} row of {row}")
            if target.heads is not None and dim % span:
                raise SpecError(
                    f"--heads does not apply to '{self.spec}' on {component.upper()}: it computes {span} components together, "
                    f"across KV heads of {dim} (a group or block that divides {dim} keeps within a head)"
                )


class EntryModel(ErrorModel):
    """A model that changes K/V as they enter the cache, one decode's rows at a time: ``apply``
    in Python, or a ``law`` the compiled callback computes itself (kvinject/engine/graph/hook.py)."""

    @property
    def at_entry(self) -> EntryModel:
        return self

    @abstractmethod
    def apply(self, x: np.ndarray, draws: Draws | None) -> None:
        """Change ``x`` (float32, shape (rows, components)) in place."""

    def apply_at(self, x: np.ndarray, draws: Draws | None, component: str, layer: int) -> None:
        """:meth:`apply` to the K or V rows (``component``) of one layer, for models whose
        parameters differ from layer to layer."""
        self.apply(x, draws)

    @property
    def law(self) -> tuple[float, ...] | None:
        """What the compiled callback computes itself in its pass over host memory, ``(kind,
        ...)``: a factor law of kvinject/engine/variates.py or a rounding (kvinject/engine/callback/rounding.py). None:
        :meth:`apply` runs in Python."""
        return None

    @property
    def device_law(self) -> tuple[float, ...] | None:
        """What the device kernel computes on K/V in GPU memory (kvinject/engine/laws.py): ``law``, or a
        kind only the device computes. None: the values are copied to the host and :meth:`apply` runs there."""
        return self.law

    @property
    def pre_rope(self) -> bool:
        """Change K where RoPE reads it rather than where the cache write does (kvinject/engine/graph/hook.py)."""
        return False

    @property
    def blocks(self) -> BlockFormat | None:
        """The quantized blocks whose bits this model flips in the cache once llama.cpp has
        written them (kvinject/engine/quant_blocks.py); None: it changes K and V as they enter."""
        return None

    @property
    def secded(self) -> bool:
        """The cache's memory is read through SECDED (kvinject/engine/secded.py): faults in the
        blocks of :attr:`blocks` land as that code reads them."""
        return False

    def unchanged(self, x: np.ndarray) -> np.ndarray:
        """The values the realized statistics measure the change from: ``x`` itself, or the
        value a model starts from where it is not ``x`` (bit flips act on the stored format's)."""
        return x

    @property
    def sink_tokens(self) -> int:
        """The first positions of every sequence the model leaves exact (attention sinks)."""
        return 0

    def parts_at(self, component: str, layer: int, row: int) -> tuple[tuple[int, np.ndarray | None], ...]:
        """A composite's parts that change this layer's K or V (rows of ``row``), each by its
        place in the spec with the columns of its heads (None: all), whose realized statistics
        are kept apart; none for a model of its own."""
        return ()


def _selecting(target: Target) -> str | None:
    """The option that narrows the target to some values of K/V as they enter the cache
    (--positions, else --heads), or None."""
    return "--positions" if target.positions is not None else "--heads" if target.heads is not None else None


def _fmt(value: object) -> str:
    if isinstance(value, float):
        return repr(value).removesuffix(".0") if value.is_integer() else repr(value)
    return str(value)


def _convert(model: str, field: str, typ: object, text: str) -> object:
    if isinstance(typ, str):  # annotations are strings here; "int | None" is an optional int
        typ = {"bool": bool, "float": float, "int": int, "str": str}.get(typ.removesuffix(" | None"), typ)
    return parse_scalar(f"'{model}': {field}", optional(typ)[0], text)


class Multiplicative(EntryModel):
    """kv = kv * factor, one random factor per component under ``law`` (kvinject/engine/variates.py),
    which the compiled callback computes as it multiplies."""

    @property
    @abstractmethod
    def law(self) -> tuple[int, float, float]:
        """``(kind, a, b)``, a factor law of kvinject/engine/variates.py."""

    @property
    def random(self) -> bool:
        return True

    def stream(self, rng: np.random.Generator, span: tuple[int, int, int] | None) -> Variates:
        return Variates(self.law, int(rng.integers(0, 2**64, dtype=np.uint64)))

    def apply(self, x: np.ndarray, draws: Draws | Variates | None) -> None:
        x *= draws.take(x.size).reshape(x.shape)


class CacheResident(ErrorModel):
    """A model that changes cells already in the cache after each decode instead of values as
    they enter it: what cannot be decided for one vector alone (KIVI quantizes K over groups of
    tokens and keeps the most recent ones exact until they age out). The hook claims nothing for
    it; the context calls :meth:`check` before it creates its llama context and
    :meth:`after_decode` after every decode (kvinject/engine/cache/resident_cache.py)."""

    @property
    def resident(self) -> CacheResident:
        return self

    @property
    def attention(self) -> bool:
        """Needs each decode's attention weights (:meth:`ResidentCache.attention`)."""
        return False

    @property
    def breaks_at(self) -> str | None:
        """A span a benchmark declares (``context``) at whose end a prompt's decode must stop and
        ask for logits, so that the model acts there, before the rest of the prompt (the
        question) is seen; None: prompts are decoded in pieces of the batch size."""
        return None

    @property
    def queries(self) -> bool:
        """Needs each decode's queries before RoPE (:meth:`ResidentCache.queries`)."""
        return False

    @property
    def hides(self) -> bool:
        """Hides cells from some KV heads of a layer (:meth:`ResidentCache.hide`; flash attention off)."""
        return False

    @property
    def shares_prefill(self) -> bool:
        """Changes nothing before a prompt (or its ``breaks_at`` span) is decoded to its end, so
        that configurations may share that decode (kvinject/engine/cache/prefills.py)."""
        return False

    def check_target(self, target: Target, cache: CacheOptions) -> None:
        """Positions and heads select values of K/V as they enter the cache, which a
        cache-resident model does not change; subclasses add their own refusals after these."""
        if option := _selecting(target):
            raise SpecError(f"{option} does not apply to '{self.name}', which changes cells already in the cache rather than K/V as they enter it")

    @abstractmethod
    def after_decode(self, cache: ResidentCache, grown: list[tuple[int, int, int]]) -> None:
        """Change cells of ``cache``; ``grown`` holds ``(seq, tokens before, tokens after)`` for
        each sequence the decode extended."""


@dataclass(frozen=True)
class NoError(ErrorModel):
    name: ClassVar[str] = "none"
    syntax: ClassVar[str] = "none"
    summary: ClassVar[str] = "Control: no hook is installed and the cache is left alone."
    example: ClassVar[str] = "none"


def changed_nothing(error: ErrorModel, realized: Realized) -> bool | None:
    """Whether ``error``, in a run that realized ``realized``, changed no value of the cache (a
    --positions selection past every prompt): False for models that put no error in it (native
    cache types, cache-free decoding change values elsewhere); None where the statistics cannot
    say, a cache-resident model that accounts no values (eviction removes tokens, changing none)."""
    if not error.injects:
        return False
    k, v = realized.k, realized.v
    if error.resident is not None and k.values + v.values == 0:
        return None
    return k.changed + v.changed == 0


def check_configuration(error: ErrorModel, target: Target, cache: CacheOptions, shape: Shape) -> None:
    """Everything a configuration is checked for against a model's shape, in one place: the
    layers and heads the target names, then the error model's own checks. Configurations call it
    before anything runs; a context made without one calls it too."""
    target.check(shape.n_layer, shape.n_head_kv)
    error.check(shape, target, cache)
