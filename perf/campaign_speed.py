"""Fault-campaign throughput: injections per minute at --parallel N against --parallel 1, and of
faults placed after the prompt with the prompts restored against decoding them.

    python perf/campaign_speed.py [--parallel 8] [--items 96] [--repeats 3] [--threads 2] [--record]
    python perf/campaign_speed.py --stage generated --runs 4 [--parallel 8] [--record]

Runs single-fault campaigns of examples/fault-campaign.toml's kind (`faults:1` at bit 14 of an
fp16 cache, one injection per next-token item and fault run, against the golden run) on one
model, interleaved, and prints each repeat's injections per minute and their ratio. By default it
compares N sequences with 1: the outcomes of the two are the same item for item
(tests/test_campaign_parallel.py), so the ratio is what a campaign gains. With ``--stage
generated`` the faults land in generated tokens and every fault run after the first restores the
prompts it decoded (kvinject/engine/cache/prefills.py; tests/test_spared_prompts.py): it compares
that, at N sequences, with one sequence decoding every prompt (no snapshot kept), as campaigns ran
before both.
"""

from __future__ import annotations

import argparse
import time
from unittest import mock

from kvinject.benchmarks import NextToken
from kvinject.engine.cache.prefills import Prefills
from kvinject.engine.model import Model
from kvinject.engine.options import BackendOptions
from kvinject.error_models.configuration import Configuration
from kvinject.experiments import executor
from kvinject.experiments.executor import evaluate
from measurements import add_record_flag, record

SPEC = "faults:1,bit=14"


def per_minute(model: Model, items: int, spec: str = SPEC, runs: int = 1, share: bool = True) -> float:
    """Injections per minute of a campaign of ``items`` items and ``runs`` fault runs, its golden
    run included; ``share=False`` keeps no prompt to restore."""
    bench = NextToken(limit=items)
    plan = [(Configuration(), [0]), (Configuration.parse(spec), list(range(runs)))]
    start = time.perf_counter()
    with mock.patch.object(executor, "Prefills", Prefills if share else lambda: Prefills(budget=0)):
        for _ in evaluate(bench, model, plan, seed=0, progress=lambda n: None):
            pass
    return items * runs / (time.perf_counter() - start) * 60


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default=None)
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument("--parallel", type=int, default=8)
    ap.add_argument("--items", type=int, default=96)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--stage", choices=["prompt", "generated"], default="prompt")
    ap.add_argument("--runs", type=int, default=1, help="fault runs per item (with --stage generated, all but the first restore the prompts)")
    add_record_flag(ap)
    args = ap.parse_args()
    n = args.parallel
    models = {p: Model(args.model, BackendOptions(threads=args.threads, parallel=p)) for p in (1, n)}
    if args.stage == "prompt":
        pair = [(f"--parallel {p}", lambda p=p: per_minute(models[p], args.items, runs=args.runs)) for p in (1, n)]
        key, what = f"campaign-parallel-{n}", f"fault campaign `{SPEC}`, injections per minute, --parallel {n} / 1"
    else:  # as campaigns ran before (one item at a time, every prompt decoded) against as they run now
        spec = f"{SPEC},stage=generated"
        pair = [
            ("at --parallel 1 decoding every prompt", lambda: per_minute(models[1], args.items, spec, args.runs, share=False)),
            (f"at --parallel {n} restoring them", lambda: per_minute(models[n], args.items, spec, args.runs)),
        ]
        key = f"campaign-spared-{n}"
        what = f"fault campaign `{spec}`, {args.runs} fault runs, injections per minute, --parallel {n} restoring prompts / --parallel 1 decoding them"
    pair[0][1]()  # compiled callback and caches warm before timing
    ratios = []
    for i in range(args.repeats):
        (name0, one), (name1, many) = ((name, run()) for name, run in pair)
        ratios.append(many / one)
        print(f"repeat {i}: {one:.0f} injections/min {name0}, {many:.0f} {name1}: {many / one:.2f}x")
    record(args, "cpu", key, what, ratios)


if __name__ == "__main__":
    main()
