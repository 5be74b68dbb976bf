"""Continuous batching: many generations through one context, one sequence each.

A decode holds either one prompt piece (a prompt cut into n_batch pieces, as when its item
runs alone) or the next token of every generating sequence (with a stream of cells per
sequence, of each run of consecutive ones: ``Context.streams``); a sequence that finishes takes
the next prompt at once. So an item's tokens reach the cache in the same groups whatever runs
beside it, and with noise seeded per item (``Context.begin_item``) it gets the same noise.

Decoding prompts alone also keeps more of llama.cpp's kernels as in sequential evaluation:
the CPU backend switches flash attention to a tiled kernel with another summation order at
64 query rows, which moves logits as much as an f16 instead of an f32 cache does. Outputs can
still differ from sequential ones where sequences share one pool of cells (a context without
streams), through where an item's cells lie in it:
attention sums over cells in cell order, and refilling puts an item's later tokens in cells
freed before its earlier ones; and single-query decodes over 512 or more cells split the
cells among threads. docs/performance.md measures both.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field
from math import isfinite
from typing import TYPE_CHECKING, Callable, Iterator, Sequence

import numpy as np

from ... import clock
from ...exceptions import DataError, HookError
from ..positions import MAX_POSITION, Spans

if TYPE_CHECKING:
    from ..cache.prefills import Prefills
    from ..context import Context


@dataclass
class Generation:
    tokens: list[int]
    text: str
    nonfinite_steps: int  # decoding steps whose logits held NaN or Inf
    first_logits: np.ndarray  # the logits after the prompt
    logits: np.ndarray | None = None  # (steps, n_vocab): the logits of every pick, when asked for
    faults: list[dict[str, object]] | None = None  # where each fault landed (Context.faults)
    stopped: str = ""  # why it stopped early: "timeout" or "raised: <the hook's error>" (generate_all's deadline, contain)


@dataclass
class _Slot:
    seq: int
    index: int  # which prompt
    prompt: Sequence[int]  # what is decoded before the first pick: the prompt and the prefix
    fed: int = 0  # of those, tokens decoded so far
    out: list[int] = field(default_factory=list)  # the prefix, then the generated tokens
    prefix: int = 0
    first: np.ndarray | None = None
    nonfinite: int = 0
    rows: list[np.ndarray] | None = None  # every pick's logits, kept when asked for
    start: float = field(default_factory=clock.now)  # seconds the process ran, for the watchdog (kvinject/clock.py)
    stopped: str = ""
    length: int = field(init=False)  # tokens of the sequence: prompt, prefix and generated

    def __post_init__(self) -> None:
        self.length = len(self.prompt) + len(self.out) - self.prefix


def generate_all(
    ctx: Context,
    prompts: Sequence[Sequence[int]],
    max_tokens: int,
    temperature: float = 0.0,
    stop: Callable[[list[int]], bool] | None = None,
    items: Sequence[int] | None = None,
    ignore_eos: bool = False,
    prefixes: Sequence[Sequence[int]] | None = None,
    keep_logits: bool = False,
    spans: Sequence[Spans] | None = None,
    prefills: Prefills | None = None,
    deadline: float | None = None,
    contain: bool = False,
) -> Iterator[tuple[int, Generation]]:
    """Generate after every prompt, up to ``ctx.n_seq`` at a time; yield ``(index, generation)``
    as each finishes. ``items[i]`` seeds prompt ``i`` (``Context.begin_item``; without, the
    sequences keep their streams). Greedy unless temperature > 0; a generation ends at an
    end-of-generation token (unless ``ignore_eos``, as llama-batched-bench), ``stop(tokens)``,
    ``max_tokens`` or the sequence's share of the context; NaN/Inf logits are counted.
    ``prefixes[i]``: tokens already generated after prompt ``i``, decoded with it, with which the
    generation starts. ``keep_logits`` keeps every pick's logits. Tokens are marked ``prompt``
    and ``generated`` (a prefix is generated), with the ``spans[i]`` a benchmark declares, for
    ``--positions``. With ``prefills``, what configurations decode alike of a prompt is decoded
    by the first only (``Context.resume``). Fault campaigns' watchdogs: a generation still going
    ``deadline`` seconds after its sequence took it stops ("timeout"); with ``contain``, a
    HookError in a decode of one sequence's tokens stops that generation ("raised: ...") and the
    others go on (in a decode shared by several, it is raised)."""
    prefixes = prefixes or [()] * len(prompts)
    for p in prompts:
        if not 0 < len(p) < ctx.n_ctx_seq:
            raise DataError(f"a prompt of {len(p)} tokens does not fit a context of {ctx.n_ctx_seq} tokens per sequence (raise --ctx)")
    queue = deque(range(len(prompts)))
    free = list(reversed(range(ctx.n_seq)))
    active: list[_Slot] = []
    feeding: deque[_Slot] = deque()  # the active slots with prompt tokens still to decode, in the order they came
    steps: list[tuple[list[_Slot], list[tuple[_Slot, int]]]] | None = None  # a generation step's decodes, until a slot comes or goes
    while queue or active:
        while queue and free:
            index, seq = queue.popleft(), free.pop()
            item = items[index] if items is not None else None
            slot = _take(ctx, seq, index, prompts[index], prefixes[index], item, max_tokens, spans[index] if spans is not None else {}, keep_logits)
            slot.fed, logits = ctx.resume(seq, prompts[index], prefills) if not slot.prefix else (0, None)
            if logits is not None and _step(ctx, slot, logits, max_tokens, temperature, stop, ignore_eos, deadline):  # the whole prompt restored
                free.append(seq)
                yield index, _generation(ctx, slot)
                continue
            active.append(slot)
            steps = None
            if slot.fed < len(slot.prompt):
                feeding.append(slot)
        # A prompt piece is decoded alone, as when its item runs by itself; generated tokens of
        # all sequences share a decode (each row is computed independently of the others).
        if feeding:
            decodes = [_prompt_piece(ctx, feeding)]
        else:
            if steps is None:
                steps = [(run, [(s, i) for i, s in enumerate(run)]) for run in _steps(active, ctx.streams)]
            decodes = [([(s.out[-1], s.length - 1, s.seq, True) for s in run], asks) for run, asks in steps]
        for entries, asks in decodes:
            try:
                ctx.decode(entries)
            except HookError as e:
                if not contain or len({seq for _, _, seq, _ in entries}) != 1:
                    raise
                slot = _put_down(entries[0][2], f"raised: {e}", active, feeding)
                steps = None
                free.append(slot.seq)
                yield slot.index, _generation(ctx, slot)  # its cells go when the sequence takes the next prompt
                continue
            # When every entry asked (a step, or a prompt piece of one token), the greedy picks of all rows at once.
            rows, picks = _picks(ctx, len(entries), temperature) if len(asks) == len(entries) else (None, None)
            for slot, i in asks:
                logits, token = (rows[i], picks[i]) if rows is not None else (ctx.logits(i), None)
                if _step(ctx, slot, logits, max_tokens, temperature, stop, ignore_eos, deadline, token):
                    active.remove(slot)
                    steps = None
                    free.append(slot.seq)
                    yield slot.index, _generation(ctx, slot)


def _take(ctx: Context, seq: int, index: int, prompt, prefix, item: int | None, max_tokens: int, spans: Spans, keep_logits: bool) -> _Slot:
    """Sequence ``seq`` made ready for prompt ``index``: its item's streams (or the ones it has)
    and its marked spans."""
    if item is not None:
        # Of max_tokens picked, all but the last are decoded (fault campaigns place faults in them).
        ctx.begin_item(item, seq, len(prompt), max(0, min(max_tokens, ctx.n_ctx_seq - len(prompt)) - 1))
    else:
        ctx.forget(seq)
    n = len(prompt)
    ctx.mark(seq, {"prompt": [(0, n)], "generated": [(n, MAX_POSITION + 1)], **spans})
    prefix = list(prefix)
    return _Slot(seq, index, [*prompt, *prefix], out=prefix, prefix=len(prefix), rows=[] if keep_logits else None)


def _put_down(seq: int, why: str, active: list[_Slot], feeding: deque[_Slot]) -> _Slot:
    """The slot of ``seq``, stopped for ``why`` and taken out of the decodes."""
    slot = next(s for s in active if s.seq == seq)
    slot.stopped = why
    active.remove(slot)
    if feeding and feeding[0] is slot:
        feeding.popleft()
    return slot


def _prompt_piece(ctx: Context, feeding: deque[_Slot]) -> tuple[list, list[tuple[_Slot, int]]]:
    """The next piece of the first feeding slot's prompt, as a decode's entries, and the row
    that asks for logits where the piece ends the prompt."""
    slot = feeding[0]
    cut = ctx.break_in(slot.seq, slot.fed, slot.fed + ctx.n_batch)  # a span's end a cache-resident model acts at
    piece = slot.prompt[slot.fed : cut or slot.fed + ctx.n_batch]
    entries = [(t, slot.fed + j, slot.seq, cut is not None and j == len(piece) - 1) for j, t in enumerate(piece)]
    slot.fed += len(piece)
    asks: list[tuple[_Slot, int]] = []
    if slot.fed == len(slot.prompt):
        feeding.popleft()
        entries[-1] = (*entries[-1][:3], True)
        asks = [(slot, len(entries) - 1)]
    return entries, asks


def _steps(active: list[_Slot], streams: bool) -> list[list[_Slot]]:
    """The decodes of one generation step: every generating sequence's next token in one; with
    a stream of cells per sequence (``Context.streams``), one per run of consecutive sequence
    numbers, each of which llama.cpp computes in one graph."""
    if not streams:
        return [active]
    runs: list[list[_Slot]] = []
    for slot in sorted(active, key=lambda s: s.seq):
        if runs and runs[-1][-1].seq == slot.seq - 1:
            runs[-1].append(slot)
        else:
            runs.append([slot])
    return runs


def _picks(ctx: Context, n: int, temperature: float) -> tuple[np.ndarray, list[int | None]]:
    """The logits of a decode whose ``n`` entries all asked for them, and the greedy pick of each
    row whose logits are all finite (None: picked by :func:`_step`). A row at a time: its argmax
    reads it from memory, and its argmin, which lands on a NaN or -Inf as the argmax lands on a
    NaN or +Inf, from the cache, where a second scan of the whole block read it from memory again
    (8 rows of SmolLM2's 49,152 logits are 1.5 MB). Right after a CPU decode of 8 such rows:
    187 µs, against 303 over the whole block and 129 for the argmax alone, which is what reading
    them costs (2026-11-28, 4b2638e, 2-vCPU Xeon @ 2.50GHz VM)."""
    rows = ctx.output_logits(n)
    if temperature > 0:
        return rows, [None] * n
    picks: list[int | None] = []
    for row in rows:
        token = row.argmax()
        picks.append(int(token) if isfinite(row.item(token)) and isfinite(row.item(row.argmin())) else None)
    return rows, picks


def _generation(ctx: Context, slot: _Slot) -> Generation:
    rows = np.array(slot.rows) if slot.rows is not None else None
    first = slot.first if slot.first is not None else np.full(ctx.model.n_vocab, np.nan, np.float32)  # raised before the prompt's end
    return Generation(slot.out, ctx.model.detokenize(slot.out), slot.nonfinite, first, rows, ctx.faults(slot.seq), slot.stopped)


def _step(
    ctx: Context, slot: _Slot, logits: np.ndarray, max_tokens: int, temperature: float, stop, ignore_eos: bool, deadline: float | None, token: int | None = None
) -> bool:
    """Pick the slot's next token from ``logits`` (``token``: picked already from finite logits);
    True when its generation is finished."""
    if slot.rows is not None:
        slot.rows.append(logits.copy())
    if slot.first is None:
        slot.first = logits.copy()
        if max_tokens <= 0:
            return True
    if token is None:
        if not np.isfinite(logits).all():
            slot.nonfinite += 1
            logits = np.nan_to_num(logits, nan=-np.inf)
        token = ctx.pick(logits, temperature, slot.seq)
    if not ignore_eos and ctx.model.is_eog(token):
        return True
    slot.out.append(token)
    slot.length += 1
    if (stop is not None and stop(slot.out)) or slot.length >= ctx.n_ctx_seq or len(slot.out) >= max_tokens:
        return True
    ran = clock.now() - slot.start  # read at every token: a stop drops at most one token's time
    if deadline is not None and ran > deadline:
        slot.stopped = "timeout"
        return True
    return False
