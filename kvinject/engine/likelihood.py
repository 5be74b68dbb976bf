"""The log-likelihood of continuations: how probable a context makes each continuation's tokens
under a context's error, and whether greedy decoding would have produced them.

Requests that share a context are decoded as one prefix: the context once, alone (as a prompt
is in generation: kvinject/engine/batching.py), then each continuation on a sequence that
shares its cells (``Context.share``), so a multiple-choice item costs one prefill and its
choices. The continuations of several contexts are decoded together, up to the context's
sequences at a time. Each request's noise is seeded by its item (``Context.begin_item``): the
context by its first request's, each continuation by its own, whatever is decoded beside them.
A cache-resident model (KIVI, eviction) follows each sequence's tokens from position 0, so
there every request decodes its own context.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from ..exceptions import DataError
from .context import Context


@dataclass(frozen=True)
class Scored:
    """One continuation: its log-probability, whether each of its tokens was the greedy pick,
    and how many of its logit rows held NaN or Inf."""

    logprob: float
    greedy: bool
    nonfinite: int = 0


def _score(rows: np.ndarray, tokens: Sequence[int]) -> Scored:
    """``rows[i]``: the logits that predict ``tokens[i]``."""
    rows = rows.astype(np.float64)
    finite = np.isfinite(rows).all(axis=1)
    top = rows.max(axis=1, keepdims=True)
    lse = top[:, 0] + np.log(np.exp(rows - top).sum(axis=1))
    picked = rows[np.arange(len(tokens)), tokens]
    greedy = bool((np.argmax(np.nan_to_num(rows, nan=-np.inf), axis=1) == np.asarray(tokens)).all())
    return Scored(float((picked - lse).sum()), greedy, int((~finite).sum()))


def score_continuations(
    ctx: Context,
    requests: Sequence[tuple[Sequence[int], Sequence[int]]],
    items: Sequence[int] | None = None,
    done: Callable[[int], None] | None = None,
) -> list[Scored]:
    """Score each ``(context tokens, continuation tokens)`` (both non-empty; the context holds
    whatever starts the sequence, BOS included) under ``ctx``; ``items[i]`` seeds request ``i``
    (default: its index); ``done(n)`` after ``n`` more requests are scored."""
    items = list(items) if items is not None else list(range(len(requests)))
    for context, continuation in requests:
        if not context or not continuation:
            raise DataError("a log-likelihood request needs a context and a continuation of at least one token each")
        if len(context) + len(continuation) - 1 > ctx.n_ctx_seq:
            raise DataError(f"a request of {len(context) + len(continuation)} tokens does not fit a context of {ctx.n_ctx_seq} tokens per sequence")
    shared = ctx.resident is None
    groups: dict[tuple[int, ...], list[int]] = {}
    for i, (context, _) in enumerate(requests):
        groups.setdefault(tuple(context) if shared else (i,), []).append(i)
    results: list[Scored | None] = [None] * len(requests)
    waves: list[list[list[int]]] = [[]]
    for members in groups.values():  # a wave: groups whose continuations fit the context's sequences
        for start in range(0, len(members), ctx.n_seq):
            part = members[start : start + ctx.n_seq]
            if sum(map(len, waves[-1])) + len(part) > ctx.n_seq:
                waves.append([])
            waves[-1].append(part)
    for wave in waves:
        entries, wanted = [], []  # wanted: (request, first row of its logits among the decode's)
        seq = 0
        for part in wave:
            context = requests[part[0]][0]
            ctx.begin_item(items[part[0]], seq, len(context))
            ctx.prefill(context, seq)
            last = ctx.logits(-1).copy()  # predicts each continuation's first token
            first_seq = seq
            for k, i in enumerate(part):
                if k:
                    ctx.begin_item(items[i], seq)
                    ctx.share(first_seq, seq)
                continuation = requests[i][1]
                wanted.append((i, last, seq, len(continuation)))
                entries += [(t, len(context) + j, seq, True) for j, t in enumerate(continuation[:-1])]
                seq += 1
        rows = _decode(ctx, entries)
        for i, last, s, n in wanted:
            results[i] = _score(np.vstack([last[None, :], *rows.get(s, [])][:n]), requests[i][1])
        if done is not None:
            done(sum(map(len, wave)))
    return results


def _decode(ctx: Context, entries: list[tuple[int, int, int, bool]]) -> dict[int, list[np.ndarray]]:
    """Decode ``entries`` (each sequence's in order) in batches; every row's logits, per sequence."""
    out: dict[int, list[np.ndarray]] = {}
    for start in range(0, len(entries), ctx.n_batch):
        batch = entries[start : start + ctx.n_batch]
        ctx.decode(batch)
        logits = ctx.output_logits(len(batch))
        for (_, _, seq, _), row in zip(batch, logits):
            out.setdefault(seq, []).append(row.copy())
    return out
