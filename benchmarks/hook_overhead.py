"""Decode throughput with the K/V hook against the same decode without it, in one run.

    python benchmarks/hook_overhead.py [--model M] [--steps 64] [--repeats 5]

Each configuration decodes the same tokens: a short prompt per sequence, then --steps decode
calls of one token per sequence (1 and 8 parallel sequences). Configurations alternate within
each repeat, and the median tokens/s is reported with its ratio to the run without the hook.
"""

from __future__ import annotations

import argparse
import statistics
import time

from kvinject.error_models import parse_error
from kvinject.model import Model
from kvinject.options import BackendOptions

CONFIGS = ["none", "normal:0,0", "normal:0,0.25"]
PROMPT = "The history of the printing press begins in the fifteenth century, when"


def decode_speed(model: Model, spec: str, n_seq: int, steps: int) -> float:
    prompt = model.tokenize(PROMPT)
    with model.context(error=parse_error(spec), n_seq=n_seq, n_ctx=n_seq * (len(prompt) + steps) + 64) as ctx:
        for seq in range(n_seq):
            ctx.prefill(prompt, seq=seq)
        token = prompt[-1]
        start = time.perf_counter()
        for i in range(steps):
            ctx.decode([(token, len(prompt) + i, seq, True) for seq in range(n_seq)])
        return n_seq * steps / (time.perf_counter() - start)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default=None)
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument("--steps", type=int, default=64)
    ap.add_argument("--repeats", type=int, default=5)
    args = ap.parse_args()
    model = Model(args.model, BackendOptions(threads=args.threads))
    print(f"model {model.path.name}, {model.backend.n_threads} threads, {args.steps} decode steps, median of {args.repeats}")
    print(f"{'sequences':>9}  {'error':<16}{'tok/s':>9}  {'ratio':>6}")
    for n_seq in (1, 8):
        speeds: dict[str, list[float]] = {c: [] for c in CONFIGS}
        decode_speed(model, "none", n_seq, 8)  # warm up caches and threads
        for _ in range(args.repeats):
            for spec in CONFIGS:
                speeds[spec].append(decode_speed(model, spec, n_seq, args.steps))
        clean = statistics.median(speeds["none"])
        for spec in CONFIGS:
            speed = statistics.median(speeds[spec])
            print(f"{n_seq:>9}  {spec:<16}{speed:>9.1f}  {speed / clean:>6.3f}")


if __name__ == "__main__":
    main()
