"""A configuration: one error model, where it applies, and how the cache stores K and V."""

from __future__ import annotations

from dataclasses import dataclass, field

from .error_models import ErrorModel, NoError, parse_error
from .options import CacheOptions
from .target import Target


@dataclass(frozen=True)
class Configuration:
    error: ErrorModel = field(default_factory=NoError)
    target: Target = field(default_factory=Target)
    cache: CacheOptions = field(default_factory=CacheOptions)

    @classmethod
    def parse(cls, spec: str, target: Target | None = None, cache: CacheOptions | None = None) -> Configuration:
        return cls(parse_error(spec), target or Target(), cache or CacheOptions())

    @property
    def label(self) -> str:
        """Short and unique among configurations that differ only in error and target."""
        where = "" if not self.error.injects or (self.target == Target()) else f" [{self.target.components}@{self.target.layers_spec}]"
        return f"{self.error.spec}{where}"

    def to_dict(self) -> dict[str, object]:
        return {
            "error": self.error.spec,
            "target": self.target.components,
            "layers": self.target.layers_spec,
            "cache": self.cache.to_dict(),
        }
