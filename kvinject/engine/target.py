"""Which cache writes an error model touches: K, V or both, which layers, which positions, and
which KV heads of each vector."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..exceptions import SpecError
from ..values import parse_int, split_list, unique
from .positions import Positions

COMPONENTS = ("kv", "k", "v")
MAX_LAYER = 4095
MAX_HEAD = 4095


@dataclass(frozen=True)
class Target:
    components: str = "kv"
    layers: frozenset[int] | None = None  # None: every layer
    positions: Positions | None = None  # None: every cached token
    heads: frozenset[int] | None = None  # KV heads (of n_head_kv); None: every head
    # The (component, layer) pairs wanted where they are no product of components and layers (a
    # composite's parts, kvinject/error_models/composite.py); layer None: every layer.
    cells: frozenset[tuple[str, int | None]] | None = None

    def __post_init__(self) -> None:
        if self.components not in COMPONENTS:
            raise SpecError(f"target must be one of {', '.join(COMPONENTS)}, got '{self.components}'")

    @classmethod
    def parse(cls, components: str = "kv", layers: str | None = None, positions: str | None = None, heads: str | None = None) -> Target:
        return cls(components.strip().lower(), parse_layers(layers), Positions.parse(positions), parse_heads(heads))

    def wants(self, component: str, layer: int) -> bool:
        if self.cells is not None:
            return (component, layer) in self.cells or (component, None) in self.cells
        return component in self.components and (self.layers is None or layer in self.layers)

    def check(self, n_layer: int, n_head_kv: int) -> None:
        """Fail when --layers or --heads names a layer or KV head the model does not have."""
        if self.layers is not None and max(self.layers) >= n_layer:
            raise SpecError(f"--layers names layer {max(self.layers)}, but the model has layers 0-{n_layer - 1}")
        if self.heads is not None and max(self.heads) >= n_head_kv:
            raise SpecError(f"--heads names KV head {max(self.heads)}, but the model has KV heads 0-{n_head_kv - 1}")

    def columns(self, row: int, n_head_kv: int) -> np.ndarray | None:
        """Which of a K or V vector's ``row`` components belong to the targeted heads (llama.cpp
        lays a vector out head after head), or None for all."""
        if self.heads is None:
            return None
        return np.isin(np.arange(row) // (row // n_head_kv), sorted(self.heads))

    def share(self, n_head_kv: int) -> float:
        """The fraction of a targeted vector's components that get the error."""
        return 1.0 if self.heads is None else len(self.heads) / n_head_kv

    @property
    def layers_spec(self) -> str:
        return "all" if self.layers is None else format_indices(self.layers)

    @property
    def heads_spec(self) -> str:
        return "all" if self.heads is None else format_indices(self.heads)

    @property
    def positions_spec(self) -> str:
        return "all" if self.positions is None else self.positions.spec


def parse_layers(text: str | None) -> frozenset[int] | None:
    """``0-3,10`` -> {0, 1, 2, 3, 10}; None, '' or 'all' -> None (every layer)."""
    return _parse_indices(text, "layer", MAX_LAYER)


def parse_heads(text: str | None) -> frozenset[int] | None:
    """KV heads as layers are written: ``0,2`` -> {0, 2}; None, '' or 'all' -> None (every head)."""
    return _parse_indices(text, "head", MAX_HEAD)


def _parse_indices(text: str | None, noun: str, limit: int) -> frozenset[int] | None:
    if text is None or text.strip().lower() in ("", "all"):
        return None
    indices: set[int] = set()
    for part in unique(f"--{noun}s", split_list(f"--{noun}s", text)):
        lo, sep, hi = part.partition("-")
        try:
            first = parse_int(noun, lo)
            last = parse_int(noun, hi) if sep else first
        except SpecError:
            raise SpecError(f"bad --{noun}s '{text}': use {noun} numbers and ranges, e.g. 0-3,10") from None
        if last < first:
            raise SpecError(f"bad --{noun}s '{text}': '{part.strip()}' counts down: write {last}-{first}")
        if first < 0:
            raise SpecError(f"bad --{noun}s '{text}': '{part.strip()}' is not a range of {noun}s >= 0")
        if last > limit:  # before a set of a billion layers is made
            raise SpecError(f"bad --{noun}s '{text}': {noun} {last} is beyond any model (at most {limit})")
        indices.update(range(first, last + 1))
    return frozenset(indices)


def format_indices(indices: frozenset[int]) -> str:
    """Inverse of parse_layers and parse_heads: {0, 1, 2, 3, 10} -> '0-3,10'."""
    runs: list[list[int]] = []
    for i in sorted(indices):
        if runs and i == runs[-1][1] + 1:
            runs[-1][1] = i
        else:
            runs.append([i, i])
    return ",".join(str(a) if a == b else f"{a}-{b}" for a, b in runs)
