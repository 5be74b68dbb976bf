"""The log-likelihood of continuations: how probable a context makes each continuation's tokens
under a context's error, and whether greedy decoding would have produced them.

Requests that share a context are decoded as one prefix: the context once, alone (as a prompt
is in generation: kvinject/engine/generation/batching.py), then each continuation on a sequence that
shares its cells (``Context.share``), so a multiple-choice item costs one prefill and its
choices. The continuations of several contexts are decoded together, up to the context's
sequences at a time. The noise does not depend on that grouping: a context's K/V get the noise
of its tokens (``token_item``), each continuation's the noise of its own item, whatever is
decoded beside them. Models that follow each sequence (KIVI, eviction: cache-resident) or
place their faults in an item's prompt (``faults``) get no shared contexts: each request
decodes its own, its prompt, and its continuation goes on in the request's stream.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from ...exceptions import DataError
from ..context import Context

# Logit rows reduced at a time: float64 copies of this many rows, not of a whole decode's.
ROWS = 64


@dataclass(frozen=True)
class Scored:
    """One continuation: its log-probability, whether each of its tokens was the greedy pick,
    and how many of its logit rows held NaN or Inf."""

    logprob: float
    greedy: bool
    nonfinite: int = 0


def token_item(tokens: Sequence[int]) -> int:
    """An item number for a token sequence: its noise the same in every run and batch."""
    return int.from_bytes(hashlib.blake2b(np.asarray(tokens, np.int64).tobytes(), digest_size=7).digest(), "little")


def _reduce(rows: np.ndarray, targets: np.ndarray) -> np.ndarray:
    """Per row: the target's log-probability, whether it is the argmax, whether the row is
    finite; ``ROWS`` rows at a time, in float64."""
    out = np.empty((len(targets), 3))
    for start in range(0, len(targets), ROWS):
        z = rows[start : start + ROWS].astype(np.float64)
        t = targets[start : start + ROWS]
        finite = np.isfinite(z).all(axis=1)
        top = z.max(axis=1, keepdims=True)
        lse = top[:, 0] + np.log(np.exp(z - top).sum(axis=1))
        picked = z[np.arange(len(t)), t]
        out[start : start + len(t), 0] = picked - lse
        out[start : start + len(t), 1] = np.argmax(np.nan_to_num(z, nan=-np.inf), axis=1) == t
        out[start : start + len(t), 2] = finite
    return out


def score_continuations(
    ctx: Context,
    requests: Sequence[tuple[Sequence[int], Sequence[int]]],
    items: Sequence[int] | None = None,
    done: Callable[[int], None] | None = None,
) -> list[Scored]:
    """Score each ``(context tokens, continuation tokens)`` (both non-empty; the context holds
    whatever starts the sequence, BOS included) under ``ctx``; ``items[i]`` seeds request ``i``'s
    continuation (default: its index); ``done(n)`` after ``n`` more requests are scored."""
    items = list(items) if items is not None else list(range(len(requests)))
    for context, continuation in requests:
        if not context or not continuation:
            raise DataError("a log-likelihood request needs a context and a continuation of at least one token each")
        if len(context) + len(continuation) - 1 > ctx.n_ctx_seq:
            raise DataError(f"a request of {len(context) + len(continuation)} tokens does not fit a context of {ctx.n_ctx_seq} tokens per sequence")
    shared = ctx.resident is None and not ctx.error.placed
    groups: dict[tuple[int, ...], list[int]] = {}
    for i, (context, _) in enumerate(requests):
        groups.setdefault(tuple(context) if shared else (i,), []).append(i)
    waves: list[list[list[int]]] = [[]]
    for members in groups.values():  # a wave: groups whose continuations fit the context's sequences
        for start in range(0, len(members), ctx.n_seq):
            part = members[start : start + ctx.n_seq]
            if sum(map(len, waves[-1])) + len(part) > ctx.n_seq:
                waves.append([])
            waves[-1].append(part)
    results: list[Scored | None] = [None] * len(requests)
    for wave in waves:
        entries, targets, firsts = [], [], {}  # firsts: request -> (its sequence, the context's last row scored)
        seq = 0
        for part in wave:
            context = requests[part[0]][0]
            ctx.begin_item(token_item(context) if shared else items[part[0]], seq, len(context))
            ctx.prefill(context, seq)
            last = ctx.logits(-1)
            first_seq = seq
            for k, i in enumerate(part):
                continuation = requests[i][1]
                if shared and k:
                    ctx.begin_item(items[i], seq)
                    ctx.share(first_seq, seq)
                elif shared:
                    ctx.reseed(items[i], seq)
                firsts[i] = (seq, _reduce(last[None, :], np.array(continuation[:1]))[0])
                entries += [(t, len(context) + j, seq, True) for j, t in enumerate(continuation[:-1])]
                targets += continuation[1:]
                seq += 1
        scored = _decode(ctx, entries, np.array(targets, np.int64))
        for i, (s, first) in firsts.items():
            rows = np.vstack([first[None, :], scored.get(s, np.empty((0, 3)))])
            results[i] = Scored(float(rows[:, 0].sum()), bool(rows[:, 1].all()), int((rows[:, 2] == 0).sum()))
        if done is not None:
            done(sum(map(len, wave)))
    return results


def _decode(ctx: Context, entries: list[tuple[int, int, int, bool]], targets: np.ndarray) -> dict[int, np.ndarray]:
    """Decode ``entries`` (each sequence's in order) in batches, each row reduced against its
    target (:func:`_reduce`) as it comes; the rows of each sequence."""
    out: dict[int, list[np.ndarray]] = {}
    for start in range(0, len(entries), ctx.n_batch):
        batch = entries[start : start + ctx.n_batch]
        ctx.decode(batch)
        reduced = _reduce(ctx.output_logits(len(batch)), targets[start : start + len(batch)])
        seqs = np.array([e[2] for e in batch])
        for s in dict.fromkeys(seqs.tolist()):
            out.setdefault(s, []).append(reduced[seqs == s])
    return {s: np.vstack(parts) for s, parts in out.items()}
