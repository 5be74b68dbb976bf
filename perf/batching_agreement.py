"""How often parallel evaluation gives other greedy outputs than sequential evaluation.

    python perf/batching_agreement.py [--parallel 8] [--prompts 48] [--snippets 200]

Runs the IFEval-style and next-token benchmarks with --parallel 1 and --parallel N, under the
control and normal:0,0.25 (same seed, so the same noise per item), and prints per benchmark
and configuration the share of items whose output differs, the mean position of the first
differing token, and the headline metric both ways. Items differ only through llama.cpp's
numerics (where their cells lie in the shared cache, see placement_agreement.py), not through
what they are or the noise they get.
"""

from __future__ import annotations

import argparse

from kvinject.benchmarks import IFEval, NextToken
from kvinject.benchmarks.base import token_divergence
from kvinject.engine.model import Model
from kvinject.engine.options import BackendOptions
from kvinject.error_models.configuration import Configuration
from kvinject.experiments.executor import evaluate

SPECS = ("none", "normal:0,0.25")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default=None)
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument("--parallel", type=int, default=8)
    ap.add_argument("--prompts", type=int, default=48)
    ap.add_argument("--snippets", type=int, default=200)
    args = ap.parse_args()
    models = {n: Model(args.model, BackendOptions(threads=args.threads, parallel=n)) for n in (1, args.parallel)}
    benches = [IFEval(limit=args.prompts), NextToken(limit=args.snippets)]
    print(f"model {models[1].path.name}, parallel 1 against {args.parallel}")
    print(f"{'bench':<10}{'configuration':<16}{'items':>6}{'differ':>8}{'first diff':>11}{'metric':>26}{'sequential':>11}{'parallel':>9}")
    for bench in benches:
        for spec in SPECS:
            plan = [(Configuration.parse(spec), [0])]
            (seq,), (par,) = (list(evaluate(bench, m, plan, seed=0, progress=lambda n: None)) for m in models.values())
            d, _ = token_divergence(seq.outputs, par.outputs)
            print(
                f"{bench.name:<10}{spec:<16}{len(bench):>6}{d['diverged']:>8.1%}{d['first_diff']:>11.1f}"
                f"{bench.primary:>26}{seq.metrics[bench.primary]:>11.4f}{par.metrics[bench.primary]:>9.4f}"
            )


if __name__ == "__main__":
    main()
