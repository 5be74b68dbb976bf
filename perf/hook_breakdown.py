"""Where the injection time goes: a 512-token prefill and 1- and 8-sequence decodes, each with
the hook doing more and more of its work, interleaved decode by decode.

    python perf/hook_breakdown.py [--model M] [--steps 60] [--prefills 6] [--error normal:0,0.25]

Configurations, each a context of its own, taking turns:

- ``none``: no hook;
- ``claims``: the hook claims every layer's K/V node (one graph split per layer) and the
  compiled callback checks each claimed tensor, but no factor is computed or applied;
- the error (``normal:0,0.25``): the full hook, factors computed and applied with the
  realized-error sums in the same pass.

Per workload it prints the median time of each, the difference between successive ones (the
graph splits; the pass with its factors), the hook's Python side (the decode's layout before
and its accounting after, timed inside the error's run) and, from a separate timing of
kvinject/engine/variates.py's generator alone, how much of the pass is computing factors. Ratios
carry their spread over blocks of steps.
"""

from __future__ import annotations

import argparse
import statistics
import time
from dataclasses import dataclass
from typing import ClassVar

from kvinject.engine.context import Context
from kvinject.engine.graph.hook import KVHook
from kvinject.engine.model import Model
from kvinject.engine.options import BackendOptions
from kvinject.engine.variates import factors
from kvinject.error_models import Multiplicative, parse_error
from tools import spread

PROMPT = "The history of the printing press begins in the fifteenth century, when"
N_BATCH = 512


@dataclass(frozen=True)
class ClaimsOnly(Multiplicative):
    """The hook's claims and checks without a factor: no stream, so no segment to multiply."""

    name: ClassVar[str] = "claims"
    syntax = summary = example = "claims"

    @property
    def law(self) -> tuple[int, float, float]:
        return 0, 1.0, 0.0

    @property
    def random(self) -> bool:
        return False

    def stream(self, rng, horizon):
        return None


class PythonSide:
    """Seconds the hook spends in Python around each decode (layout and accounting)."""

    def __init__(self) -> None:
        self.seconds = 0.0
        self._layout, self._finish = KVHook.layout, KVHook.finish_decode
        KVHook.layout = self._timed(self._layout)
        KVHook.finish_decode = self._timed(self._finish)

    def _timed(self, method):
        def timed(hook, *args, **kwargs):
            start = time.perf_counter()
            try:
                return method(hook, *args, **kwargs)
            finally:
                self.seconds += time.perf_counter() - start

        return timed


def workload_times(model: Model, errors: dict, n_seq: int, prefill: bool, steps: int, python: PythonSide) -> tuple[dict[str, list[float]], float, int]:
    """Seconds per step of each configuration, the error's Python-side seconds per step, and
    the K/V values one step writes."""
    prompt = model.tokenize(PROMPT)
    tokens = (prompt * (N_BATCH // len(prompt) + 1))[:N_BATCH] if prefill else prompt
    n_ctx = N_BATCH + 64 if prefill else n_seq * (len(prompt) + steps) + 64
    contexts = {name: Context(model, error=error, n_seq=n_seq, n_ctx=n_ctx) for name, error in errors.items()}
    times: dict[str, list[float]] = {name: [] for name in errors}
    python_seconds = 0.0
    try:
        if not prefill:
            for ctx in contexts.values():
                for seq in range(n_seq):
                    ctx.begin_item(seq, seq)
                    ctx.prefill(prompt, seq=seq)
        for i in range(steps):
            if prefill:
                entries = [(t, j, 0, j == len(tokens) - 1) for j, t in enumerate(tokens)]
            else:
                entries = [(prompt[-1], len(prompt) + i, seq, True) for seq in range(n_seq)]
            for name, ctx in contexts.items():
                if prefill:
                    ctx.begin_item(i, 0)
                python.seconds = 0.0
                start = time.perf_counter()
                ctx.decode(entries)
                ctx.synchronize()
                times[name].append(time.perf_counter() - start)
                if name == list(errors)[-1]:
                    python_seconds += python.seconds
        hook = contexts[list(errors)[-1]].hook
        values = len(entries) * sum(hook.row[c] for c, _ in hook.site_counts)
    finally:
        for ctx in contexts.values():
            ctx.close()
    return times, python_seconds / steps, values


def generator_ns(law: tuple[int, float, float], n: int = 4_000_000) -> float:
    factors(law, 1, 0, 1000)
    start = time.perf_counter()
    factors(law, 2, 0, n)
    return (time.perf_counter() - start) / n * 1e9


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default=None)
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument("--steps", type=int, default=60, help="decode steps per decode workload")
    ap.add_argument("--prefills", type=int, default=6, help="512-token prefills per configuration")
    ap.add_argument("--blocks", type=int, default=3, help="the steps are cut into blocks, one ratio each, for the spread")
    ap.add_argument("--error", default="normal:0,0.25")
    args = ap.parse_args()
    model = Model(args.model, BackendOptions(threads=args.threads))
    error = parse_error(args.error)
    errors = {"none": parse_error("none"), "claims": ClaimsOnly(), args.error: error}
    python = PythonSide()
    ns = generator_ns(error.law)
    print(f"model {model.path.name}, {model.backend.n_threads} threads; {args.error}'s factors alone: {ns:.2f} ns a value")
    print(f"{'workload':<18}{'none ms':>9}{'splits ms':>10}{'pass ms':>9}{'of which factors':>17}{'python ms':>10}  ratio error/none (spread over blocks)")
    for label, n_seq, prefill, steps in (
        ("prefill 512", 1, True, args.prefills),
        ("decode 1 seq", 1, False, args.steps),
        ("decode 8 seq", 8, False, args.steps),
    ):
        times, python_s, values = workload_times(model, errors, n_seq, prefill, steps, python)
        med = {name: statistics.median(t) * 1e3 for name, t in times.items()}
        size = max(steps // args.blocks, 1)
        pairs = [clean / t for clean, t in zip(times["none"], times[args.error])]
        blocks = [statistics.median(pairs[i : i + size]) for i in range(0, size * (len(pairs) // size), size)]
        print(
            f"{label:<18}{med['none']:>9.2f}{med['claims'] - med['none']:>10.2f}{med[args.error] - med['claims']:>9.2f}"
            f"{values * ns * 1e-6:>17.2f}{python_s * 1e3:>10.2f}  {spread(blocks)}"
        )


if __name__ == "__main__":
    main()
