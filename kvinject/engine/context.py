"""A llama.cpp context with one error configuration: decoding, logits and greedy generation."""

from __future__ import annotations

import ctypes
import os
import re
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Iterator, Sequence

import numpy as np
from llama_cpp import llama_cpp as ll

from ..exceptions import InjectionError, ModelError, SpecError
from .batch import Batch
from .cache.prefills import Prefills, Seen, Snapshot
from .cache.resident_cache import ResidentCache
from .cache_bits import cache_bits
from .ggml import CACHE_TYPES
from .graph.cache_writes import Writes
from .llama_log import captured_log
from .options import CacheOptions
from .perturbation import ErrorModel, NoError, check_configuration
from .positions import Spans
from .realized_error import Realized
from .sites import Placed
from .target import Target
from .variates import Draws, Variates

if TYPE_CHECKING:
    from .model import Model


@contextmanager
def _rotation(enabled: bool) -> Iterator[None]:
    """llama.cpp reads LLAMA_ATTN_ROT_DISABLE when a context is created."""
    old = os.environ.get("LLAMA_ATTN_ROT_DISABLE")
    if not enabled:
        os.environ["LLAMA_ATTN_ROT_DISABLE"] = "1"
    else:
        os.environ.pop("LLAMA_ATTN_ROT_DISABLE", None)
    try:
        yield
    finally:
        if old is None:
            os.environ.pop("LLAMA_ATTN_ROT_DISABLE", None)
        else:
            os.environ["LLAMA_ATTN_ROT_DISABLE"] = old


# llama_get_logits and llama_get_logits_ith giving the address as an int, which their own bindings
# wrap in a POINTER(c_float) to be cast again.
_logits_address = ctypes.CFUNCTYPE(ctypes.c_void_p, ctypes.c_void_p)(ctypes.cast(ll.llama_get_logits, ctypes.c_void_p).value)
_logits_ith_address = ctypes.CFUNCTYPE(ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int32)(ctypes.cast(ll.llama_get_logits_ith, ctypes.c_void_p).value)

_KV_SIZE = re.compile(r"llama_kv_cache: size = +([\d.]+) MiB .*K \((\w+)\): +([\d.]+) MiB, V \((\w+)\): +([\d.]+) MiB")


@dataclass
class _Watch:
    """A prompt to snapshot: its sequence, the tokens to decode first, where to keep it."""

    seq: int
    end: int
    key: tuple
    prefills: Prefills
    seen: list[Seen] = field(default_factory=list)
    spared: Realized | None = None  # an item's spared prompt: what the hook counted of its values


class Context:
    """One llama context: a KV cache with its storage types, and the hook for one error model.

    ``n_seq`` sequences share the cache (``n_ctx`` cells in all, ``n_ctx // n_seq`` for
    each): one pool of cells, or with ``streams`` one stream of cells per sequence, so that a
    token attends over its own sequence's cells instead of every cell in use (llama.cpp computes
    attention over the whole pool up to the last cell used and masks the other sequences'). With
    streams llama.cpp computes a decode in one graph, which the hook relies on, only where it
    holds the same number of tokens of consecutive sequences (one prompt piece; a generation
    step's tokens of sequences 2, 3 and 4). Noise and sampling are seeded per sequence: by
    ``(seed, run, item)`` for the item started on it with :meth:`begin_item`, by ``(seed, run)``
    for sequence 0 otherwise; the same settings and seed reproduce exactly. With ``residual``, each layer's output of every
    decode can be read after it (:attr:`residual`, kvinject/engine/graph/residual_stream.py).
    """

    def __init__(
        self,
        model: Model,
        cache: CacheOptions | None = None,
        error: ErrorModel | None = None,
        target: Target | None = None,
        seed: int = 0,
        run: int = 0,
        n_ctx: int = 2048,
        n_seq: int = 1,
        n_batch: int = 512,
        residual: bool = False,
        streams: bool = False,
    ):
        if seed < 0 or run < 0:
            raise SpecError(f"seeds and runs are integers >= 0, got seed {seed}, run {run}")
        self.model = model
        self.cache = cache or CacheOptions()
        self.error = error or NoError()
        self.target = target or Target()
        self.n_batch = min(n_batch, n_ctx)
        if n_seq > self.n_batch:
            raise ValueError(f"{n_seq} sequences need a batch of at least {n_seq} tokens, not {self.n_batch}")
        check_configuration(self.error, self.target, self.cache, model.shape)
        if streams and self.error.resident is not None:  # it reads and writes cells by their index in one pool
            raise InjectionError(f"'{self.error.name}' changes cells of a cache whose sequences share one pool: it cannot run with a stream per sequence")
        self.streams = streams and n_seq > 1
        self.hook = self._make_hook(model) if self.error.injects else None
        self.residual = None
        if residual:
            from .graph.residual_stream import ResidualStream

            self.residual = ResidualStream(model.n_layer, model.n_embd, self.hook.header if self.hook is not None else None)
        self.seed, self.run = seed, run
        self.n_seq = n_seq
        self.n_ctx_seq = n_ctx // n_seq
        self._noise: dict[int, Draws | Variates | None] = {}
        # Per sequence, its sampling generator, or until it first samples the seed it is made from:
        # greedy generation never draws, and making one took 20 µs a prompt.
        self._sampling: dict[int, np.random.Generator | list[int]] = {}
        self._spans: dict[int, Spans] = {}  # the spans --positions may name, per sequence
        self._lengths: dict[int, int] = {}  # tokens decoded per sequence, for bits per element
        self._finished: list[int] = []  # and of the sequences forgotten
        self._watches: dict[int, _Watch] = {}  # per sequence, a prompt to snapshot once decoded far enough (kvinject/engine/cache/prefills.py)
        self._seed(0, [seed, run])
        self._ptr = self._llama_context(model, n_ctx, n_seq)
        self.n_vocab = model.n_vocab
        self._batch = Batch(self.n_batch)
        self._outputs: dict[int, tuple[int, np.ndarray]] = {}  # output_logits' view of n rows, with the address it is at
        self.resident = self._make_resident(model) if self.error.resident is not None else None
        if self.hook is not None:
            self.hook.learn(lambda: self._llama_decode([(model.bos, 0, 0, False)]))
            self.clear()

    def _make_hook(self, model: Model):
        # Imported here: the compiled callback maps about 50 MB of numba's compiler state, which
        # a context with nothing to hook (a control) need not load.
        from .graph.hook import KVHook

        return KVHook(
            self.error.stored(self.cache, self.target.components).fit(model, self.cache),
            self.target,
            model.n_layer,
            model.n_head_kv * model.head_dim_k,
            model.n_head_kv * model.head_dim_v,
            model.n_head_kv,
        )

    def _llama_context(self, model: Model, n_ctx: int, n_seq: int):
        """llama.cpp's context for this cache, with the hook (or the residual reader) as its
        evaluation callback."""
        params = ll.llama_context_default_params()
        params.n_ctx = n_ctx
        params.n_batch = params.n_ubatch = self.n_batch  # one graph per decode: the hook relies on it
        params.n_seq_max = n_seq
        params.kv_unified = not self.streams
        params.n_threads = params.n_threads_batch = model.backend.n_threads
        params.type_k = CACHE_TYPES[self.cache.type_k]
        params.type_v = CACHE_TYPES[self.cache.type_v]
        params.flash_attn_type = self.cache.flash_attn_type
        params.no_perf = True
        if self.hook is not None:
            params.cb_eval = self.hook.callback
            params.cb_eval_user_data = self.hook.user_data
        elif self.residual is not None:
            params.cb_eval = self.residual.callback
            params.cb_eval_user_data = self.residual.user_data
        with _rotation(self.cache.kv_rotation), captured_log() as self.creation_log:
            ptr = ll.llama_init_from_model(model.ptr, params)
        if not ptr:
            tail = "".join(self.creation_log[-5:]).strip()
            raise ModelError(f"llama.cpp could not create a context with {self.cache.label}, n_ctx={n_ctx}: {tail}")
        return ptr

    def _make_resident(self, model: Model) -> ResidentCache:
        """What a cache-resident model reads and changes between decodes, and what the hook must
        read for it (queries, attention)."""
        resident = self.error.resident
        memory = ll.llama_get_memory(self._ptr)
        n_cells = ll.llama_n_ctx(self._ptr)
        cache = ResidentCache(
            resident,
            self.error.split(self.target)[1],
            model.n_layer,
            n_cells,
            lambda seq, p0, p1: ll.llama_memory_seq_rm(memory, seq, p0, p1),
            self._noise,
            model.n_head_kv,
            self._spans,
            self.hook.writes.tensors,  # learned by the hook's first decode, after this
            self.hook.hide_cells(n_cells) if resident.hides else None,
            model.rope,
        )
        if resident.queries:
            self.hook.read_queries(model.n_head * model.head_dim_k)
        if resident.attention:
            self.hook.attend(n_cells)
        return cache

    def _seed(self, seq: int, key: list[int], tokens: int | None = None, generated: int = 0) -> None:
        if self.hook is not None:
            self._noise[seq] = self.hook.stream(np.random.default_rng(key), tokens, generated)
        self._sampling[seq] = [*key, 1]

    def begin_item(self, item: int, seq: int = 0, tokens: int | None = None, generated: int = 0) -> None:
        """Start benchmark item ``item`` on sequence ``seq``: an empty cache for it, and noise
        and sampling seeded from (seed, run, item) whichever sequence and batch it runs in.
        ``tokens``: the item's prompt length, and ``generated``: how many tokens may be decoded
        after it, for error models that place faults in them."""
        if seq >= self.n_seq:
            raise ValueError(f"sequence {seq} out of range: the context has {self.n_seq}")
        self.forget(seq)
        self._seed(seq, [self.seed, self.run, item], tokens, generated)

    def reseed(self, item: int, seq: int) -> None:
        """Seed sequence ``seq``'s noise and sampling from (seed, run, ``item``) from here on,
        keeping its cells: a continuation after a context decoded for several."""
        self._seed(seq, [self.seed, self.run, item])

    def faults(self, seq: int) -> list[dict[str, object]] | None:
        """Where the faults of the item on sequence ``seq`` landed so far (an error model that
        places a fixed set of changes, ``faults``); None for other models."""
        draws = self._noise.get(seq)
        return self.hook.locate(draws) if self.hook is not None and isinstance(draws, Placed) else None

    def mark(self, seq: int, spans: Spans) -> None:
        """Name spans of the tokens of sequence ``seq`` (prompt, generated, a benchmark's), by
        position, for ``--positions``; until the sequence is forgotten."""
        self._spans[seq] = spans

    def break_in(self, seq: int, start: int, stop: int) -> int | None:
        """Where a prompt piece of ``seq`` from ``start`` to ``stop`` must end early: at the end
        of the span the context's cache-resident model acts after (its ``breaks_at``), if that
        falls inside the piece or at its end (where it must ask for logits all the same)."""
        name = self.error.resident.breaks_at if self.error.resident is not None else None
        end = self.resident.span_end(seq, name) if name else None
        return end if end is not None and start < end <= stop else None

    def resume(self, seq: int, prompt: Sequence[int], prefills: Prefills | None) -> tuple[int, np.ndarray | None]:
        """For a prompt begun on ``seq`` (its spans marked), the part that every configuration
        sharing ``prefills`` decodes alike (kvinject/engine/cache/prefills.py): restored if a snapshot
        of it is kept, returning how many tokens that is and, where that is the whole prompt, its
        last token's logits; otherwise a snapshot is taken once the decodes get there (0, None).
        Two kinds share: a cache-resident model that acts at the prompt's end
        (``shares_prefill``), with one sequence in the context, replaying what it saw; and an item
        whose placed faults all fall after its prompt (``Placed.spares``), with one sequence or a
        stream of cells per sequence, crediting the prompt's unchanged values to the statistics."""
        if prefills is None:
            return 0, None
        if self.error.resident is not None:
            return self._resume_resident(seq, prompt, prefills)
        draws = self._noise.get(seq)
        if not isinstance(draws, Placed) or not draws.spares(draws.prompt) or not (self.n_seq == 1 or self.streams):
            return 0, None
        # The graph's splits at the claimed sites are part of how the prompt was computed.
        key = ("spared", self.cache, self.n_ctx_seq, self.n_batch, self.hook.sites, tuple(prompt))
        return self._restore(seq, len(prompt), key, prefills)

    def _resume_resident(self, seq: int, prompt: Sequence[int], prefills: Prefills) -> tuple[int, np.ndarray | None]:
        resident = self.error.resident
        if not resident.shares_prefill or self.n_seq != 1:
            return 0, None
        name = resident.breaks_at
        end = self.resident.span_end(seq, name) if name else len(prompt)
        key = (self.cache, self.n_ctx_seq, self.n_batch, resident.attention, resident.queries, tuple(prompt[:end]))
        ll.llama_memory_clear(ll.llama_get_memory(self._ptr), False)  # the cells from 0 on, as a restore puts them
        end, logits = self._restore(seq, end, key, prefills)
        return end, logits if end == len(prompt) else None  # a context's end asks for logits only so that the model acts

    def _restore(self, seq: int, end: int, key: tuple, prefills: Prefills) -> tuple[int, np.ndarray | None]:
        """Restore the snapshot kept under ``key`` into ``seq`` (an empty sequence, so that its
        cells start at 0 as a restore puts them), or watch for it; see :meth:`resume`."""
        snapshot = prefills.get(key)
        if snapshot is None:
            self._watches[seq] = _Watch(seq, end, key, prefills, spared=Realized.empty() if self.resident is None else None)
            return 0, None
        if ll.llama_state_seq_set_data(self._ptr, snapshot.state, len(snapshot.state), seq) != len(snapshot.state):
            raise InjectionError(f"llama.cpp could not restore the snapshot of a prompt's first {end} tokens")
        for seen in snapshot.seen:
            self.resident.after_decode(list(seen.entries), seen.writes)
        if snapshot.spared is not None:  # the prompt's values, as the decode that kept it counted them
            self.hook.credit(self._noise[seq], end, snapshot.spared)
        self._lengths[seq] = end
        return end, snapshot.logits

    def _snapshot(self, watch: _Watch, entries: Sequence[tuple[int, int, int, bool]], writes: Writes | None, before: Realized | None) -> None:
        """Note a decode of a watched prompt; at its end, keep the snapshot (before the model acts)."""
        if watch.spared is not None:
            watch.spared.merge(self.hook.realized.less(before))
        else:
            watch.seen.append(Seen(tuple(entries), writes))
        if entries[-1][1] + 1 < watch.end:
            return
        del self._watches[watch.seq]
        if watch.seen:
            cells = np.concatenate([s.writes.cells for s in watch.seen], axis=1)
            if not (cells == np.arange(watch.end)).all():
                return  # elsewhere than a restore would put them
        state = (ctypes.c_uint8 * ll.llama_state_seq_get_size(self._ptr, watch.seq))()
        ll.llama_state_seq_get_data(self._ptr, state, len(state), watch.seq)
        logits = self.logits(len(entries) - 1).copy() if entries[-1][3] else None
        watch.prefills.put(watch.key, Snapshot(watch.end, state, tuple(watch.seen), logits, watch.spared))

    def forget(self, seq: int) -> None:
        """Remove one sequence's cells from the cache."""
        self._watches.pop(seq, None)
        self._spans.pop(seq, None)
        self._finish(seq)
        ll.llama_memory_seq_rm(ll.llama_get_memory(self._ptr), seq, -1, -1)
        if self.resident is not None:
            self.resident.forget(seq)

    def share(self, src: int, dst: int) -> None:
        """Give sequence ``dst`` the cells of ``src`` (llama_memory_seq_cp): a context decoded
        once, and its K/V with their error, serves several continuations. Not for a
        cache-resident model, which tracks each sequence's tokens from position 0 on."""
        if self.resident is not None:
            raise InjectionError(f"'{self.error.name}' changes each sequence's own cells: sequences cannot share them")
        if self.streams:  # llama.cpp copies between streams only whole, and only once the decode is over
            raise InjectionError("sequences with a stream of cells each cannot share cells: make the context without streams")
        ll.llama_memory_seq_cp(ll.llama_get_memory(self._ptr), src, dst, -1, -1)
        self._lengths[dst] = self._lengths.get(src, 0)

    def _finish(self, seq: int) -> None:
        n = self._lengths.pop(seq, 0)
        if n:
            self._finished.append(n)

    def close(self) -> None:
        if self._ptr:
            self._outputs.clear()
            ll.llama_free(self._ptr)
            self._ptr = None

    def __enter__(self) -> Context:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    @property
    def realized(self) -> Realized:
        realized = self.hook.realized if self.hook is not None else Realized.empty()
        if self.resident is not None:
            realized.merge(self.resident.realized)
        return realized

    @property
    def cache_bits(self) -> float:
        m = self.model
        lengths, kept = (self.resident.lengths, self.resident.kept) if self.resident is not None else ((*self._finished, *self._lengths.values()), ())
        return cache_bits(self.error, self.target, self.cache, m.n_layer, m.n_head_kv, m.head_dim_k, m.head_dim_v, lengths, kept)

    @property
    def kv_cache_bytes(self) -> dict[str, float] | None:
        """What llama.cpp reported allocating for K and V, in bytes (summed over its caches)."""
        sizes = [m for line in self.creation_log if (m := _KV_SIZE.search(line))]
        if not sizes:
            return None
        mib = 1024 * 1024
        return {"k": sum(float(m[3]) for m in sizes) * mib, "v": sum(float(m[5]) for m in sizes) * mib}

    def clear(self) -> None:
        self._spans.clear()
        self._watches.clear()
        for seq in list(self._lengths):
            self._finish(seq)
        ll.llama_memory_clear(ll.llama_get_memory(self._ptr), True)
        if self.resident is not None:
            self.resident.clear()

    def _llama_decode(self, entries: Sequence[tuple[int, int, int, bool]]) -> None:
        self._batch.fill(entries)
        status = ll.llama_decode(self._ptr, self._batch.struct)
        if status != 0:
            if self.hook is not None:
                self.hook.abort_decode()
            raise InjectionError(f"llama_decode failed with status {status} (KV cache full? raise --ctx)")

    def synchronize(self) -> None:
        """Wait until the device has computed the decodes queued: on a GPU llama_decode returns
        before it has (reading logits waits too), so a timing of decodes alone must wait here."""
        ll.llama_synchronize(self._ptr)

    def decode(self, entries: Sequence[tuple[int, int, int, bool]]) -> None:
        """Decode (token, position, sequence, want_logits) entries, at most n_batch of them;
        keep each sequence's entries together so its rows draw their noise as one run."""
        if len(entries) > self.n_batch:
            raise ValueError(f"{len(entries)} tokens exceed the batch size {self.n_batch}")
        if self.hook is not None:
            self.hook.layout(self._segments(entries), self._selected(entries))
        if self.residual is not None:
            self.residual.layout(np.array([e[3] for e in entries], bool))
        watch = self._watches.get(entries[0][2]) if self._watches else None  # a prompt piece: one sequence's tokens
        before = self.hook.realized if watch is not None and watch.spared is not None else None
        self._llama_decode(entries)
        lengths = self._lengths
        for _, pos, seq, _ in entries:
            if pos >= lengths.get(seq, 0):
                lengths[seq] = pos + 1
        if self.hook is not None:
            writes = self.hook.finish_decode()
            if watch is not None:
                self._snapshot(watch, entries, writes, before)
            if self.resident is not None:  # after the decode, as KIVI quantizes after each step's attention
                self.resident.after_decode(entries, writes)

    def _segments(self, entries: Sequence[tuple[int, int, int, bool]]) -> list[tuple[Draws | None, int]]:
        segments: list[list] = []
        previous = None
        for _, _, seq, _ in entries:
            if seq == previous:
                segments[-1][1] += 1
                continue
            if seq not in self._noise:
                self._seed(seq, [self.seed, self.run, 0, 0, seq])  # never begun: a stream of its own
            segments.append([self._noise[seq], 1])
            previous = seq
        return [(draws, rows) for draws, rows in segments]

    def _selected(self, entries: Sequence[tuple[int, int, int, bool]]) -> np.ndarray | None:
        """The rows of the decode that ``--positions`` selects and the error model's attention
        sinks leave out (None: all)."""
        positions, sinks = self.target.positions, self.error.at_entry.sink_tokens if self.error.at_entry is not None else 0
        if positions is None and not sinks:
            return None
        pos = np.array([p for _, p, _, _ in entries], np.int64)
        if positions is None:
            return pos >= sinks
        seqs = np.array([s for _, _, s, _ in entries], np.int64)
        mask = np.empty(len(entries), bool)
        for seq in np.unique(seqs).tolist():
            rows = seqs == seq
            mask[rows] = positions.select(pos[rows], self._spans.get(seq, {}))
        return mask & (pos >= sinks)

    def logits(self, i: int) -> np.ndarray:
        """The logits of the i-th batch entry of the last decode (-1: the last with logits)."""
        address = _logits_ith_address(self._ptr, i)
        if not address:
            raise InjectionError(f"no logits for batch entry {i}")
        return np.frombuffer((ctypes.c_float * self.n_vocab).from_address(address), np.float32)

    def output_logits(self, n: int) -> np.ndarray:
        """The logits of all ``n`` entries of the last decode that asked for them, in batch order:
        a view of llama.cpp's buffer, made again only where the buffer moved (after a decode on
        the CPU, np.ctypeslib.as_array took about 50 µs to make one)."""
        address = _logits_address(self._ptr)
        if not address:
            raise InjectionError("no logits: nothing decoded yet")
        at, view = self._outputs.get(n, (None, None))
        if at != address:
            view = np.frombuffer((ctypes.c_float * (n * self.n_vocab)).from_address(address), np.float32).reshape(n, self.n_vocab)
            self._outputs[n] = address, view
        return view

    def prefill(self, tokens: Sequence[int], seq: int = 0, pos: int = 0) -> None:
        """Decode a prompt in n_batch pieces, with logits for its last token only."""
        for start in range(0, len(tokens), self.n_batch):
            piece = tokens[start : start + self.n_batch]
            last = start + len(piece) == len(tokens)
            self.decode([(t, pos + start + j, seq, last and j == len(piece) - 1) for j, t in enumerate(piece)])

    def pick(self, logits: np.ndarray, temperature: float, seq: int = 0) -> int:
        if temperature <= 0:
            return int(np.argmax(logits))
        z = logits.astype(np.float64) / temperature
        p = np.exp(z - z.max())
        rng = self._sampling[seq]
        if isinstance(rng, list):
            rng = self._sampling[seq] = np.random.default_rng(rng)
        return int(rng.choice(len(p), p=p / p.sum()))
