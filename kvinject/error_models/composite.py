"""Composite configurations: several error models in one run, each on its own part of the cache.

A composite spec joins parts with ``+``; each part is an error spec with, in brackets, where it
acts: ``kivi:2[k]+float:e4m3[v]`` (KIVI on the keys, e4m3 on the values),
``quant:8[kv:0-3]+quant:3[kv:4-29]`` (layers 0-3 kept at 8 bits), ``quant:4[v:all heads:0]``,
``kivi:2+evict:knorm,0.5`` (KIVI, then eviction). A part without brackets covers K and V of
every layer. ``--positions`` applies to every part.

Order is stated by the spec: models that change values as K/V enter the cache act then, before
cache-resident ones, which act after each decode in the order written. Two parts that change
values may not share a value (which would act first, and what would the bits be?); eviction,
which removes tokens and changes none, stacks on any part. Each part changes its values exactly
as it does alone on its target: the engine hands a composite's entry parts only their own
K/V writes (:meth:`Composite.split`) and runs its resident parts each on its own cells.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, ClassVar, Sequence

import numpy as np

from ..engine.perturbation import CacheResident, EntryModel, ErrorModel
from ..engine.target import Target, format_indices
from ..exceptions import SpecError

if TYPE_CHECKING:
    from ..engine.cache.resident_cache import ResidentCache
    from ..engine.model import Model, Shape
    from ..engine.options import CacheOptions
    from ..engine.variates import Draws

# A ``+`` that starts a part: one before a model's name, not an exponent's sign (1e+3).
_JOIN = re.compile(r"\+(?=\s*[A-Za-z])")
_PART = re.compile(r"(?P<error>[^\[\]]*?)\s*(?:\[(?P<where>[^\[\]]*)\])?\s*")


def is_composite(spec: str) -> bool:
    """Whether ``spec`` is written as a composite (parts, or one part with brackets)."""
    return "[" in spec or len(_JOIN.split(spec)) > 1


def split_parts(spec: str) -> list[tuple[str, str | None]]:
    """``spec``'s parts, each (error spec, what its brackets hold or None)."""
    parts = []
    for text in _JOIN.split(spec):
        m = _PART.fullmatch(text)
        if m is None or not m["error"].strip():
            raise SpecError(f"bad composite '{spec}': write each part as ERROR or ERROR[k|v|kv:LAYERS heads:HEADS], joined by +, e.g. {Composite.example}")
        parts.append((m["error"].strip(), m["where"]))
    return parts


def parse_where(spec: str, where: str | None) -> Target:
    """A part's target from its brackets: ``k``, ``v`` or ``kv``, then ``:LAYERS``, then
    ``heads:HEADS`` after a space."""
    if where is None:
        return Target()
    first, *rest = where.split() or [""]
    components, _, layers = first.partition(":")
    heads = None
    for word in rest:
        key, sep, value = word.partition(":")
        if key != "heads" or not sep or heads is not None:
            raise SpecError(f"bad composite '{spec}': in [{where}], after K/V and layers only heads:HEADS may follow, e.g. [k:0-3 heads:0,1]")
        heads = value
    if components.strip().lower() not in ("k", "v", "kv"):
        raise SpecError(f"bad composite '{spec}': [{where}] must start with k, v or kv, e.g. [v] or [kv:0-3]")
    try:
        return Target.parse(components, layers or None, None, heads)
    except SpecError as e:
        raise SpecError(f"bad composite '{spec}': in [{where}]: {e}") from None


def format_where(target: Target) -> str:
    """Inverse of :func:`parse_where`; empty for K and V of every layer."""
    if target == Target():
        return ""
    layers = "" if target.layers is None else f":{format_indices(target.layers)}"
    heads = "" if target.heads is None else f" heads:{target.heads_spec}"
    return f"[{target.components}{layers}{heads}]"


@dataclass(frozen=True)
class Part:
    error: ErrorModel
    target: Target  # components, layers and heads; positions are the configuration's

    @property
    def spec(self) -> str:
        return f"{self.error.spec}{format_where(self.target)}"

    def on(self, target: Target) -> Target:
        """This part's target with the configuration's positions."""
        return replace(self.target, positions=target.positions)

    def meets(self, other: Part) -> bool:
        """Whether the two parts' targets share a value: a component, a layer and a head."""
        a, b = self.target, other.target
        return (
            bool(set(a.components) & set(b.components))
            and (a.layers is None or b.layers is None or bool(a.layers & b.layers))
            and (a.heads is None or b.heads is None or bool(a.heads & b.heads))
        )


@dataclass(frozen=True)
class Composite(ErrorModel):
    """Several error models, each on its own part of the cache (see the module's docstring)."""

    parts: tuple[Part, ...]
    n_head_kv: int = field(default=0, compare=False)  # the model's, once fitted to it (heads split rows by it)
    name: ClassVar[str] = "composite"
    syntax: ClassVar[str] = "ERROR[k|v|kv:LAYERS heads:HEADS]+ERROR[...]+..."
    summary: ClassVar[str] = (
        "Several models in one configuration, each on the K/V, layers and heads in its brackets (none: all): values change as they enter "
        "the cache, then cache-resident models act in the order written. Parts that change values may not share one; eviction stacks on any."
    )
    example: ClassVar[str] = "kivi:2[k]+float:e4m3[v]"

    def __post_init__(self) -> None:
        if not self.parts:
            raise SpecError("a composite needs at least one part")
        for part in self.parts:
            self._check_part(part)
        values = [p for p in self.parts if p.error.changes_values]
        for i, a in enumerate(values):
            for b in values[i + 1 :]:
                if a.meets(b):
                    raise SpecError(
                        f"'{a.spec}' and '{b.spec}' both change the same values of the cache: give each part its own K/V, layers or heads "
                        "(only eviction, which removes tokens, stacks on another part)"
                    )
        resident = [p.error for p in self.parts if p.error.resident is not None]
        if any(not m.changes_values for m in resident) and (edits := next((m for m in resident if m.changes_values), None)):
            raise SpecError(
                f"'{edits.name}' changes cached values in blocks of consecutive tokens, which eviction would break: "
                "stack eviction on models that change K/V as they enter the cache (quant, float, kvquant)"
            )
        if sum(p.error.random for p in self.parts) > 1:
            raise SpecError(f"'{self.spec}': at most one part may draw random values (the item's one stream feeds it)")
        entries = [p for p in self.parts if p.error.at_entry is not None]
        if len({p.error.at_entry.sink_tokens for p in entries}) > 1:
            raise SpecError(f"'{self.spec}': the parts leave different attention sinks exact, which a composite cannot combine: give them the same")
        on_k = [p for p in entries if "k" in p.target.components]
        if len({p.error.at_entry.pre_rope for p in on_k}) > 1:
            raise SpecError(f"'{self.spec}': some parts change K before RoPE and others after, which a composite cannot combine")
        if len({p.error.resident.breaks_at for p in self.parts if p.error.resident is not None} - {None}) > 1:
            raise SpecError(f"'{self.spec}': its cache-resident parts stop prompts at different spans")

    @staticmethod
    def _check_part(part: Part) -> None:
        error = part.error
        if isinstance(error, Composite):
            raise SpecError(f"'{part.spec}': a composite's part is one error model")
        if not error.injects:
            raise SpecError(f"'{error.spec}' puts no error in the cache: leave it out of the composite (the cache types go after @, at the end)")
        entry = error.at_entry
        if error.placed or (entry is not None and (entry.blocks is not None or type(entry).unchanged is not EntryModel.unchanged)):
            raise SpecError(f"'{error.spec}' flips bits of the stored values, which a composite does not combine: run fault models on their own")

    @property
    def spec(self) -> str:
        return "+".join(p.spec for p in self.parts)

    def parts_on(self, target: Target) -> tuple[tuple[ErrorModel, Target], ...]:
        return tuple((p.error, p.on(target)) for p in self.parts)

    def split(self, target: Target) -> tuple[Target, Target]:
        return covering(self.parts, "at_entry", target), covering(self.parts, "resident", target)

    def covers(self) -> Target:
        """The union of the parts' targets: every K or V of a layer some part acts on."""
        components = "".join(c for c in "kv" if any(c in p.target.components for p in self.parts))
        layers = [p.target.layers for p in self.parts]
        return Target(components, None if None in layers else frozenset().union(*layers))

    @property
    def at_entry(self) -> EntryModel | None:
        places = tuple(i for i, p in enumerate(self.parts) if p.error.at_entry is not None)
        return EntryParts(tuple(self.parts[i] for i in places), self.n_head_kv, places) if places else None

    @property
    def resident(self) -> CacheResident | None:
        places = tuple(i for i, p in enumerate(self.parts) if p.error.resident is not None)
        return ResidentParts(tuple(self.parts[i] for i in places), len(places) == len(self.parts), places) if places else None

    @property
    def random(self) -> bool:
        return any(p.error.random for p in self.parts)

    def stream(self, rng: np.random.Generator, span: tuple[int, int, int] | None) -> Draws | None:
        return next((p.error.stream(rng, span) for p in self.parts if p.error.random), None)

    def stored(self, cache: CacheOptions, components: str) -> ErrorModel:
        return Composite(tuple(replace(p, error=p.error.stored(cache, p.target.components)) for p in self.parts))

    def fit(self, model: Model, cache: CacheOptions) -> ErrorModel:
        return Composite(tuple(replace(p, error=p.error.fit(model, cache)) for p in self.parts), model.n_head_kv)

    def check_target(self, target: Target, cache: CacheOptions) -> None:
        for part in self.parts:
            part.error.check_target(part.on(target), cache)

    def check(self, shape: Shape, target: Target, cache: CacheOptions) -> None:
        for part in self.parts:
            part.target.check(shape.n_layer, shape.n_head_kv)
            part.error.check(shape, part.on(target), cache)


def covering(parts: Sequence[Part], kind: str, target: Target) -> Target:
    """The engine's target for the parts of ``kind`` (``at_entry`` or ``resident``): the K/V of
    each layer one of them acts on, with the configuration's positions."""
    chosen = [p.target for p in parts if getattr(p.error, kind) is not None]
    cells = frozenset((c, il) for t in chosen for c in t.components for il in (t.layers if t.layers is not None else (None,)))
    return Target("kv", None, target.positions, None, cells)


@dataclass(frozen=True)
class EntryParts(EntryModel):
    """What a composite does to K/V as they enter the cache: each write handed to the one part
    that acts on its component and layer, and only its heads changed."""

    parts: tuple[Part, ...]
    n_head_kv: int  # the model's, which the parts' heads split a row by
    places: tuple[int, ...]  # each part's place in the composite's spec
    name: ClassVar[str] = "composite"

    def apply(self, x: np.ndarray, draws: Draws | None) -> None:
        raise TypeError("a composite changes each layer's K or V by its part: call apply_at")

    def apply_at(self, x: np.ndarray, draws: Draws | None, component: str, layer: int) -> None:
        for part in self.parts:
            if not part.target.wants(component, layer):
                continue
            columns = part.target.columns(x.shape[1], self.n_head_kv)
            before = x[:, ~columns].copy() if columns is not None else None
            part.error.at_entry.apply_at(x, draws, component, layer)
            if columns is not None:  # the heads left out get their values back, as --heads does
                x[:, ~columns] = before

    def parts_at(self, component: str, layer: int, row: int) -> tuple[tuple[int, np.ndarray | None], ...]:
        return tuple((i, p.target.columns(row, self.n_head_kv)) for i, p in zip(self.places, self.parts) if p.target.wants(component, layer))

    @property
    def random(self) -> bool:
        return any(p.error.random for p in self.parts)

    @property
    def pre_rope(self) -> bool:
        return any(p.error.at_entry.pre_rope for p in self.parts)

    @property
    def sink_tokens(self) -> int:
        return self.parts[0].error.at_entry.sink_tokens


@dataclass(frozen=True)
class ResidentParts(CacheResident):
    """What a composite does to the cache after each decode: each cache-resident part in the
    order written, on its own K/V and layers."""

    parts: tuple[Part, ...]
    alone: bool  # no part changes values as they enter the cache
    places: tuple[int, ...]  # each part's place in the composite's spec
    name: ClassVar[str] = "composite"

    def after_decode(self, cache: ResidentCache, grown: list[tuple[int, int, int]]) -> None:
        for i, part in zip(self.places, self.parts):
            with cache.acting(i, part.target):
                part.error.resident.after_decode(cache, grown)

    @property
    def attention(self) -> bool:
        return any(p.error.resident.attention for p in self.parts)

    @property
    def queries(self) -> bool:
        return any(p.error.resident.queries for p in self.parts)

    @property
    def hides(self) -> bool:
        return any(p.error.resident.hides for p in self.parts)

    @property
    def breaks_at(self) -> str | None:
        return next((p.error.resident.breaks_at for p in self.parts if p.error.resident.breaks_at), None)

    @property
    def shares_prefill(self) -> bool:
        return self.alone and all(p.error.resident.shares_prefill for p in self.parts)

    @property
    def random(self) -> bool:
        return any(p.error.random for p in self.parts)
