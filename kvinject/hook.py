"""The injection hook: llama.cpp's graph evaluation callback, applied to K and V.

llama.cpp's scheduler asks the callback about every graph node before computing it
(``ask=True``); for a node the callback claims, it computes the graph up to that node and
calls again with the data (``ask=False``). Each layer ``il`` names the K it stores
``Kcur-il`` and the V ``Vcur-il``; consecutive nodes share that name (projection, reshape,
RoPE), and some architectures reuse it for a later run (Gemma normalizes K under another
name, then names the RoPE output ``Kcur-il`` again). The value the cache write reads is
the last node of the last run.

So the hook first learns the graph (:meth:`KVHook.learn`, one decode that claims nothing):
the runs of each name, the op that ends the last one, and what each node reads. Every claim
splits the graph, and a split costs a synchronization of the backend's threads, so the hook
claims one node per layer: the later of the layer's final K and V. The earlier one is
changed at that claim too, which is safe when no node between the two reads it (checked at
learning; otherwise it gets a claim of its own). A value is changed in place when the
scheduler first asks about a node after the claimed run: it is final and nothing has read
it yet. A graph that does not match what was learned fails loudly rather than perturbing
the wrong value.
"""

from __future__ import annotations

import ctypes
from collections import Counter
from dataclasses import dataclass
from typing import Callable

import numpy as np
from llama_cpp import llama_cpp as ll

from . import ggml
from .error_models import Draws, ErrorModel
from .exceptions import InjectionError, ModelError
from .realized import Realized, Workspace
from .target import Target

_OP_OFFSET = ggml.GgmlTensor.op.offset
_NAME_OFFSET = ggml.NAME_OFFSET
_u32_at = ctypes.c_uint32.from_address  # module-level: the per-node path has no attribute lookups to spare
_int_at = ctypes.c_int.from_address
_string_at = ctypes.string_at


@dataclass(frozen=True)
class GraphNode:
    """What learning records of one graph node: its address, name, op and the nodes it reads."""

    ptr: int
    name: bytes
    op: int
    reads: frozenset[int]

    @classmethod
    def read(cls, ptr: int) -> GraphNode:
        t = ggml.tensor(ptr)
        return cls(ptr, t.name, t.op, frozenset(p for p in (*t.src, t.view_src) if p))


@dataclass(frozen=True)
class Plan:
    """Where to claim and what to change there, learned from one graph."""

    n_runs: dict[bytes, int]  # name -> how many runs of consecutive nodes carry it
    final_op: dict[bytes, int]  # name -> op of the node the cache write reads
    claims: dict[bytes, tuple[bytes, ...]]  # claimed name -> names changed at its claim, in graph order

    @classmethod
    def learn(cls, nodes: list[GraphNode], sites: dict[bytes, tuple[str, int]]) -> Plan:
        """The plan for a graph (nodes in evaluation order) and the targeted ``sites``
        (name -> (component, layer)); names not found in the graph are left out."""
        ends: dict[bytes, list[int]] = {}  # name -> index of the last node of each run
        for i, node in enumerate(nodes):
            if node.name in sites and (i + 1 == len(nodes) or nodes[i + 1].name != node.name):
                ends.setdefault(node.name, []).append(i)
        final = {name: idx[-1] for name, idx in ends.items()}
        layers: dict[int, list[bytes]] = {}
        for name in sorted(final, key=final.get):
            layers.setdefault(sites[name][1], []).append(name)
        claims: dict[bytes, tuple[bytes, ...]] = {}
        for names in layers.values():
            last, together = names[-1], []
            for name in names[:-1]:
                ptr = nodes[final[name]].ptr
                if any(ptr in node.reads for node in nodes[final[name] + 1 : final[last] + 1]):
                    claims[name] = (name,)  # read before the layer's last claim: change it at its own
                else:
                    together.append(name)
            claims[last] = (*together, last)
        return cls({n: len(idx) for n, idx in ends.items()}, {n: nodes[i].op for n, i in final.items()}, claims)


class KVHook:
    """Applies ``error`` to the K/V rows selected by ``target``; counts and measures what it did.

    ``row_k`` and ``row_v`` are the number of components of one token's K and V
    (heads x head dim), the unit that error models such as ``quant`` group within.
    Each llama_decode must compute exactly one graph (n_tokens <= n_ubatch) and be
    followed by :meth:`finish_decode`.
    """

    def __init__(self, error: ErrorModel, target: Target, n_layer: int, row_k: int, row_v: int):
        target.check(n_layer)
        self.error = error
        self.row = {"k": row_k, "v": row_v}
        self.realized = Realized.empty()
        self.site_counts: Counter[tuple[str, int]] = Counter()  # (component, layer) -> cache writes perturbed
        self._expected = {(c, il) for il in range(n_layer) for c in "kv" if target.wants(c, il)}
        self._names = {self._node_name(c, il): (c, il) for c, il in self._expected}
        self._width = sum(self.row[c] for c, _ in self._expected)  # values one token draws per decode
        self._noise: _DecodeNoise | None = None
        self._prefixes = {int.from_bytes(name[:4].ljust(4, b"\0"), "little") for name in self._names}
        self._learning: list[GraphNode] | None = None  # the nodes seen while learning
        self.plan = Plan({}, {}, {})
        self._runs_seen: Counter[bytes] = Counter()
        self._run_name: bytes | None = None  # name of the current run of wanted nodes
        self._run_last = 0  # latest node of that run the scheduler asked about
        self._computed = 0  # latest claimed node whose data is ready
        self._pending: dict[bytes, int] = {}  # name -> its final node, to be changed at a later claim
        self._host_rows: dict[tuple[int, int, int, int], np.ndarray] = {}
        self._staged = {"k": _Staging(), "v": _Staging()}
        self._work = Workspace()
        self._decode_hits: Counter[tuple[str, int]] = Counter()
        self._error: BaseException | None = None
        self._checked_layout = False
        # ctypes must keep this object alive as long as the llama context holds the pointer.
        self.callback = ll.ggml_backend_sched_eval_callback(self._eval)

    def stream(self, rng: np.random.Generator) -> Draws | None:
        """A noise stream for one benchmark item (None for error models without randomness)."""
        return Draws(self.error.draw, rng) if self.error.random else None

    def layout(self, segments: list[tuple[Draws | None, int]]) -> None:
        """Announce the next decode: runs of consecutive batch rows, each with the noise stream
        of the item they belong to. Each stream is read in the same order as if its item were
        decoded alone, so an item's noise does not depend on what shares its decodes."""
        self._noise = _DecodeNoise(segments, self._width) if self.error.random else None

    @staticmethod
    def _node_name(component: str, layer: int) -> bytes:
        """The graph name of the final K or V of a layer in llama.cpp's model graphs."""
        return f"{component.upper()}cur-{layer}".encode()

    # Runs for every node of every graph: keep it to a name read and dict lookups.
    def _eval(self, t: int, ask: bool, _user_data: int) -> bool:
        try:
            if not ask:
                self._computed = t
                return True
            if self._learning is not None:
                self._learning.append(GraphNode.read(t))
                return False
            # Most nodes are neither K nor V: tell from the first four bytes of the name.
            if _u32_at(t + _NAME_OFFSET).value not in self._prefixes and self._run_name is None:
                return False
            name = _string_at(t + _NAME_OFFSET)
            if name != self._run_name:
                if self._run_name is not None:
                    self._end_run()
                if name not in self._names:
                    return False
                self._run_name = name
            self._run_last = t
            return name in self.plan.claims and self.plan.final_op[name] == _int_at(t + _OP_OFFSET).value
        except BaseException as e:  # an exception must not cross into C; re-raised by finish_decode
            if self._error is None:
                self._error = e
            self._run_name = None
            return not ask

    def _end_run(self) -> None:
        name, last = self._run_name, self._run_last
        self._run_name = None
        self._runs_seen[name] += 1
        n_runs = self.plan.n_runs[name]
        if self._runs_seen[name] < n_runs:
            return
        together = self.plan.claims.get(name, ())
        if self._runs_seen[name] > n_runs or (together and (self._computed != last or any(n not in self._pending for n in together[:-1]))):
            raise InjectionError(
                f"graph node '{name.decode()}' does not match the graph learned at the first decode; "
                "kvinject does not support models whose graph changes shape between decodes"
            )
        if not together:  # changed at a later claim of its layer
            self._pending[name] = last
            return
        for site in together:
            component, layer = self._names[site]
            self._perturb(last if site == name else self._pending.pop(site), component)
            self._decode_hits[component, layer] += 1

    def learn(self, decode: Callable[[], None]) -> None:
        """Run ``decode`` (one llama_decode) with the hook watching, to learn the graph."""
        self._learning = []
        try:
            decode()
            nodes = self._learning
        finally:
            self._learning = None
        if self._error is not None:
            self.finish_decode()
        self.plan = Plan.learn(nodes, self._names)
        missing = sorted(self._names[n] for n in set(self._names) - set(self.plan.n_runs))
        if missing:
            raise ModelError(
                "the K/V hook did not find the targeted cache writes in this model's graph "
                f"(missing {len(missing)} of {len(self._names)}, e.g. {missing[:4]}): this "
                "architecture names its K/V nodes differently and is not supported yet"
            )

    def _perturb(self, ptr: int, component: str) -> None:
        t = ggml.tensor(ptr)
        x = self._host_rows.get((ptr, t.data, t.ne[2], t.ne[3]))
        if x is None:
            x = self._rows(ptr, t, component)
        if isinstance(x, np.ndarray):  # host memory: change it in place
            before, after = self._staged[component].slots(x.size)
            np.copyto(before, x.reshape(-1))
            self.error.apply(x, self._noise)
            np.copyto(after, x.reshape(-1))
        else:  # device memory: copy out and back
            before, after = self._staged[component].slots(x[0] * x[1])
            ggml.lib().ggml_backend_tensor_get(ptr, before.ctypes.data, 0, before.nbytes)
            np.copyto(after, before)
            self.error.apply(after.reshape(x), self._noise)
            ggml.lib().ggml_backend_tensor_set(ptr, after.ctypes.data, 0, after.nbytes)

    def _rows(self, ptr: int, t: ggml.GgmlTensor, component: str) -> np.ndarray | tuple[int, int]:
        """Check a tensor once per graph node and buffer: a (rows, row) float32 view of host
        memory, or the (rows, row) shape of device memory."""
        if not self._checked_layout:
            ggml.check_layout(ptr)
            self._checked_layout = True
        if t.type != ggml.GGML_TYPE_F32 or not ggml.lib().ggml_is_contiguous(ptr):
            raise ModelError(f"'{t.name.decode()}' is not a contiguous f32 tensor; kvinject cannot perturb it")
        n, row = ggml.numel(t), self.row[component]
        if n % row:
            raise ModelError(f"'{t.name.decode()}' has {n} values, not a whole number of {row}-value rows")
        if not ggml.lib().ggml_backend_buffer_is_host(t.buffer):
            return (n // row, row)
        # The scheduler reuses its graph nodes and compute buffers, so the same key recurs.
        x = np.frombuffer((ctypes.c_float * n).from_address(t.data), dtype=np.float32).reshape(-1, row)
        self._host_rows[ptr, t.data, t.ne[2], t.ne[3]] = x
        return x

    def finish_decode(self) -> None:
        """Call after each llama_decode: re-raises errors from the callback, checks that every
        targeted K/V was reached equally often, and folds this decode into the statistics."""
        error, self._error = self._error, None
        if error is not None:
            self._discard()
            if isinstance(error, (InjectionError, ModelError)):
                raise error
            raise InjectionError(f"error inside the K/V hook: {type(error).__name__}: {error}") from error
        hits, self._decode_hits = self._decode_hits, Counter()
        self._runs_seen.clear()
        self._pending.clear()
        if set(hits) != self._expected or set(hits.values()) != {1}:
            self._discard()
            missing = sorted(self._expected - set(hits))
            raise InjectionError(
                f"this decode perturbed {len(hits)} of the {len(self._expected)} targeted K/V cache "
                f"writes (missing e.g. {missing[:4]}); was the decode larger than one ubatch?"
            )
        self.site_counts.update(hits)
        for component, stats in (("k", self.realized.k), ("v", self.realized.v)):
            staged = self._staged[component]
            if staged.sites:
                stats.add(staged.before[: staged.n], staged.after[: staged.n], staged.sites, self._work)
                staged.clear()

    def _discard(self) -> None:
        self._decode_hits.clear()
        self._runs_seen.clear()
        self._pending.clear()
        self._run_name = None
        for staged in self._staged.values():
            staged.clear()


class _Staging:
    """The values before and after the change at each site of one decode, for K or for V, in
    arrays kept from decode to decode (fresh arrays every decode cost page faults)."""

    def __init__(self) -> None:
        self.before = self.after = np.empty(0, np.float32)
        self.n = 0  # values staged in this decode
        self.sites = 0

    def slots(self, size: int) -> tuple[np.ndarray, np.ndarray]:
        end = self.n + size
        if end > self.before.size:
            capacity = max(end, 2 * self.before.size)
            self.before = np.concatenate([self.before[: self.n], np.empty(capacity - self.n, np.float32)])
            self.after = np.concatenate([self.after[: self.n], np.empty(capacity - self.n, np.float32)])
        slots = self.before[self.n : end], self.after[self.n : end]
        self.n, self.sites = end, self.sites + 1
        return slots

    def clear(self) -> None:
        self.n = self.sites = 0


class _DecodeNoise:
    """The noise of one decode, handed to the error model site by site in graph order.

    Each segment's stream gives ``rows * width`` values at once; a site whose rows hold ``r``
    components each takes the next ``rows * r`` of every segment, so a stream is consumed
    site by site exactly as when its rows are decoded alone.
    """

    def __init__(self, segments: list[tuple[Draws | None, int]], width: int):
        self._rows = sum(rows for _, rows in segments)
        self._at = 0  # components per row consumed so far
        self._matrix: np.ndarray | None = None
        self._blocks: list[tuple[np.ndarray, int]] = []
        if len(segments) > 1 and self._rows == len(segments):
            # One row per segment, as in a decode of generated tokens: the sites take
            # successive columns of a (rows, width) matrix, as views rather than copies.
            self._matrix = np.empty((self._rows, width), np.float32)
            for row, (draws, _) in zip(self._matrix, segments):
                row[:] = draws.take(width)
        else:
            self._blocks = [(draws.take(rows * width), rows) for draws, rows in segments]

    def take(self, n: int) -> np.ndarray:
        r = n // self._rows
        if r * self._rows != n:
            raise InjectionError(f"a cache write of {n} values does not split into the {self._rows} rows of this decode")
        at, self._at = self._at, self._at + r
        if self._matrix is not None:
            return self._matrix[:, at : at + r]
        pieces = [block[at * rows : (at + r) * rows] for block, rows in self._blocks]
        return pieces[0] if len(pieces) == 1 else np.concatenate(pieces)
