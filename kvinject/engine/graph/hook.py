"""The injection hook: llama.cpp's graph evaluation callback, applied to K and V.

llama.cpp's scheduler asks the callback about every graph node before computing it
(``ask=True``); for a node the callback claims, it computes the graph up to that node and
calls again with the data (``ask=False``). The hook first learns the graph (:meth:`KVHook.learn`,
one decode that claims nothing) and plans where to claim (kvinject/engine/graph/graph_plan.py). A value
is changed in place when the scheduler first asks about a node after the claimed run: it is
final and nothing has read it yet. A graph that does not match what was learned fails loudly
rather than perturbing the wrong value.

The callback that follows the plan node by node is compiled (:mod:`kvinject.engine.callback.graph_callback`)
and multiplies host-memory K/V by their noise itself; this module learns and plans, lays out
each decode's noise, applies the other error models, and checks and accounts after each
decode. A cache-resident model (one that changes cells already in the cache, such as KIVI)
claims nothing: the callback records where each decode wrote K and V
(:mod:`kvinject.engine.graph.cache_writes`), and the context hands that to the model after the decode.
A composite with parts of both kinds does both, each on its own parts' sites (``ErrorModel.split``).
"""

from __future__ import annotations

import ctypes
import re
from dataclasses import replace
from typing import Callable

import numpy as np
from llama_cpp import llama_cpp as ll

from ... import interrupts
from ...exceptions import HookError, InjectionError, ModelError
from .. import ggml
from ..callback import graph_callback as gc
from ..callback import graph_header as gh
from ..gpu import device
from ..gpu.device import DeviceChange
from ..perturbation import ErrorModel
from ..quant_blocks import BlockFaults
from ..realized_error import Realized, RealizedStats, Staging, Workspace
from ..sites import Placed, locate
from ..target import Target
from ..variates import DecodeNoise, Draws, Variates
from .attention import AttentionSums
from .cache_writes import CacheWrites, Writes
from .graph_plan import GraphNode, GraphPlan
from .hidden import HiddenCells
from .native_errors import LEARN_CAPACITY, native_error
from .queries import Queries

# The Python side of changes the compiled callback hands back: how many (tensor, site, at) it queued.
_APPLY = ctypes.CFUNCTYPE(None, ctypes.c_int64)
_TAGGED_K = re.compile(rb"Kcur_[a-z_]{0,9}-(\d+)")  # what the compiled callback's _site takes for K before RoPE


class KVHook:
    """Applies ``error`` to the K/V rows selected by ``target``; counts and measures what it did.

    ``row_k`` and ``row_v`` are the number of components of one token's K and V
    (heads x head dim), the unit that error models such as ``quant`` group within; ``n_head_kv``
    splits them into the heads ``--heads`` selects.
    Each llama_decode must compute exactly one graph (n_tokens <= n_ubatch), be announced
    by :meth:`layout` and be followed by :meth:`finish_decode`. The context passes
    ``callback`` and ``user_data`` to llama.cpp; the callback is compiled
    (:mod:`kvinject.engine.callback.graph_callback`) and calls back into Python only for what it does not
    do itself (error models other than multiplicative ones on the host; in device memory, the
    first claim, which sets up the kernel the callback launches from then on).
    """

    def __init__(self, error: ErrorModel, target: Target, n_layer: int, row_k: int, row_v: int, n_head_kv: int):
        self.error = error
        self.entry = entry = error.at_entry
        self.row = {"k": row_k, "v": row_v}
        claimed, stored = error.split(target)  # a composite's entry and resident parts each act on their own sites
        self._expected = _sites(claimed if entry is not None else stored, n_layer)
        self._resident_sites = _sites(stored, n_layer) if error.resident is not None else set()
        self._expected_rows = np.array(sorted(_site(c, il) for c, il in self._expected), np.int64)
        self._decodes = 0  # decodes that perturbed every targeted site once
        self._python_realized = Realized.empty()  # what the Python side changed
        # A model that changes nothing at entry (cache-resident) claims no node; cache writes are recorded.
        self._names = {self._node_name(c, il): (c, il) for c, il in self._expected} if entry is not None else {}
        self._width = sum(self.row[c] for c, _ in self._expected)  # values one token draws per decode
        self._n_head_kv = n_head_kv
        self._at: dict[tuple[str, int], int] = {}  # each site's first component in a row of the decode's noise
        self._noise: DecodeNoise | None = None
        self.plan = GraphPlan({}, {}, {})
        self._host_rows: dict[tuple[int, int, int, int], np.ndarray] = {}
        self._device: DeviceChange | None = None  # device memory changed where it is (kvinject/engine/gpu/device.py)
        self._device_tried = False
        self._staged = {"k": Staging(), "v": Staging()}
        self._work = Workspace()
        self._error: BaseException | None = None
        # The compiled callback's state; ctypes and numpy must keep all of it alive as long
        # as the llama context holds the pointers.
        self._sites = np.zeros((2 * n_layer, gh.SITE_COLUMNS), np.int64)
        for c, il in self._names.values():
            self._sites[_site(c, il), gh.WANTED] = 1
        self._groups = np.zeros(2 * n_layer, np.int64)
        self._sums = np.zeros((2, gc.N_SUMS), np.float64)  # the compiled side's, this decode
        self._total_sums = np.zeros((2, gc.N_SUMS), np.float64)  # and over the finished decodes
        # --positions: the rows of the decode that get the error; --heads: the components of a
        # row that do; and the sums of the others.
        self._columns = {c: target.columns(self.row[c], n_head_kv) for c in "kv"}
        self._column_bytes = {c: cols.astype(np.uint8) for c, cols in self._columns.items() if cols is not None}
        self._selective = target.positions is not None or target.heads is not None
        self._mask: np.ndarray | None = None
        self._keep: dict[str, np.ndarray | None] = {}  # this decode's, once the Python side asks
        self._mask_bytes = np.zeros(0, np.uint8)
        self._outside_sums = np.zeros((2, gc.N_SUMS), np.float64)
        self._total_outside = np.zeros((2, gc.N_SUMS), np.float64)
        self._python_outside = Realized.empty()
        self._segments = np.zeros((3, 0), np.int64)  # per segment: stream key (bits), first value, rows
        law = entry.law if entry is not None else None
        self._law = np.zeros(gh.LAW_SLOTS, np.float64)
        self._law[: len(law or ())] = law or ()
        self._python_apply = _APPLY(self._apply)
        # Faults in quantized blocks: taken where K/V enter, flipped in the blocks once llama.cpp
        # has written them (:meth:`_written`), before attention reads them.
        self._blocks = BlockFaults(entry.blocks, entry.secded) if entry is not None and entry.blocks else None
        self._python_written = _APPLY(self._written)
        self._queue = np.zeros((2 * n_layer, 3), np.int64)
        self._head = head = np.zeros(gh.HEADER, np.int64)
        head[gh.QUEUE] = self._queue.ctypes.data
        head[gh.RUN_SITE] = -1
        head[gh.N_SITES] = 2 * n_layer
        head[gh.SITES] = self._sites.ctypes.data
        head[gh.GROUPS] = self._groups.ctypes.data
        head[gh.SUMS] = self._sums.ctypes.data
        head[gh.OUTSIDE_SUMS] = self._outside_sums.ctypes.data
        for c, slot in (("k", gh.COLUMNS_K), ("v", gh.COLUMNS_V)):
            head[slot] = self._column_bytes[c].ctypes.data if c in self._column_bytes else 0
        head[gh.LAW] = self._law.ctypes.data
        head[gh.ROW_K], head[gh.ROW_V] = row_k, row_v
        head[gh.PREFIX_K], head[gh.PREFIX_V] = (gc.prefix(self._node_name(c, 0)) for c in "kv")
        head[gh.NATIVE] = law is not None
        head[gh.PRE_ROPE] = self._pre_rope = entry is not None and entry.pre_rope
        head[gh.PYTHON_APPLY] = ctypes.cast(self._python_apply, ctypes.c_void_p).value
        head[gh.WRITTEN] = ctypes.cast(self._python_written, ctypes.c_void_p).value if self._blocks else 0
        head[gh.IS_HOST], head[gh.IS_CONTIGUOUS], head[gh.BUFFER_NAME] = (
            ctypes.cast(fn, ctypes.c_void_p).value
            for fn in (ggml.lib().ggml_backend_buffer_is_host, ggml.lib().ggml_is_contiguous, ggml.lib().ggml_backend_buffer_name)
        )
        self.writes = CacheWrites(head, n_layer) if error.resident is not None else None
        self.attention: AttentionSums | None = None
        self.hidden: HiddenCells | None = None
        self.queries: Queries | None = None
        self._n_layer = n_layer
        self.callback = ll.ggml_backend_sched_eval_callback(gc.callback.address)
        self.user_data = ctypes.c_void_p(head.ctypes.data)

    @property
    def header(self) -> np.ndarray:
        """The compiled callback's state, which other readers of the graph share (kvinject/engine/graph/residual_stream.py)."""
        return self._head

    def attend(self, n_cells: int) -> None:
        """Read every layer's attention weights from the graph (a cache-resident model that
        evicts by attention; ``n_cells``: the context's cells)."""
        self.attention = AttentionSums(self._head, n_cells)

    def read_queries(self, width: int) -> None:
        """Read every layer's queries before RoPE at each decode (eviction by query statistics)."""
        self.queries = Queries(self._head, self._n_layer, width)

    def hide_cells(self, n_cells: int) -> HiddenCells:
        """Hide cells from some KV heads of a layer (eviction per head or per layer): the table."""
        self.hidden = HiddenCells(self._head, self._n_layer, self._n_head_kv, n_cells)
        return self.hidden

    def stream(self, rng: np.random.Generator, tokens: int | None = None, generated: int = 0) -> Draws | Variates | None:
        """A noise stream for one benchmark item of ``tokens`` prompt tokens, if known, and up to
        ``generated`` tokens decoded after them (None for error models without randomness)."""
        rows = {self.row[c] for c, _ in self._expected}
        row = rows.pop() if len(rows) == 1 else 0  # faults in a row of memory need every row of one length
        return self.error.stream(rng, (tokens * self._width, generated * self._width, row) if tokens is not None else None)

    def layout(self, segments: list[tuple[Draws | None, int]], mask: np.ndarray | None = None) -> None:
        """Announce the next decode: runs of consecutive batch rows, each with the noise stream
        of the item they belong to. Each stream is read in the same order as if its item were
        decoded alone, so an item's noise does not depend on what shares its decodes. With
        ``--positions``, ``mask`` says which rows get the error; the others' noise is drawn
        all the same and left unused, so the noise of a row does not depend on the mask."""
        head, entry = self._head, self.entry
        head[gh.ROWS] = sum(rows for _, rows in segments)
        head[gh.AT] = 0
        self._mask = mask
        self._keep.clear()
        if mask is not None:
            if self._mask_bytes.size < mask.size:
                self._mask_bytes = np.zeros(2 * mask.size, np.uint8)
            self._mask_bytes[: mask.size] = mask
        head[gh.MASK] = 0 if mask is None else self._mask_bytes.ctypes.data
        if self.writes is not None:
            self.writes.layout(int(head[gh.ROWS]))
        if self.attention is not None:
            self.attention.layout(int(head[gh.ROWS]))
        if self.queries is not None:
            self.queries.layout(int(head[gh.ROWS]))
        if entry is not None and entry.random:  # a cache-resident model draws its own
            self._noise = noise = DecodeNoise([(draws.block(rows * self._width), rows) for draws, rows in segments], [draws for draws, _ in segments])
        if self._device is not None:  # before the claims launch kernels
            self._device.lay_out_decode(self._noise, mask, int(head[gh.ROWS]))
        if not head[gh.NATIVE]:
            head[gh.N_SEG] = 0
            return
        if entry.random:
            runs = [(np.uint64(block.variates.key).view(np.int64), block.start, rows) for block, rows in noise.blocks]
        else:  # compiled without noise (a rounding): one run of every row
            runs = [(0, 0, head[gh.ROWS])]
        if self._segments.shape[1] < len(runs):
            self._segments = np.zeros((3, 2 * len(runs)), np.int64)
            head[gh.SEG_KEY], head[gh.SEG_START], head[gh.SEG_ROWS] = (a.ctypes.data for a in self._segments)
        for i, run in enumerate(runs):
            self._segments[:, i] = run
        head[gh.N_SEG] = len(runs)

    def locate(self, placed: Placed) -> list[dict[str, object]]:
        """Where each change of ``placed`` that its item's decodes read landed (:func:`kvinject.engine.sites.locate`)."""
        return locate(placed, self._at, self.row, self._width, self._n_head_kv)

    @staticmethod
    def _node_name(component: str, layer: int) -> bytes:
        """The graph name of the final K or V of a layer in llama.cpp's model graphs; the
        compiled callback reads names as a four-byte prefix, '-' and the layer."""
        return f"{component.upper()}cur-{layer}".encode()

    def learn(self, decode: Callable[[], None]) -> None:
        """Run ``decode`` (one llama_decode) with the hook recording the graph's nodes and
        claiming none, then plan the claims."""
        head = self._head
        learned = np.zeros(LEARN_CAPACITY, np.int64)
        head[gh.LEARNED], head[gh.LEARN_CAP], head[gh.N_LEARNED] = learned.ctypes.data, LEARN_CAPACITY, 0
        head[gh.MODE] = gh.LEARN
        try:
            decode()
        finally:
            head[gh.MODE] = gh.RUN
        self._raise_native_error()
        # The graph's nodes stay in the context's compute memory until the next decode.
        ptrs = [int(ptr) for ptr in learned[: head[gh.N_LEARNED]]]
        if ptrs:
            ggml.check_layout(ptrs[0])
        nodes = [GraphNode.read(ptr) for ptr in ptrs]
        if self.writes is not None:
            self.writes.learn(ptrs)
        names = dict(self._names)
        if self._pre_rope:  # K as RoPE reads it may carry a tag (Gemma's Kcur_normed-<il>), as the callback allows
            for node in nodes:
                m = _TAGGED_K.fullmatch(node.name)
                if m and len(node.name) < 16 and ("k", int(m[1])) in self._expected:
                    names.setdefault(node.name, ("k", int(m[1])))
        self.plan = GraphPlan.learn(nodes, names, self._pre_rope)
        missing = sorted(self._names[n] for n in set(self._names) - set(self.plan.n_runs))
        if missing:
            raise ModelError(
                "the K/V hook did not find the targeted cache writes in this model's graph "
                f"(missing {len(missing)} of {len(self._names)}, e.g. {missing[:4]}): this "
                "architecture names its K/V nodes differently and is not supported yet"
            )
        for name, (c, il) in self._names.items():
            self._sites[_site(c, il), [gh.N_RUNS, gh.CLAIM_RUN, gh.FINAL_OP]] = self.plan.n_runs[name], self.plan.claim_run[name], self.plan.final_op[name]
        at = 0
        for claimed, together in self.plan.claims.items():
            row = self._sites[_site(*self._names[claimed])]
            row[gh.GROUP_START], row[gh.GROUP_LEN] = at, len(together)
            for name in together:
                self._groups[at] = _site(*self._names[name])
                at += 1

    @interrupts.callback
    def _apply(self, n: int) -> None:
        """The Python side of the changes at one claim the compiled callback does not make itself."""
        try:
            try:
                for ptr, site, at in self._queue[:n].tolist():
                    self._at["kv"[site & 1], site // 2] = at
                    if self._noise is not None:
                        self._noise.at = at
                    self._perturb(ptr, "kv"[site & 1], site // 2, at)
            finally:
                if self._device is not None:  # before llama.cpp reads what the kernels change
                    self._device.wait()
        except BaseException as e:  # an exception must not cross into C; raised after the decode
            if self._error is None:
                self._error = e

    def _perturb(self, ptr: int, component: str, layer: int, at: int) -> None:
        t = ggml.tensor(ptr)
        if self._blocks is not None:  # the values enter unchanged; their blocks are flipped once written
            self._blocks.stage(component, layer, self._noise.take(ggml.numel(t)).reshape(-1, self.row[component]), self._noise.noter())
            return
        x = self._host_rows.get((ptr, t.data, t.ne[2], t.ne[3]))
        if x is None:
            x = self._rows(ptr, t, component)
        if not isinstance(x, np.ndarray) and (on_device := self._device_for(t, x[1])) is not None:
            on_device.change(t.data, x[0], x[1], component, at)
            return
        # The model changes every value (each value's noise is read as without --positions or
        # --heads); the rows and heads they leave out get their values back.
        keep = self._kept(component)
        if isinstance(x, np.ndarray):  # host memory: change it in place
            before, after = self._staged[component].slots(x.size, self.entry.parts_at(component, layer, self.row[component]))
            np.copyto(before, x.reshape(-1))
            self.entry.apply_at(x, self._noise, component, layer)
            if keep is not None:
                x[keep] = before.reshape(x.shape)[keep]
            np.copyto(after, x.reshape(-1))
        else:  # device memory the kernels cannot change: copy out and back
            before, after = self._staged[component].slots(x[0] * x[1], self.entry.parts_at(component, layer, self.row[component]))
            ggml.lib().ggml_backend_tensor_get(ptr, before.ctypes.data, 0, before.nbytes)
            np.copyto(after, before)
            self.entry.apply_at(after.reshape(x), self._noise, component, layer)
            if keep is not None:
                after.reshape(x)[keep] = before.reshape(x)[keep]
            ggml.lib().ggml_backend_tensor_set(ptr, after.ctypes.data, 0, after.nbytes)

    @interrupts.callback
    def _written(self, ptr: int) -> None:
        """A cache write computed: flip the bits of its blocks this decode's faults name, and
        account for the change in values."""
        try:
            changed = self._blocks.written(ptr)
            if changed is not None:
                component, before, after = changed
                getattr(self._python_realized, component).add(before, after, 1, self._work)
        except BaseException as e:  # an exception must not cross into C; raised after the decode
            if self._error is None:
                self._error = e

    def _rows(self, ptr: int, t: ggml.GgmlTensor, component: str) -> np.ndarray | tuple[int, int]:
        """A (rows, row) float32 view of host memory, or the (rows, row) shape of device
        memory (the compiled callback has checked that it is contiguous f32 rows)."""
        n, row = ggml.numel(t), self.row[component]
        if not ggml.buffer_test(int(self._head[gh.IS_HOST]))(t.buffer):  # as the compiled callback asks
            return (n // row, row)
        # The scheduler reuses its graph nodes and compute buffers, so the same key recurs.
        x = np.frombuffer((ctypes.c_float * n).from_address(t.data), dtype=np.float32).reshape(-1, row)
        self._host_rows[ptr, t.data, t.ne[2], t.ne[3]] = x
        return x

    def _device_for(self, t: ggml.GgmlTensor, row: int) -> DeviceChange | None:
        """The device path for rows of ``row`` in device memory (created at the first), or None
        where they are copied: no law for it (kvinject/engine/laws.py), no CUDA here, or another device.
        Once created, the compiled callback launches the kernels of later claims itself."""
        if not self._device_tried:
            self._device_tried = True
            law = self.entry.device_law
            if law is not None and device.usable():
                self._device = DeviceChange(law, self._columns, self.row)
                self._device.lay_out_decode(self._noise, self._mask, int(self._head[gh.ROWS]))
                if self._device.claims is not None:
                    self._head[gh.DEVICE] = self._device.claims.table.ctypes.data
        if self._device is None or not self._device.span_fits(row) or not device.first_cuda_buffer(int(self._head[gh.BUFFER_NAME]), t.buffer):
            return None
        return self._device

    def _kept(self, component: str) -> np.ndarray | None:
        """The (rows, row) values of this decode's ``component`` that keep their values: the
        rows --positions leaves out and the heads --heads does (None: none); computed once a
        decode, for every site the Python side changes and its statistics."""
        if component not in self._keep:
            cols = self._columns[component]
            if self._mask is None and cols is None:
                self._keep[component] = None
            else:
                rows = self._mask if self._mask is not None else np.ones(int(self._head[gh.ROWS]), bool)
                self._keep[component] = ~np.outer(rows, cols if cols is not None else np.ones(self.row[component], bool))
        return self._keep[component]

    @property
    def claims(self) -> int:
        """Graph nodes claimed so far, each a split of llama.cpp's graph computation."""
        return int(self._head[gh.CLAIMS])

    @property
    def site_counts(self) -> dict[tuple[str, int], int]:
        """(component, layer) -> cache writes perturbed."""
        return {site: self._decodes for site in self._expected | self._resident_sites}

    @property
    def sites(self) -> frozenset[tuple[str, int]]:
        """The (component, layer) sites it claims, at which llama.cpp's graph is split."""
        return frozenset(self._expected)

    def credit(self, draws: Draws, tokens: int, counted: Realized) -> None:
        """A prompt of ``tokens`` restored instead of decoded (kvinject/engine/cache/prefills.py):
        its values are passed over in the item's stream ``draws`` and ``counted`` as they were."""
        draws.block(tokens * self._width)
        self._python_realized.merge(Realized(counted.k, counted.v, parts=counted.parts))
        if counted.outside is not None:
            self._python_outside.merge(counted.outside)

    @property
    def realized(self) -> Realized:
        """What the hook did to K and V so far."""
        sums, outside = self._total_sums, self._total_outside
        if self._device is not None:  # the kernels' sums, kept on the device
            on_device, outside_on_device = self._device.totals(self._selective)
            sums, outside = sums + on_device, outside + outside_on_device
        realized = Realized(*(RealizedStats.from_sums(s) for s in sums))
        realized.merge(self._python_realized)
        if self._selective:
            realized.outside = Realized(*(RealizedStats.from_sums(s) for s in outside))
            realized.outside.merge(self._python_outside)
        return realized

    def finish_decode(self) -> Writes | None:
        """Call after each llama_decode: re-raises errors from the callback, checks that every
        targeted K/V was reached once, and folds this decode into the statistics. For a
        cache-resident model, returns where the decode wrote K and V."""
        try:
            self._raise_errors()
            writes = self._read_writes() if self.writes is not None else None
            if self.entry is not None:
                self._check_claims()
            self._decodes += 1
            return writes
        finally:
            self._reset()

    def _read_writes(self) -> Writes:
        writes = self.writes.read()
        writes.check(self._resident_sites)
        if self.queries is not None:
            writes = replace(writes, queries=self.queries.read())
        return writes if self.attention is None else replace(writes, attention=self.attention.read(self._n_layer))

    def _check_claims(self) -> None:
        """Every targeted K/V claimed once; this decode's changes folded into the statistics."""
        if self._blocks is not None:
            self._blocks.check_written()
        hits = self._sites[self._expected_rows, gh.HITS]
        if (hits != 1).any():
            missing = sorted(("kv"[s & 1], s // 2) for s, n in zip(self._expected_rows.tolist(), hits.tolist()) if n == 0)
            raise InjectionError(
                f"this decode perturbed {np.count_nonzero(hits)} of the {len(hits)} targeted "
                f"K/V cache writes (missing e.g. {missing[:4]}); was the decode larger than one ubatch?"
            )
        self._total_sums += self._sums
        self._total_outside += self._outside_sums
        if self._device is not None and self._device.laid_out:
            self._device.fold(keep=True)
        for c in "kv":
            if self._staged[c].sites:
                self._staged[c].fold(c, self.row[c], self._kept(c), self.entry.unchanged, self._python_realized, self._python_outside, self._work)

    def abort_decode(self) -> None:
        """Call after a failed llama_decode: re-raises an error from inside the callback, which
        explains the failure best, and forgets the decode."""
        try:
            self._raise_errors()
        finally:
            self._reset()

    def _raise_errors(self) -> None:
        error, self._error = self._error, None
        if error is not None:
            if isinstance(error, (InjectionError, ModelError, KeyboardInterrupt)):
                raise error
            raise HookError(f"error inside the K/V hook: {type(error).__name__}: {error}") from error
        self._raise_native_error()

    def _raise_native_error(self) -> None:
        code, site, value = self._head[[gh.ERROR, gh.ERROR_SITE, gh.ERROR_VALUE]].tolist()
        if code:
            self._head[gh.ERROR] = 0
            raise native_error(code, self._node_name("kv"[site & 1], site // 2).decode(), value, int(self._head[gh.ROWS]))

    def _reset(self) -> None:
        self._sites[:, gh.SEEN :] = 0
        self._sums[:] = 0
        self._outside_sums[:] = 0
        self._mask = None
        self._keep.clear()
        self._head[gh.MASK] = 0
        self._head[gh.RUN_SITE] = -1
        self._head[gh.ERROR] = 0
        self._noise = None
        if self._blocks is not None:
            self._blocks.clear()
        if self._device is not None and self._device.laid_out:  # a failed decode's: dropped
            self._device.fold(keep=False)
        for staged in self._staged.values():
            staged.clear()
        if self.writes is not None:
            self.writes.reset()
        if self.attention is not None:
            self.attention.reset()


def _sites(target: Target, n_layer: int) -> set[tuple[str, int]]:
    return {(c, il) for il in range(n_layer) for c in "kv" if target.wants(c, il)}


def _site(component: str, layer: int) -> int:
    """A K or V's row in the compiled callback's tables."""
    return 2 * layer + (component == "v")
