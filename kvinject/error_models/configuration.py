"""A configuration: one error model, where it applies, and how the cache stores K and V."""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any

from ..engine.model import Shape
from ..engine.options import CACHE_TYPES, CacheOptions
from ..engine.perturbation import ErrorModel, Multiplicative, NoError, check_configuration
from ..engine.target import Target
from ..engine.variates import GENERATOR
from ..exceptions import SpecError
from ..values import unique
from .composite import Composite, format_where
from .registry import parse_error


@dataclass(frozen=True)
class Configuration:
    error: ErrorModel = field(default_factory=NoError)
    target: Target = field(default_factory=Target)
    cache: CacheOptions = field(default_factory=CacheOptions)

    @classmethod
    def parse(cls, spec: str, target: Target | None = None, cache: CacheOptions | None = None) -> Configuration:
        """``ERROR[@K[/V]]``: an error spec, optionally with the cache types of this configuration
        (``none@f32``: an f32 control; ``none@q8_0``: llama.cpp's q8_0 cache; ``none@f16/q8_0``)."""
        error, at, types = spec.rpartition("@") if "@" in spec else (spec, "", "")
        if not error.strip():
            raise SpecError(f"'{spec}': give an error model before the cache types (none@f16: the control with an f16 cache)")
        cache = cache or CacheOptions()
        if at:
            type_k, _, type_v = (t.strip() for t in types.partition("/"))
            if type_k not in CACHE_TYPES or (type_v or type_k) not in CACHE_TYPES:  # not --cache-type-k/v, as CacheOptions would say
                raise SpecError(f"'{spec}': after @ give the cache types as K or K/V, each one of {', '.join(CACHE_TYPES)}")
            cache = replace(cache, type_k=type_k, type_v=type_v or type_k)
        model = parse_error(error)
        if isinstance(model, Composite):
            model, target = _composite(model, target or Target())
        else:
            target = (target or Target()) if model.injects else Target()  # no error, no target
        model.check_target(target, cache)
        model = model.stored(cache, target.components)
        return cls(model, target, cache)

    @property
    def cache_free(self) -> bool:
        """Decoded without reusing cached K/V (``recompute``): each token's logits from one pass
        over its prefix (kvinject/engine/generation/decoding.py)."""
        from .recompute import Recompute  # here: imported with this module, it would register first, and `kvinject errors` lists in module order

        return isinstance(self.error, Recompute)

    def check(self, shape: Shape) -> None:
        """Fail, in one line, where a model of this shape cannot run the configuration: layers or
        KV heads the target names that it lacks, or what the error model needs of it."""
        check_configuration(self.error, self.target, self.cache, shape)

    @property
    def spec(self) -> str:
        """The error spec that names this configuration with its target in brackets
        (kvinject/error_models/composite.py), positions and cache types aside: a composite's own."""
        if isinstance(self.error, Composite) or not self.error.injects:
            return self.error.spec
        return f"{self.error.spec}{format_where(replace(self.target, positions=None))}"

    @property
    def label(self) -> str:
        """``ERROR [target:layers pos:POSITIONS heads:HEADS] @K/V``; the target, positions, heads and
        cache types only when not the defaults (every layer, position and head of K and V, f16 cache)."""
        t = self.target
        positions = "" if t.positions is None else f" pos:{t.positions.spec}"
        heads = "" if t.heads is None else f" heads:{t.heads_spec}"
        where = "" if not self.error.injects or t == Target() else f" [{t.components}:{t.layers_spec}{positions}{heads}]"
        if isinstance(self.error, Composite):  # its parts name their own targets
            where = "" if t.positions is None else f" [{positions.strip()}]"
        k, v = self.cache.type_k, self.cache.type_v
        types = "" if k == v == "f16" else f" @{k}" if k == v else f" @{k}/{v}"
        return f"{self.error.spec}{where}{types}"

    def label_beside(self, control: Configuration) -> str:
        """The label as a table shows it beside ``control``'s: the f16 cache that labels leave
        out is named where the control's is another (``none`` beside ``none @f32``, the control,
        read as the control itself)."""
        default = ("f16", "f16")
        if (self.cache.type_k, self.cache.type_v) == default != (control.cache.type_k, control.cache.type_v):
            return f"{self.label} @f16"
        return self.label

    @classmethod
    def from_dict(cls, settings: dict[str, Any]) -> Configuration:
        """The configuration a record's settings (:meth:`to_dict`) describe."""
        target = Target.parse(settings["target"], settings["layers"], settings.get("positions"), settings.get("heads"))
        return cls(parse_error(settings["error"]), target, CacheOptions(**settings["cache"]))

    def to_dict(self) -> dict[str, object]:
        return {
            "error": self.error.spec,
            "target": self.target.components,
            "layers": self.target.layers_spec,
            # Only when given: the records and store keys of configurations without stay as they were.
            **({"positions": self.target.positions.spec} if self.target.positions is not None else {}),
            **({"heads": self.target.heads_spec} if self.target.heads is not None else {}),
            "cache": self.cache.to_dict(),
            # The factors of a multiplicative model depend on the generator: a store does not mix
            # results of two generators under one key.
            **({"noise": GENERATOR} if any(isinstance(m, Multiplicative) for m, _ in self.error.parts_on(self.target)) else {}),
        }


def _composite(model: Composite, target: Target) -> tuple[ErrorModel, Target]:
    """A composite and its target: the union of its parts' with the configuration's positions;
    one part is that model on its target (``quant:4[k]`` is ``quant:4`` with ``--target k``)."""
    if replace(target, positions=None) != Target():
        raise SpecError(
            f"'{model.spec}' names each part's K/V, layers and heads in its brackets: leave out --target, --layers and --heads "
            "(--positions applies to every part)"
        )
    if len(model.parts) == 1:
        return model.parts[0].error, model.parts[0].on(target)
    return model, replace(model.covers(), positions=target.positions)


def configurations(control: str, errors: list[str], target: Target | None = None, cache: CacheOptions | None = None) -> list[Configuration]:
    """The control (``control``, e.g. ``none@f32``) and one configuration per error spec, each
    ``ERROR[@K[/V]]`` with ``target`` and ``cache``; a spec equal to the control is dropped."""
    first = Configuration.parse(control, cache=cache)
    parsed = {e: Configuration.parse(e, target, cache) for e in errors}
    rest = [parsed[e] for e in unique("--error", errors, key=parsed.get)]
    check_selection_applies(target, rest)
    return [first] + [c for c in rest if c != first]


def check_selection_applies(target: Target | None, configs: list[Configuration]) -> None:
    """A selection (--target, --layers, --positions, --heads) with no configuration to put error
    where it says would be dropped without a word: refused."""
    if target is not None and target != Target() and not any(c.error.injects for c in configs):
        given = ", ".join(c.label for c in configs) or "no --error"
        raise SpecError(
            f"--target, --layers, --positions and --heads say where an error model's error goes, and {given} puts none anywhere: "
            "give an error model (see `kvinject errors`) or leave them out"
        )
