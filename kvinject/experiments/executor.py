"""The executor's decoding: every planned run of a benchmark under its configuration, the
control first. A generation benchmark describes its prompts, limits, scoring and summaries
(kvinject/benchmarks/base.py); here each run gets its context, decodes with or without the
cache (kvinject/engine/generation/decoding.py), has its items compared with the control's (token
divergence, fault outcomes, logit drift against a cache-free control) and becomes a
``RunResult``. Benchmarks that decode their own way (perplexity, lm-eval) implement ``evaluate``."""

from __future__ import annotations

from contextlib import ExitStack
from typing import Any, Iterator

import numpy as np

from .. import clock
from ..benchmarks.base import Benchmark, GenerationBenchmark, Golden, Plan, Progress, RunResult, token_divergence
from ..benchmarks.drift import compare
from ..benchmarks.drift import summarize as summarize_drift
from ..benchmarks.outcomes import classify
from ..engine.cache.prefills import Prefills
from ..engine.context import Context
from ..engine.generation.cache_free import one_pass, pass_context
from ..engine.generation.decoding import generator
from ..engine.model import Model
from ..engine.positions import GENERATION_SPANS, Spans
from ..error_models.configuration import Configuration
from ..exceptions import DataError


def evaluate(bench: Benchmark, model: Model, plan: Plan, seed: int, progress: Progress, golden: Golden | None = None) -> Iterator[RunResult]:
    """Evaluate the planned runs; the control (``plan[0]``) first, unless ``golden`` (what
    ``bench.golden`` made of its stored record) stands for it and ``plan[0]`` lists no runs."""
    if isinstance(bench, GenerationBenchmark):
        return _generate(bench, model, plan, seed, progress, golden)
    return bench.evaluate(model, plan, seed, progress, golden)


def check_fits(name: str, model: Model, prompts: list[list[int]], max_tokens: int, per_seq: int) -> None:
    """Prompts and their generation past the model's training context refused, before any
    compute: there its positions mean nothing, and the memory runs out."""
    if per_seq > model.n_ctx_train:
        longest = max(map(len, prompts), default=0)
        raise DataError(
            f"{name}: the longest prompt is {longest} tokens, and with {max_tokens} to generate it needs {per_seq}, more than "
            f"{model.path.name}'s training context of {model.n_ctx_train}: shorten the prompts (fewer shots, shorter data) or --max-tokens"
        )


def _generate(bench: GenerationBenchmark, model: Model, plan: Plan, seed: int, progress: Progress, golden: Golden | None) -> Iterator[RunResult]:
    """The planned runs of a generation benchmark, each item's generation scored by the bench and compared with the control's."""
    prompts = bench.prompts(model)
    max_tokens, per_seq = bench.limits(prompts)
    check_fits(bench.name, model, prompts, max_tokens, per_seq)
    if golden is not None and len(golden.outputs) != len(prompts):  # its items are paired with these, one by one
        raise DataError(
            f"{bench.name}: the control's stored run scored {len(golden.outputs)} items, and its data now gives {len(prompts)}: the data changed "
            "since the store was written; restore it, or sweep into a new store"
        )
    named = {n for c, _ in plan if c.target.positions is not None for n in c.target.positions.names}
    named |= {r.breaks_at for c, _ in plan if (r := c.error.resident) is not None and r.breaks_at}
    spans = bench.item_spans(model) if named - set(GENERATION_SPANS) else None
    reference = plan[0][0] if plan[0][0].cache_free else None
    control: RunResult | Golden | None = golden
    prefills = Prefills()  # prompts decoded once for the configurations that leave them alone (eviction)
    for config, runs in plan:
        for run in runs:
            result = _run(bench, model, config, run, seed, prompts, control, reference, progress, spans, prefills)
            if control is None:
                control = result
            else:  # each item against the golden run, as fault campaigns classify them
                items = classify(
                    control.outputs,
                    control.items[bench.primary],
                    result.outputs,
                    result.items[bench.primary],
                    result.items.pop("due"),
                    bench.higher_is_better[bench.primary],
                )
                result.items |= items
                result.extra |= {name: float(np.mean(values)) for name, values in items.items()}
            yield result


def _run(
    bench: GenerationBenchmark,
    model: Model,
    config: Configuration,
    run: int,
    seed: int,
    prompts: list[list[int]],
    control: RunResult | Golden | None,
    reference: Configuration | None,
    progress: Progress,
    spans: list[Spans] | None = None,
    prefills: Prefills | None = None,
) -> RunResult:
    """One run; with a cache-free ``reference`` (the control), each item's logits are
    compared with those of one pass over its tokens with the reference's cache (the
    control's own logits are that pass: it drifts by 0)."""
    start = clock.now()
    n = len(prompts)
    scores: list[Any] = [None] * n
    outputs: list[list[int]] = [[] for _ in range(n)]
    texts = [""] * n
    drift: list[dict[str, float]] = [{}] * n
    due = [""] * n
    faults: list[list[dict[str, object]] | None] = [None] * n
    tokens = 0
    max_tokens, per_seq = bench.limits(prompts)
    with ExitStack() as stack:
        ctx = stack.enter_context(generation_context(model, config, seed, run, per_seq, bench.sequences(model, per_seq)))
        # A fault campaign's watchdogs: an item that hangs or raises is DUE, and the run goes on.
        deadline = item_deadline(control, ctx.n_seq) if config.error.placed and control is not None else None
        generations = generator(stack, ctx, config.cache_free)(
            prompts,
            max_tokens,
            bench.temperature,
            stop=bench.stop(model),
            items=range(n),
            keep_logits=reference is not None,
            spans=spans,
            prefills=prefills,
            deadline=deadline,
            contain=config.error.placed,
        )
        judge = stack.enter_context(pass_context(model, reference.cache, per_seq)) if reference is not None and control is not None else None
        for i, gen in generations:
            scores[i] = bench.score(i, gen)
            outputs[i], texts[i], faults[i] = gen.tokens, gen.text, gen.faults
            due[i] = bench.due(gen)
            tokens += len(prompts[i]) + len(gen.tokens)
            if reference is not None:
                drift[i] = compare(gen.logits, one_pass(judge, prompts[i], gen.tokens)[: len(gen.logits)] if judge else gen.logits)
            progress(1)
        realized, bits = ctx.realized, ctx.cache_bits
    metrics, items = bench.summarize(scores)
    if control is not None:
        items["due"] = due  # taken by _generate, which classifies each item against the control
    extra = {}
    if control is not None:
        extra, divergence_items = token_divergence(control.outputs, outputs)
        items |= divergence_items
    if reference is not None:
        drift_metrics, drift_items = summarize_drift(drift)
        extra, items = {**extra, **drift_metrics}, {**items, **drift_items}
    metrics["bits"] = bits
    return RunResult(
        bench.name,
        config,
        run,
        metrics,
        items,
        realized,
        sum(cause == "nonfinite" for cause in due),
        clock.now() - start,
        tokens,
        extra,
        outputs,
        texts if bench.keep_texts else None,
        faults if config.error.placed else None,
    )


# An item of a fault campaign still generating after this many times its golden run's time (and
# at least TIMEOUT_FLOOR_S seconds, so that a busy machine does not trip it) is DUE, "timeout".
TIMEOUT_FACTOR, TIMEOUT_FLOOR_S = 20, 30.0


def item_deadline(control: RunResult | Golden, n_seq: int) -> float:
    """Seconds an item of a fault campaign may take: the golden run's time per item (``n_seq``
    items at a time) times TIMEOUT_FACTOR, at least TIMEOUT_FLOOR_S."""
    return max(TIMEOUT_FLOOR_S, TIMEOUT_FACTOR * control.seconds * n_seq / max(1, len(control.outputs or ())))


def generation_context(model: Model, config: Configuration, seed: int, run: int, per_seq: int, n_seq: int) -> Context:
    """A context for one run of a generation benchmark: ``n_seq`` sequences of ``per_seq``
    cells each, in a stream of cells per sequence, so that each attends over its own cells, as
    it would alone (with the same logits as sequential decoding where llama.cpp's kernels are
    the same; a shared pool's cells of other sequences cost a 4K-token prompt of 8 half its
    speed), except for a cache-resident model, which edits cells by their place in one pool."""
    streams = config.error.resident is None
    return Context(model, config.cache, config.error, config.target, seed=seed, run=run, n_ctx=n_seq * per_seq, n_seq=n_seq, streams=streams)
