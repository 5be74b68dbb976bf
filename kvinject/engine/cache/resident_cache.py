"""The cells every sequence's tokens occupy in one context's cache, for cache-resident models.

After each decode the hook reports where the decode wrote K and V (:mod:`kvinject.engine.graph.cache_writes`);
this module appends each sequence's new tokens with their cells, per layer, and runs the
context's cache-resident model on them (:class:`kvinject.engine.perturbation.CacheResident`). Token
``i`` of a sequence is the one at position ``i``: sequences are decoded from position 0 on, in
order. A cell llama.cpp has given to another token since (a sliding-window layer dropping old
tokens) is refused rather than edited. A model may also remove tokens (eviction): their cells are
freed with ``llama_memory_seq_rm``, and the other tokens keep their positions.
"""

from __future__ import annotations

from contextlib import contextmanager
from typing import TYPE_CHECKING, Callable, Iterator, Protocol

import numpy as np

from ...exceptions import InjectionError, ModelError
from ..graph.cache_writes import Writes
from ..graph.hidden import HiddenCells
from ..realized_error import Realized, Workspace
from ..target import Target
from ..variates import Draws
from .cache_tensor import CacheTensor, from_float, to_float

if TYPE_CHECKING:
    from ..model import Rope


class _Tokens:
    """One sequence's tokens in arrival order: the cell of each in each layer."""

    def __init__(self, n_layer: int):
        self.cells = np.empty((64, n_layer), np.int64)
        self.held = np.zeros(64, bool)  # still in the cache (not evicted)
        self.n = 0
        self.unasked = 0  # tokens decoded since the last decode that asked for the last one's logits
        self.state: dict[str, object] = {}  # what the model keeps about the sequence

    def append(self, cells: np.ndarray) -> None:
        end = self.n + len(cells)
        if end > len(self.cells):  # doubling: generation appends one token per decode
            grow = max(end, 2 * len(self.cells)) - self.n
            self.cells = np.concatenate([self.cells[: self.n], np.empty((grow, self.cells.shape[1]), np.int64)])
            self.held = np.concatenate([self.held[: self.n], np.zeros(grow, bool)])
        self.cells[self.n : end] = cells
        self.held[self.n : end] = True
        self.n = end


class Resident(Protocol):
    """What the cache asks of the model it runs (kvinject.engine.perturbation.CacheResident)."""

    name: str

    def after_decode(self, cache: ResidentCache, grown: list[tuple[int, int, int]]) -> None: ...


class ResidentCache:
    """What a cache-resident model sees of one context's cache: the targeted ``sites``
    ((component, layer)), the cells of each sequence's tokens, and reading and writing them.
    What :meth:`write` changes is counted in ``realized``."""

    def __init__(
        self,
        model: Resident,
        target: Target,
        n_layer: int,
        n_cells: int,
        seq_rm: Callable[[int, int, int], None] = lambda seq, p0, p1: None,
        draws: dict[int, Draws | None] | None = None,
        n_head_kv: int = 1,
        spans: dict[int, dict[str, list[tuple[int, int]]]] | None = None,
        tensors: dict[tuple[str, int], tuple[int, bool]] | None = None,
        hidden: HiddenCells | None = None,
        rope: Rope | None = None,
    ):
        self.model = model
        self.sites = tuple((c, il) for c in "kv" for il in range(n_layer) if target.wants(c, il))
        self._part: int | None = None  # the composite's part acting now (:meth:`acting`)
        self.realized = Realized.empty()
        self._n_layer = n_layer
        self._n_head_kv = n_head_kv
        self._spans = spans if spans is not None else {}  # the context's, per sequence (Context.mark)
        self._seqs: dict[int, _Tokens] = {}
        self._finished: list[tuple[int, float]] = []  # (tokens, tokens held at the end) of each sequence forgotten so far
        self._hidden = hidden  # cells hidden from some KV heads of a layer (kvinject/engine/graph/hidden.py)
        self.rope = rope  # how the model rotates queries and keys
        self._queries: np.ndarray | None = None
        self._seq_rm = seq_rm  # llama_memory_seq_rm of the context: (seq, from position, to position)
        self._draws = draws if draws is not None else {}
        self._rows: dict[int, np.ndarray] = {}  # this decode's batch rows of each sequence
        self._prompt_ended: dict[int, bool] = {}
        self._asked: dict[int, bool] = {}
        self._attention: np.ndarray | None = None
        self._owner = np.full((n_layer, n_cells), -1, np.int64)  # seq << 32 | token, per layer and cell
        self._cache = tensors if tensors is not None else {}  # (component, layer) -> (cache tensor, transposed), learned by the hook
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
            self._rows[seq] = rows
            tokens.unasked += len(rows)
            self._asked[seq] = bool(entries[rows[-1]][3])
            self._prompt_ended[seq] = self._asked[seq] and tokens.unasked > 1
            if entries[rows[-1]][3]:
                tokens.unasked = 0
        self._attention = writes.attention
        self._queries = writes.queries
        self.model.after_decode(self, grown)
        self._rows.clear()

    def cells(self, seq: int, layers: np.ndarray, start: int, stop: int) -> np.ndarray:
        """The cells of tokens ``start`` to ``stop`` (exclusive) of ``seq`` in each of the
        ``layers``' caches, shape (layers, tokens)."""
        cells = self._seqs[seq].cells[start:stop, layers].T
        if (self._owner[layers[:, None], cells] != seq << 32 | np.arange(start, stop)).any():
            raise InjectionError(f"a token of sequence {seq} between {start} and {stop} has left the cache; '{self.model.name}' cannot change it")
        return cells

    def _tensor(self, site: tuple[str, int]) -> CacheTensor:
        """A cache tensor, opened when first read or written (eviction edits none, so a quantized cache will do)."""
        if not self._tensors:
            self._tensors = {site: CacheTensor(*self._cache[site]) for site in self.sites}
            for component in "kv":  # read and written together, in one array
                if len({(t.width, t.kind) for (c, _), t in self._tensors.items() if c == component}) > 1:
                    raise ModelError(f"this model's layers store {component.upper()} rows of different widths or types; '{self.model.name}' cannot handle them")
        return self._tensors[site]

    def read(self, sites: list[tuple[str, int]], cells: np.ndarray) -> np.ndarray:
        """The rows of ``cells[i]`` at ``sites[i]`` (of one component), float32, shape (sites, cells, row)."""
        return to_float(np.stack([self._tensor(site).get(c) for site, c in zip(sites, cells)]), self._tensor(sites[0]).kind)

    def write(self, sites: list[tuple[str, int]], cells: np.ndarray, before: np.ndarray, after: np.ndarray) -> None:
        """Store ``after[i]`` at ``cells[i]`` of ``sites[i]`` (of one component), where ``before[i]`` was read."""
        stored = from_float(after, self._tensor(sites[0]).kind)
        for site, c, rows in zip(sites, cells, stored):
            self._tensor(site).set(c, rows)
        component, after = sites[0][0], to_float(stored, self._tensor(sites[0]).kind)
        getattr(self.realized, component).add(before, after, len(sites), self._work)
        if self._part is not None:  # a composite's part: its own statistics too
            getattr(self.realized.parts.setdefault(self._part, Realized.empty()), component).add(before, after, len(sites), self._work)

    def keys(self, seq: int, tokens: np.ndarray) -> np.ndarray:
        """The cached K of ``seq``'s ``tokens`` (indices, held) in every layer, float32, shape
        (layers, tokens, KV heads, head dim)."""
        return self._cached("k", seq, tokens)

    def values(self, seq: int, tokens: np.ndarray) -> np.ndarray:
        """The cached V of ``seq``'s ``tokens``, as :meth:`keys`."""
        return self._cached("v", seq, tokens)

    def _cached(self, component: str, seq: int, tokens: np.ndarray) -> np.ndarray:
        layers = np.arange(self._n_layer)
        cells = self._seqs[seq].cells[tokens][:, layers].T
        if (self._owner[layers[:, None], cells] != seq << 32 | tokens).any():
            raise InjectionError(f"a token of sequence {seq} has left the cache; '{self.model.name}' cannot read it")
        x = self.read([(component, il) for il in layers], cells)
        return x.reshape(*x.shape[:2], self._n_head_kv, -1)

    def held(self, seq: int) -> np.ndarray:
        """The tokens of ``seq`` still in the cache, in order."""
        tokens = self._seqs[seq]
        return np.flatnonzero(tokens.held[: tokens.n])

    def remove(self, seq: int, tokens: np.ndarray) -> None:
        """Evict ``tokens`` of ``seq`` from the cache, each run of consecutive positions with one
        ``llama_memory_seq_rm`` (token i is at position i: the others keep theirs)."""
        if not len(tokens):
            return
        seqs = self._seqs[seq]
        tokens = np.unique(tokens)
        if not seqs.held[tokens].all() or tokens[-1] >= seqs.n:
            raise InjectionError(f"'{self.model.name}' removes a token of sequence {seq} that the cache does not hold")
        layers = np.arange(self._n_layer)
        cells = seqs.cells[tokens].T
        if self._hidden is not None:
            self._hidden.show(layers, cells)
        owner = self._owner[layers[:, None], cells]
        self._owner[layers[:, None], cells] = np.where(owner == seq << 32 | tokens, -1, owner)  # cells() refuses them now
        seqs.held[tokens] = False
        breaks = np.flatnonzero(np.diff(tokens) != 1) + 1
        for run in np.split(tokens, breaks):
            self._seq_rm(seq, int(run[0]), int(run[-1]) + 1)

    def hide(self, seq: int, layer: int, kv_head: int, tokens: np.ndarray) -> None:
        """Hide ``tokens`` of ``seq`` from one KV head of one layer: its queries give them no
        weight from the next decode on (kvinject/engine/graph/hidden.py)."""
        if self._hidden is None:
            raise InjectionError(f"'{self.model.name}' hides tokens from single heads, and this context hides none")
        cells = self._seqs[seq].cells[tokens, layer]
        if (self._owner[layer, cells] != seq << 32 | tokens).any():
            raise InjectionError(f"a token of sequence {seq} has left the cache; '{self.model.name}' cannot hide it")
        self._hidden.hide(layer, kv_head, cells)

    def _held_share(self, seq: int) -> float:
        """The tokens ``seq`` holds, less the share hidden from layers and heads."""
        held = self.held(seq)
        if self._hidden is None or not len(held):
            return float(len(held))
        layers = np.arange(self._n_layer)
        hidden = self._hidden.table[layers[:, None], :, self._seqs[seq].cells[held].T]  # (layers, tokens, KV heads)
        return len(held) - float(hidden.sum()) / (self._n_layer * self._n_head_kv)

    def attention(self, seq: int) -> np.ndarray:
        """The attention of this decode's rows of ``seq`` on each token it held during the
        decode, the mean over layers and query heads: shape (rows, ``held(seq)``). Call before
        removing any of them."""
        if self._attention is None:
            raise InjectionError(f"'{self.model.name}' needs attention weights and none were read")
        tokens = self._seqs[seq]
        cells = tokens.cells[self.held(seq)]
        if (cells != cells[:, :1]).any():
            raise ModelError(f"this model's layers keep a token in different cells (sliding-window layers?); '{self.model.name}' cannot score it")
        return self._attention[self._rows[seq]][:, cells[:, 0]]

    def queries(self, seq: int) -> np.ndarray:
        """This decode's queries of ``seq`` before RoPE, per layer: (layers, rows, heads x head dim)."""
        if self._queries is None:
            raise InjectionError(f"'{self.model.name}' needs queries and none were read")
        return self._queries[:, self._rows[seq]]

    def asked(self, seq: int) -> bool:
        """Whether this decode asked for the logits of the sequence's last token: generation
        does at every token, a prompt at its last piece only."""
        return self._asked[seq]

    def prompt_ended(self, seq: int) -> bool:
        """Whether this decode ended a prompt of ``seq``: it asked for the logits of the sequence's
        last token, and several tokens came since the last decode that did (Context.prefill asks
        only for the prompt's last; generation asks for each token)."""
        return self._prompt_ended[seq]

    def span_end(self, seq: int, name: str) -> int | None:
        """Where the span ``name`` the benchmark marked on ``seq`` ends (its last piece), or None."""
        spans = self._spans.get(seq, {}).get(name)
        return spans[-1][1] if spans else None

    def state(self, seq: int) -> dict[str, object]:
        """What the model keeps about ``seq`` from decode to decode (cleared with it); a
        composite's parts each their own."""
        state = self._seqs[seq].state
        return state if self._part is None else state.setdefault(f"part {self._part}", {})

    @contextmanager
    def acting(self, part: int, target: Target) -> Iterator[None]:
        """Run a composite's ``part`` on the sites of ``target`` only, with a state of its own."""
        sites, self.sites, self._part = self.sites, tuple(s for s in self.sites if target.wants(*s)), part
        try:
            yield
        finally:
            self.sites, self._part = sites, None

    def draws(self, seq: int) -> Draws | None:
        """The random stream of the item on ``seq`` (for models that draw)."""
        return self._draws.get(seq)

    @property
    def lengths(self) -> list[int]:
        """The tokens of every sequence this cache has held, those it holds now included."""
        return [n for n, _ in self._finished] + [tokens.n for tokens in self._seqs.values()]

    @property
    def kept(self) -> list[float]:
        """The tokens of each sequence of :attr:`lengths` the cache held at its end (or holds now),
        those hidden from some layers and heads counted by the share that sees them."""
        return [held for _, held in self._finished] + [self._held_share(seq) for seq in self._seqs]

    def forget(self, seq: int) -> None:
        if seq not in self._seqs:
            return
        held, share = self.held(seq), self._held_share(seq)
        if self._hidden is not None and len(held):
            self._hidden.show(np.arange(self._n_layer), self._seqs[seq].cells[held].T)
        tokens = self._seqs.pop(seq)
        if tokens.n:
            self._finished.append((tokens.n, share))

    def clear(self) -> None:
        for seq in list(self._seqs):
            self.forget(seq)
