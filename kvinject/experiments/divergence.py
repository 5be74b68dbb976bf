"""Layer-wise divergence: how far each layer's residual stream under a configuration is from a
reference's on the same tokens, per layer and position (docs/divergence.md).

The reference generates greedily once per item (``recompute@f32``: the cache-free generation
of kvinject.engine.generation.cache_free). Then the reference and every configuration are fed the prompt and those
tokens, each the way it generates: a cached configuration decodes the prompt in batch pieces
and then one token per decode (its noise seeded per item as in a benchmark run), a cache-free
one (``recompute``) one pass over everything. Each layer's output is read from the graph at
every position (kvinject/engine/graph/residual_stream.py) and compared: ``||x - x_ref|| / ||x_ref||``.
"""

from __future__ import annotations

import warnings
from contextlib import ExitStack
from dataclasses import dataclass
from typing import Callable, Iterator, Sequence

import numpy as np

from ..benchmarks import Benchmark, GenerationBenchmark
from ..engine.context import Context
from ..engine.generation.cache_free import pass_context, pass_pieces
from ..engine.generation.decoding import generator
from ..engine.model import Model
from ..engine.positions import GENERATION_SPANS, MAX_POSITION, Spans
from ..error_models.configuration import Configuration
from ..exceptions import DataError, SpecError
from .executor import check_fits

# Which positions a summary covers: the generated tokens (each decoded alone when cached), the
# prompt (decoded in batch pieces), or both.
SPANS = ("generated", "prompt", "all")


@dataclass(frozen=True)
class Prompts:
    """What is generated after: prompts as tokens, the generation's limit and stop test, and the
    spans each prompt declares (for ``--positions``)."""

    tokens: list[list[int]]
    max_tokens: int
    stop: Callable[[list[int]], bool] | None = None
    spans: list[Spans] | None = None
    declared: tuple[str, ...] = GENERATION_SPANS
    where: str = "divergence"


def check_bench(bench: Benchmark) -> None:
    """Divergence follows a greedy generation: refuse a benchmark that makes none."""
    if not isinstance(bench, GenerationBenchmark):
        raise SpecError(f"divergence follows a greedy generation: {bench.name} generates nothing (choose gsm8k, ifeval, nexttoken, passkey, niah or vt)")
    if bench.temperature > 0:
        raise SpecError(f"divergence follows a greedy generation: {bench.name} needs --temperature 0")


def bench_prompts(model: Model, bench: Benchmark) -> Prompts:
    """A generation benchmark's items, limit and stop test."""
    check_bench(bench)
    tokens = bench.prompts(model)
    max_tokens, per_seq = bench.limits(tokens)
    check_fits(bench.name, model, tokens, max_tokens, per_seq)
    spans = bench.item_spans(model) if set(bench.spans) - set(GENERATION_SPANS) else None
    return Prompts(tokens, max_tokens, bench.stop(model), spans, tuple(bench.spans), bench.name)


def text_prompts(model: Model, texts: Sequence[str], max_tokens: int) -> Prompts:
    """Prompts given as text, tokenized as ``kvinject generate`` does."""
    if max_tokens < 1:
        raise SpecError(f"--max-tokens must be >= 1, got {max_tokens}")
    tokens = [model.tokenize(t) for t in texts]
    if not all(tokens):
        raise DataError("an empty prompt has nothing to generate after")
    check_fits("divergence", model, tokens, max_tokens, max(map(len, tokens)) + max_tokens + 1)
    return Prompts(tokens, max_tokens)


@dataclass
class ItemDistances:
    prompt_tokens: int
    tokens: list[int]  # the reference's greedy continuation
    distances: list[np.ndarray]  # per configuration: (layers, positions of prompt and tokens)


@dataclass
class Divergence:
    reference: Configuration
    configs: list[Configuration]
    n_layer: int
    items: list[ItemDistances]

    @staticmethod
    def window(item: ItemDistances, span: str) -> slice:
        """The positions of ``item`` in ``span``."""
        n = item.prompt_tokens
        return {"generated": slice(n, None), "prompt": slice(0, n), "all": slice(0, None)}[span]

    def count(self, span: str = "generated") -> int:
        """Positions in the span, over every item."""
        return sum(item.distances[0][:, self.window(item, span)].shape[1] for item in self.items) if self.configs else 0

    def summary(self, span: str = "generated") -> list[dict[str, np.ndarray]]:
        """Per configuration, each layer's ``mean`` and ``max`` distance over the span's positions
        of every item (NaN where there are none: the last layer's output exists only where
        logits were computed, from the prompt's last token on)."""
        out = []
        for c in range(len(self.configs)):
            values = np.concatenate([item.distances[c][:, self.window(item, span)] for item in self.items], axis=1)
            with warnings.catch_warnings():  # a layer without positions: NaN, not a warning
                warnings.simplefilter("ignore", RuntimeWarning)
                out.append({"mean": np.nanmean(values, axis=1), "max": np.nanmax(values, axis=1) if values.size else np.full(self.n_layer, np.nan)})
        return out

    def by_position(self, span: str = "generated") -> tuple[np.ndarray, list[np.ndarray]]:
        """(offsets, a (layers, offsets) grid per configuration): the mean distance over items at
        each position counted from the first generated token (the prompt's are negative)."""
        before = max((i.prompt_tokens for i in self.items), default=0) if span != "generated" else 0
        after = max((len(i.tokens) for i in self.items), default=0) if span != "prompt" else 0
        offsets = np.arange(-before, after)
        grids = []
        for c in range(len(self.configs)):
            stacked = np.full((len(self.items), self.n_layer, len(offsets)), np.nan)
            for k, item in enumerate(self.items):
                w = self.window(item, span)
                d = item.distances[c][:, w]
                first = (w.start or 0) - item.prompt_tokens + before
                stacked[k, :, first : first + d.shape[1]] = d
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", RuntimeWarning)
                grids.append(np.nanmean(stacked, axis=0))
        return offsets, grids

    def to_dict(self, span: str = "generated") -> dict[str, object]:
        labels = [c.label for c in self.configs]
        return {
            "reference": self.reference.label,
            "configurations": labels,
            "span": span,
            "n_layer": self.n_layer,
            "summary": {label: {k: v.tolist() for k, v in s.items()} for label, s in zip(labels, self.summary(span))},
            "items": [
                {
                    "prompt_tokens": item.prompt_tokens,
                    "tokens": item.tokens,
                    "first_position": self.window(item, span).start or 0,
                    "distance": {label: d[:, self.window(item, span)].tolist() for label, d in zip(labels, item.distances)},
                }
                for item in self.items
            ],
        }


def distance(x: np.ndarray, reference: np.ndarray) -> np.ndarray:
    """``||x - reference|| / ||reference||`` over the last axis, in float64."""
    r = reference.astype(np.float64)
    return np.linalg.norm(x.astype(np.float64) - r, axis=-1) / np.linalg.norm(r, axis=-1)


def divergence(
    model: Model,
    reference: Configuration,
    configs: Sequence[Configuration],
    prompts: Prompts,
    seed: int = 0,
    progress: Callable[[int], None] | None = None,
) -> Divergence:
    """Each configuration's layer-wise divergence from ``reference`` on every prompt: the
    reference's greedy tokens, fed to both as each generates. ``progress(1)`` after the
    reference and after each configuration of each item."""
    if not configs:
        raise SpecError("give at least one configuration to compare with the reference (--error)")
    for config in (reference, *configs):
        if config.target.positions is not None:
            config.target.positions.check(prompts.where, prompts.declared)
    n_ctx = max(map(len, prompts.tokens)) + prompts.max_tokens + 1
    items = []
    with ExitStack() as stack:

        def capturing(config: Configuration) -> Context:
            if config.cache_free:
                return stack.enter_context(pass_context(model, config.cache, n_ctx, residual=True))
            return stack.enter_context(Context(model, config.cache, config.error, config.target, seed=seed, n_ctx=n_ctx, residual=True))

        generate = _generator(stack, model, reference, prompts, n_ctx, seed)
        contexts = [capturing(c) for c in (reference, *configs)]
        for i, prompt in enumerate(prompts.tokens):
            spans = prompts.spans[i] if prompts.spans is not None else {}
            tokens = generate(i)
            length = len(prompt) + len(tokens)
            ref = np.empty((model.n_layer, length, model.n_embd), np.float32)
            for start, rows in _feed(contexts[0], reference, i, prompt, tokens, spans):
                ref[:, start : start + rows.shape[1]] = rows
            if progress:
                progress(1)
            distances = []
            for config, ctx in zip(configs, contexts[1:]):
                d = np.empty((model.n_layer, length))
                for start, rows in _feed(ctx, config, i, prompt, tokens, spans):
                    d[:, start : start + rows.shape[1]] = distance(rows, ref[:, start : start + rows.shape[1]])
                distances.append(d)
                if progress:
                    progress(1)
            items.append(ItemDistances(len(prompt), tokens, distances))
    return Divergence(reference, list(configs), model.n_layer, items)


def _generator(stack: ExitStack, model: Model, reference: Configuration, prompts: Prompts, n_ctx: int, seed: int) -> Callable[[int], list[int]]:
    """item -> the reference's greedy tokens after that prompt, generated as a benchmark run does."""
    ctx = stack.enter_context(Context(model, reference.cache, reference.error, reference.target, seed=seed, n_ctx=n_ctx))
    generate, spans = generator(stack, ctx, reference.cache_free), prompts.spans
    return lambda i: next(generate([prompts.tokens[i]], prompts.max_tokens, stop=prompts.stop, items=[i], spans=[spans[i]] if spans else None))[1].tokens


def _feed(ctx: Context, config: Configuration, item: int, prompt: list[int], tokens: list[int], spans: Spans) -> Iterator[tuple[int, np.ndarray]]:
    """Decode prompt and tokens as ``config`` generates; yield ``(first position, outputs)``,
    each layer's output at the decode's positions, ``(layers, rows, n_embd)``."""
    if config.cache_free:
        for start, _ in pass_pieces(ctx, prompt, tokens):
            yield start, ctx.residual.read()
        return
    n = len(prompt)
    ctx.begin_item(item, 0, n, len(tokens))  # the item's noise, as in a benchmark run
    ctx.mark(0, {"prompt": [(0, n)], "generated": [(n, MAX_POSITION + 1)], **spans})
    for start in range(0, n, ctx.n_batch):  # the prompt in pieces, logits after its last token, as generate_all decodes it
        piece = prompt[start : start + ctx.n_batch]
        ctx.decode([(t, start + j, 0, start + j == n - 1) for j, t in enumerate(piece)])
        yield start, ctx.residual.read()
    for j, t in enumerate(tokens):
        ctx.decode([(t, n + j, 0, True)])
        yield n + j, ctx.residual.read()
