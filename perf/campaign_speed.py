"""Fault-campaign throughput: injections per minute at --parallel N against --parallel 1.

    python perf/campaign_speed.py [--parallel 8] [--items 96] [--repeats 3] [--threads 2] [--record]

Runs single-fault campaigns of examples/fault-campaign.toml's kind (`faults:1` at bit 14 of an
fp16 cache, one injection per next-token item, against the golden run) sequentially and with
N sequences, interleaved (1, N, 1, N, ...) on one model, and prints each repeat's injections per
minute and their ratio. The outcomes of the two are the same item for item
(tests/test_campaign_parallel.py), so the ratio is what a campaign gains.
"""

from __future__ import annotations

import argparse
import time

from kvinject.benchmarks import NextToken
from kvinject.engine.model import Model
from kvinject.engine.options import BackendOptions
from kvinject.error_models.configuration import Configuration
from kvinject.experiments.executor import evaluate
from measurements import add_record_flag, record

SPEC = "faults:1,bit=14"


def per_minute(model: Model, items: int) -> float:
    """Injections per minute of one campaign run of ``items`` items, its golden run included."""
    bench = NextToken(limit=items)
    plan = [(Configuration(), [0]), (Configuration.parse(SPEC), [0])]
    start = time.perf_counter()
    for _ in evaluate(bench, model, plan, seed=0, progress=lambda n: None):
        pass
    return items / (time.perf_counter() - start) * 60


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default=None)
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument("--parallel", type=int, default=8)
    ap.add_argument("--items", type=int, default=96)
    ap.add_argument("--repeats", type=int, default=3)
    add_record_flag(ap)
    args = ap.parse_args()
    models = {n: Model(args.model, BackendOptions(threads=args.threads, parallel=n)) for n in (1, args.parallel)}
    per_minute(models[args.parallel], 8)  # compiled callback and caches warm before timing
    ratios = []
    for i in range(args.repeats):
        one, many = (per_minute(models[n], args.items) for n in (1, args.parallel))
        ratios.append(many / one)
        print(f"repeat {i}: {one:.0f} injections/min at --parallel 1, {many:.0f} at --parallel {args.parallel}: {many / one:.2f}x")
    record(args, "cpu", f"campaign-parallel-{args.parallel}", f"fault campaign `{SPEC}`, injections per minute, --parallel {args.parallel} / 1", ratios)


if __name__ == "__main__":
    main()
