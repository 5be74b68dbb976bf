"""Generation in one of two modes: with the cache (continuous batching,
kvinject/engine/generation/batching.py) or cache-free, every token from a pass over the whole sequence
(kvinject/engine/generation/cache_free.py), which a configuration asks for by the spec ``recompute``
(``Configuration.cache_free``). The executor, `kvinject generate` and the layer-wise divergence
all decode through here."""

from __future__ import annotations

from contextlib import ExitStack
from functools import partial
from typing import Any, Callable, Iterator, Sequence

from ..context import Context
from .batching import Generation, generate_all
from .cache_free import generate_cache_free, pass_context

Generate = Callable[..., Iterator[tuple[int, Generation]]]


def generator(stack: ExitStack, ctx: Context, cache_free: bool = False) -> Generate:
    """``generate(prompts, max_tokens, temperature=0, stop=None, items=None, **cached)`` on
    ``ctx``, yielding ``(index, generation)`` as each prompt's generation finishes: generate_all,
    ``cached`` its further options; or ``cache_free`` (greedy; ``cached`` does not apply), with the
    judging context (the same cache, one sequence of ``ctx.n_ctx_seq``) entered on ``stack`` once."""
    if not cache_free:
        return partial(generate_all, ctx)
    verify = stack.enter_context(pass_context(ctx.model, ctx.cache, ctx.n_ctx_seq))

    def generate(
        prompts: Sequence[Sequence[int]],
        max_tokens: int,
        temperature: float = 0.0,
        stop: Callable[[list[int]], bool] | None = None,
        items: Sequence[int] | None = None,
        **cached: Any,
    ) -> Iterator[tuple[int, Generation]]:
        return generate_cache_free(ctx, verify, prompts, max_tokens, stop, items=items)

    return generate
