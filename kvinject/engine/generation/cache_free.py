"""The cache-free reference: logits computed in one batched pass over a whole sequence, never
from K/V that earlier decodes left in the cache.

llama.cpp stores even a single pass's K and V in the cache, at the cache's type, before
attention reads them: a pass with an f16 cache rounds K/V to f16 as cached decoding does. What
differs from cached generation is the order of computation (all positions in one graph, with
the batched kernels, rather than one token per decode). docs/recompute.md says more.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Callable, Iterator, Sequence

import numpy as np

from ..context import Context
from .batching import Generation, generate_all

if TYPE_CHECKING:
    from ..model import Model
    from ..options import CacheOptions

# Tokens of one pass at most: llama.cpp's compute buffers grow with the pass (without flash
# attention, quadratically). A longer sequence is decoded in pieces of this many tokens.
MAX_PASS = 4096


def pass_context(model: Model, cache: CacheOptions, n_ctx: int, residual: bool = False) -> Context:
    """A context for one-pass evaluation of one sequence of up to ``n_ctx`` tokens, without
    error: its batch holds the whole sequence (up to MAX_PASS), one graph per pass. With
    ``residual``, each layer's output can be read after each piece (kvinject/engine/graph/residual_stream.py)."""
    return Context(model, cache, n_ctx=n_ctx, n_batch=min(n_ctx, MAX_PASS), residual=residual)


def pass_pieces(ctx: Context, prompt: Sequence[int], tokens: Sequence[int]) -> Iterator[tuple[int, int]]:
    """Decode prompt and tokens in one pass on an empty sequence 0, with logits from the prompt's
    last token on; yield ``(first position, rows with logits)`` after each decode. A sequence
    longer than the batch is decoded in pieces, each reading the pieces before it from the cache
    (as chunked prefill)."""
    ctx.forget(0)
    seq = [*prompt, *tokens]
    first = len(prompt) - 1
    for start in range(0, len(seq), ctx.n_batch):
        entries = [(t, start + j, 0, start + j >= first) for j, t in enumerate(seq[start : start + ctx.n_batch])]
        ctx.decode(entries)
        yield start, sum(e[3] for e in entries)


def one_pass(ctx: Context, prompt: Sequence[int], tokens: Sequence[int]) -> np.ndarray:
    """The logits after the prompt and after each token, ``(len(tokens) + 1, n_vocab)``, from
    one pass over prompt and tokens (:func:`pass_pieces`)."""
    return np.concatenate([ctx.output_logits(wanted).copy() for _, wanted in pass_pieces(ctx, prompt, tokens) if wanted])


def greedy(rows: np.ndarray) -> np.ndarray:
    """The greedy token of each row of logits; NaN never wins (as when generating)."""
    return np.argmax(np.nan_to_num(rows, nan=-np.inf), axis=-1)


def generate_cache_free(
    draft: Context,
    verify: Context,
    prompts: Sequence[Sequence[int]],
    max_tokens: int,
    stop: Callable[[list[int]], bool] | None = None,
    items: Sequence[int] | None = None,
) -> Iterator[tuple[int, Generation]]:
    """Greedy generation in which every token is the greedy pick of cache-free logits, yielded
    as ``(index, generation)`` with ``generation.logits`` from one pass over the final tokens.

    Speculative decoding with the cache-free pass as the judge: ``draft`` (a cached context,
    continuous batching) proposes a continuation, one pass on ``verify`` over prompt and
    proposal gives the cache-free pick at every position, and the proposal is kept up to its
    first disagreement, where the pass's pick replaces it; the rest is proposed again. The
    result is the free-running cache-free generation, at the cost of one pass per disagreement
    plus one, rather than one per token. Limits and ``stop`` are those of ``generate_all``."""
    accepted: list[list[int]] = [[] for _ in prompts]
    pending = list(range(len(prompts)))

    def ended(i: int, tokens: list[int]) -> bool:
        return len(tokens) >= max_tokens or (stop is not None and stop(tokens)) or len(prompts[i]) + len(tokens) >= draft.n_ctx_seq

    while pending:
        again = []
        proposals = generate_all(
            draft,
            [prompts[i] for i in pending],
            max_tokens,
            stop=stop,
            items=[items[i] for i in pending] if items is not None else None,
            prefixes=[accepted[i] for i in pending],
        )
        for j, proposal in proposals:
            i = pending[j]
            tokens, rows = proposal.tokens, one_pass(verify, prompts[i], proposal.tokens)
            picks = greedy(rows)
            k = next((k for k in range(len(accepted[i]), len(tokens)) if picks[k] != tokens[k]), len(tokens))
            final = tokens[:k]
            if not ended(i, final) and not draft.model.is_eog(int(picks[k])):
                accepted[i] = [*final, int(picks[k])]
                if not ended(i, accepted[i]):
                    again.append(i)
                    continue
                final = accepted[i]
            if final != tokens:  # the pass covered more than the result: its own pass, as for any sequence
                rows = one_pass(verify, prompts[i], final)
            rows = rows[: len(final) + (not ended(i, final))]  # a pick after the last token: end of generation
            nonfinite = int((~np.isfinite(rows)).any(axis=1).sum())
            yield i, Generation(final, draft.model.detokenize(final), nonfinite, rows[0].copy(), rows)
        pending = again
