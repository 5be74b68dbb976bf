"""The time kvinject's generation spends between decodes: everything but llama_decode itself.

    python perf/generation_loop.py [--model M] [--threads N] [--parallel 8] [--prompts 32] [--max-tokens 100] [--repeats 5] [--form fixed|ifeval] [--warm]

On a GPU a decode of 8 sequences of SmolLM2-135M takes about 0.3 ms, so the Python between two
decodes (the batch, the logits, the greedy picks, refilling finished sequences, scoring) sets the
speed as much as the decodes do. This runs the benchmark's generation path on the bundled
IFEval-style prompts, --parallel sequences with continuous refilling, greedy:

- fixed: ``generate_all`` as ``perf/generation_speed.py --forms fixed`` and the executor call it,
  every prompt generating exactly --max-tokens (no end-of-generation stops): the same work
  whatever the model says;
- ifeval: ``evaluate`` as `kvinject run --bench ifeval` does, scoring included (its context's
  creation and closing and the prompts' tokenization left out).

It times the whole loop and, around the ctypes call, llama_decode with the wait for its work
(llama_synchronize: on a GPU llama_decode returns before the device is done, and the wait would
fall in the logits' first read); the difference, per decode, is what kvinject adds (the timer's
own clock reads count in it). Gaps are also split by the decode
that follows them: a step (every row asks for logits) or a prompt piece (a refill). A further
run times named functions (their own time, nested named ones left out) for the breakdown; its
timers add to what they time, so its total is above the other runs'. Medians over --repeats runs
in one process, after a warm-up run.

A decode on the CPU runs through the model's weights and leaves the CPU's caches cold for the
Python after it, which a GPU's decode does not. ``--warm`` (fixed form) decodes the prompts but
skips the steps' decodes, whose picks then read the logits the context holds (a first decode of
every sequence fills them): what the loop costs with warm caches, as on a GPU's host, where the
logits still come fresh from the device.
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections import defaultdict
from dataclasses import dataclass
from functools import partial, wraps

from llama_cpp import llama_cpp as ll

from kvinject.benchmarks import IFEval
from kvinject.engine.context import Context
from kvinject.engine.generation import batching
from kvinject.engine.model import Model
from kvinject.engine.options import BackendOptions
from kvinject.error_models.configuration import Configuration
from kvinject.experiments import executor

# Where the time between decodes goes, by function (those a version of the code lacks are left out);
# llama_decode is timed as a part too, so that the batch filling around it does not count it.
DECODE = "llama_decode"
PARTS = {
    DECODE: [(ll, "llama_decode")],
    "batch filling": [(Context, "_llama_decode")],
    "decode bookkeeping": [(Context, "decode")],
    "logits read": [(Context, "output_logits"), (Context, "logits")],
    "greedy picks": [(batching, "_picks")],
    "end-of-generation test": [(Model, "is_eog")],
    "step: append, stop checks": [(batching, "_step")],
    "refill": [(Context, "begin_item"), (Context, "forget"), (Context, "mark"), (Context, "resume")],
    "finished generation": [(batching, "_generation"), (Context, "faults")],
    "detokenization": [(Model, "detokenize")],
    "scoring": [(IFEval, "score")],
}


class DecodeTimer:
    """llama_decode's calls timed, and the gaps between them, each labelled by the decode after it:
    a step where its first entry asks for logits (a prompt piece asks at its last). With
    ``warm``, steps are not decoded at all: the picks read the logits the context holds."""

    def __init__(self, warm: bool = False) -> None:
        self.inside = 0.0
        self.calls: dict[str, int] = defaultdict(int)
        self.gaps: dict[str, list[float]] = defaultdict(list)
        self._left: float | None = None
        self._warm = warm

    def __enter__(self) -> DecodeTimer:
        self._decode = ll.llama_decode
        decode, clock, warm = self._decode, time.perf_counter, self._warm

        def timed(ctx, batch):
            start = clock()
            kind = "step" if batch.logits[0] else "prompt piece"
            if self._left is not None:
                self.gaps[kind].append(start - self._left)
            self.calls[kind] += 1
            status = 0 if warm and kind == "step" else decode(ctx, batch)
            ll.llama_synchronize(ctx)
            self._left = clock()
            self.inside += self._left - start
            return status

        ll.llama_decode = timed
        return self

    def __exit__(self, *exc: object) -> None:
        ll.llama_decode = self._decode

    @property
    def decodes(self) -> int:
        return sum(self.calls.values())


class PartTimer:
    """The functions of PARTS timed, each call's own time (nested timed calls left out); with
    ``enabled`` False, nothing."""

    def __init__(self, enabled: bool = True) -> None:
        self.seconds: dict[str, float] = defaultdict(float)
        self._enabled = enabled
        self._stack: list[float] = []
        self._undo: list[tuple[object, str, object]] = []

    def __enter__(self) -> PartTimer:
        for part, places in PARTS.items() if self._enabled else ():
            for owner, name in places:
                if name in vars(owner):
                    self._undo.append((owner, name, vars(owner)[name]))
                    setattr(owner, name, self._wrap(part, vars(owner)[name]))
        return self

    def __exit__(self, *exc: object) -> None:
        for owner, name, fn in reversed(self._undo):
            setattr(owner, name, fn)

    def _wrap(self, part: str, fn):
        clock, stack, seconds = time.perf_counter, self._stack, self.seconds

        @wraps(fn)
        def timed(*args, **kwargs):
            stack.append(0.0)
            start = clock()
            try:
                return fn(*args, **kwargs)
            finally:
                took = clock() - start
                nested = stack.pop()
                seconds[part] += took - nested
                if stack:
                    stack[-1] += took

        return timed


@dataclass
class Timing:
    seconds: float  # the loop's wall time
    tokens: int  # generated
    decodes: DecodeTimer
    parts: PartTimer

    @property
    def outside(self) -> float:
        """Seconds outside llama_decode per decode."""
        return (self.seconds - self.decodes.inside) / self.decodes.decodes


def fixed(model: Model, bench: IFEval, prompts: list[list[int]], max_tokens: int, warm: bool = False, breakdown: bool = False) -> Timing:
    """One fixed-length generation. ``warm``: a first decode of every sequence, before the timing,
    fills each row of logits that the steps, not decoded, will read (its cells are forgotten as
    each sequence takes its first prompt)."""
    per_seq = max(map(len, prompts)) + max_tokens + 1
    with executor.generation_context(model, Configuration.parse("none"), 0, 0, per_seq, model.parallel) as ctx:
        if warm:
            ctx.decode([(model.bos, 0, seq, True) for seq in range(ctx.n_seq)])
        with DecodeTimer(warm) as decodes, PartTimer(breakdown) as parts:
            start = time.perf_counter()
            gens = list(batching.generate_all(ctx, prompts, max_tokens, stop=bench.stop(model), items=range(len(prompts)), ignore_eos=True))
            seconds = time.perf_counter() - start
    return Timing(seconds, sum(len(g.tokens) for _, g in gens), decodes, parts)


def ifeval(model: Model, bench: IFEval, prompts: list[list[int]], max_tokens: int, warm: bool = False, breakdown: bool = False) -> Timing:
    """One run of the benchmark, its context's creation and closing and the prompts' tokenization left out."""
    left_out = [0.0]

    def timed(fn):
        @wraps(fn)
        def run(*args, **kwargs):
            start = time.perf_counter()
            try:
                return fn(*args, **kwargs)
            finally:
                left_out[0] += time.perf_counter() - start

        return run

    undo = [(Context, "__init__", Context.__init__), (Context, "close", Context.close), (IFEval, "prompts", IFEval.prompts)]
    for owner, name, fn in undo:
        setattr(owner, name, timed(fn))
    try:
        with DecodeTimer() as decodes, PartTimer(breakdown) as parts:
            start = time.perf_counter()
            (result,) = executor.evaluate(bench, model, [(Configuration.parse("none"), [0])], seed=0, progress=lambda n: None)
            seconds = time.perf_counter() - start
    finally:
        for owner, name, fn in undo:
            setattr(owner, name, fn)
    return Timing(seconds - left_out[0], sum(map(len, result.outputs)), decodes, parts)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default=None)
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument("--parallel", type=int, default=8)
    ap.add_argument("--prompts", type=int, default=32)
    ap.add_argument("--max-tokens", type=int, default=100)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--form", choices=("fixed", "ifeval"), default="fixed")
    ap.add_argument("--warm", action="store_true", help="fixed form: decode the prompts only, not the steps (see the docstring)")
    args = ap.parse_args()
    if args.warm and args.form != "fixed":
        ap.error("--warm needs --form fixed: without decodes the ifeval form's outputs, and so its work, change")
    model = Model(args.model, BackendOptions(threads=args.threads, parallel=args.parallel))
    bench = IFEval(limit=args.prompts, max_tokens=args.max_tokens)
    prompts = bench.prompt_tokens(model)
    run = partial(fixed, warm=args.warm) if args.form == "fixed" else ifeval
    run(model, bench, prompts[: args.parallel], 8)  # warm up
    timings = [run(model, bench, prompts, args.max_tokens) for _ in range(args.repeats)]
    split = run(model, bench, prompts, args.max_tokens, breakdown=True)
    us = 1e6
    calls = timings[0].decodes.calls
    print(
        f"model {model.path.name}, {model.backend.n_threads} threads, {model.n_gpu_layers} GPU layers, parallel {args.parallel}, "
        f"{len(prompts)} prompts, form {args.form}{' --warm' if args.warm else ''} ({timings[0].tokens} tokens generated), "
        f"{calls['step']} steps and {calls['prompt piece']} prompt pieces; median of {args.repeats} runs"
    )
    outside = [t.outside * us for t in timings]
    print(f"outside llama_decode: {statistics.median(outside):.1f} µs per decode (runs: {', '.join(f'{x:.1f}' for x in outside)})")
    for kind in ("step", "prompt piece"):
        gaps = [statistics.median(t.decodes.gaps[kind]) * us for t in timings]
        print(f"  median gap before a {kind}: {statistics.median(gaps):.1f} µs (runs: {', '.join(f'{x:.1f}' for x in gaps)})")
    inside = statistics.median(t.decodes.inside / t.decodes.decodes for t in timings)
    print(f"inside llama_decode: {inside * 1e3:.2f} ms per decode")
    n = split.decodes.decodes
    print(f"breakdown, µs per decode (a run with the functions timed: {split.outside * us:.1f} µs outside llama_decode in all):")
    parts = dict(split.parts.seconds)
    decoding = parts.pop(DECODE)
    for part, took in sorted(parts.items(), key=lambda kv: -kv[1]):
        print(f"  {part:<28}{took * us / n:>8.1f}")
    print(f"  {'the loop itself':<28}{(split.seconds - decoding - sum(parts.values())) * us / n:>8.1f}")


if __name__ == "__main__":
    main()
