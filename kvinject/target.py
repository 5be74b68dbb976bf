"""Which cache writes an error model touches: K, V or both, which layers, and which positions."""

from __future__ import annotations

from dataclasses import dataclass

from .exceptions import SpecError
from .positions import Positions
from .values import parse_int

COMPONENTS = ("kv", "k", "v")
MAX_LAYER = 4095


@dataclass(frozen=True)
class Target:
    components: str = "kv"
    layers: frozenset[int] | None = None  # None: every layer
    positions: Positions | None = None  # None: every cached token

    def __post_init__(self) -> None:
        if self.components not in COMPONENTS:
            raise SpecError(f"target must be one of {', '.join(COMPONENTS)}, got '{self.components}'")

    @classmethod
    def parse(cls, components: str = "kv", layers: str | None = None, positions: str | None = None) -> Target:
        return cls(components.strip().lower(), parse_layers(layers), Positions.parse(positions))

    def wants(self, component: str, layer: int) -> bool:
        return component in self.components and (self.layers is None or layer in self.layers)

    def check(self, n_layer: int) -> None:
        """Fail when --layers names a layer the model does not have."""
        if self.layers is not None and max(self.layers) >= n_layer:
            raise SpecError(f"--layers names layer {max(self.layers)}, but the model has layers 0-{n_layer - 1}")

    @property
    def layers_spec(self) -> str:
        return "all" if self.layers is None else format_layers(self.layers)

    @property
    def positions_spec(self) -> str:
        return "all" if self.positions is None else self.positions.spec


def parse_layers(text: str | None) -> frozenset[int] | None:
    """``0-3,10`` -> {0, 1, 2, 3, 10}; None, '' or 'all' -> None (every layer)."""
    if text is None or text.strip().lower() in ("", "all"):
        return None
    layers: set[int] = set()
    for part in text.split(","):
        lo, sep, hi = part.strip().partition("-")
        try:
            first = parse_int("layer", lo)
            last = parse_int("layer", hi) if sep else first
        except SpecError:
            raise SpecError(f"bad --layers '{text}': use layer numbers and ranges, e.g. 0-3,10") from None
        if first < 0 or last < first:
            raise SpecError(f"bad --layers '{text}': '{part.strip()}' is not a range of layers >= 0")
        if last > MAX_LAYER:  # before a set of a billion layers is made
            raise SpecError(f"bad --layers '{text}': layer {last} is beyond any model (at most {MAX_LAYER})")
        layers.update(range(first, last + 1))
    return frozenset(layers)


def format_layers(layers: frozenset[int]) -> str:
    """Inverse of parse_layers: {0, 1, 2, 3, 10} -> '0-3,10'."""
    runs: list[list[int]] = []
    for layer in sorted(layers):
        if runs and layer == runs[-1][1] + 1:
            runs[-1][1] = layer
        else:
            runs.append([layer, layer])
    return ",".join(str(a) if a == b else f"{a}-{b}" for a, b in runs)
