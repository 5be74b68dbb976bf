"""The cells every sequence's tokens occupy in one context's cache, for cache-resident models.

After each decode the hook reports where the decode wrote K and V (:mod:`kvinject.cache_writes`);
this module appends each sequence's new tokens with their cells, per layer, and runs the
context's cache-resident model on them (:class:`kvinject.error_models.CacheResident`). Token
``i`` of a sequence is the one at position ``i``: sequences are decoded from position 0 on, in
order. A cell llama.cpp has given to another token since (a sliding-window layer dropping old
tokens) is refused rather than edited.
"""

from __future__ import annotations

import numpy as np

from .cache_tensor import CacheTensor, from_float, to_float
from .cache_writes import Writes
from .error_models import CacheResident
from .exceptions import InjectionError, ModelError
from .realized import Realized, Workspace
from .target import Target


class _Tokens:
    """One sequence's tokens in arrival order: the cell of each in each layer."""

    def __init__(self, n_layer: int):
        self.cells = np.empty((64, n_layer), np.int64)
        self.n = 0

    def append(self, cells: np.ndarray) -> None:
        end = self.n + len(cells)
        if end > len(self.cells):  # doubling: generation appends one token per decode
            self.cells = np.concatenate([self.cells[: self.n], np.empty((max(end, 2 * len(self.cells)) - self.n, self.cells.shape[1]), np.int64)])
        self.cells[self.n : end] = cells
        self.n = end


class ResidentCache:
    """What a cache-resident model sees of one context's cache: the targeted ``sites``
    ((component, layer)), the cells of each sequence's tokens, and reading and writing them.
    What :meth:`write` changes is counted in ``realized``."""

    def __init__(self, model: CacheResident, target: Target, n_layer: int, n_cells: int):
        self.model = model
        self.sites = tuple((c, il) for c in "kv" for il in range(n_layer) if target.wants(c, il))
        self.realized = Realized.empty()
        self._n_layer = n_layer
        self._seqs: dict[int, _Tokens] = {}
        self._finished: list[int] = []  # the tokens of each sequence forgotten so far
        self._owner = np.full((n_layer, n_cells), -1, np.int64)  # seq << 32 | token, per layer and cell
        self._tensors: dict[tuple[str, int], CacheTensor] = {}
        self._work = Workspace()

    def after_decode(self, entries: list[tuple[int, int, int, bool]], writes: Writes) -> None:
        """Record the decode's ``(token, position, sequence, logits)`` entries at the cells the
        hook saw them written to, then run the model."""
        seqs = np.array([seq for _, _, seq, _ in entries])
        positions = np.array([pos for _, pos, _, _ in entries])
        layers = np.flatnonzero(writes.cells[:, 0] >= 0)
        grown = []
        for seq in dict.fromkeys(seqs.tolist()):
            rows = np.flatnonzero(seqs == seq)
            tokens = self._seqs.setdefault(seq, _Tokens(self._n_layer))
            n0 = tokens.n
            index = np.arange(n0, n0 + len(rows))
            if not np.array_equal(positions[rows], index):
                raise InjectionError(
                    f"'{self.model.name}' needs each sequence decoded from position 0 on, in order: "
                    f"sequence {seq} has {n0} tokens and got positions {positions[rows][0]} to {positions[rows][-1]}"
                )
            tokens.append(writes.cells[:, rows].T)
            self._owner[layers[:, None], writes.cells[layers][:, rows]] = seq << 32 | index
            grown.append((seq, n0, tokens.n))
        if not self._tensors:  # cache tensors live as long as the context
            self._tensors = {site: CacheTensor(writes.tensors[site], writes.transposed[site]) for site in self.sites}
            for component in "kv":  # read and written together, in one array
                if len({(t.width, t.kind) for (c, _), t in self._tensors.items() if c == component}) > 1:
                    raise ModelError(f"this model's layers store {component.upper()} rows of different widths or types; '{self.model.name}' cannot handle them")
        self.model.after_decode(self, grown)

    def cells(self, seq: int, layers: np.ndarray, start: int, stop: int) -> np.ndarray:
        """The cells of tokens ``start`` to ``stop`` (exclusive) of ``seq`` in each of the
        ``layers``' caches, shape (layers, tokens)."""
        cells = self._seqs[seq].cells[start:stop, layers].T
        if (self._owner[layers[:, None], cells] != seq << 32 | np.arange(start, stop)).any():
            raise InjectionError(f"a token of sequence {seq} between {start} and {stop} has left the cache; '{self.model.name}' cannot change it")
        return cells

    def read(self, sites: list[tuple[str, int]], cells: np.ndarray) -> np.ndarray:
        """The rows of ``cells[i]`` at ``sites[i]`` (of one component), float32, shape (sites, cells, row)."""
        return to_float(np.stack([self._tensors[site].get(c) for site, c in zip(sites, cells)]), self._tensors[sites[0]].kind)

    def write(self, sites: list[tuple[str, int]], cells: np.ndarray, before: np.ndarray, after: np.ndarray) -> None:
        """Store ``after[i]`` at ``cells[i]`` of ``sites[i]`` (of one component), where ``before[i]`` was read."""
        stored = from_float(after, self._tensors[sites[0]].kind)
        for site, c, rows in zip(sites, cells, stored):
            self._tensors[site].set(c, rows)
        stats = self.realized.k if sites[0][0] == "k" else self.realized.v
        stats.add(before, to_float(stored, self._tensors[sites[0]].kind), len(sites), self._work)

    @property
    def lengths(self) -> list[int]:
        """The tokens of every sequence this cache has held, those it holds now included."""
        return self._finished + [tokens.n for tokens in self._seqs.values()]

    def forget(self, seq: int) -> None:
        tokens = self._seqs.pop(seq, None)
        if tokens is not None and tokens.n:
            self._finished.append(tokens.n)

    def clear(self) -> None:
        for seq in list(self._seqs):
            self.forget(seq)
