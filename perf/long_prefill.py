"""Prefill and decode at long context: with the K/V hook against without it, and against
llama-batched-bench, interleaved.

    python perf/long_prefill.py [--model M] [--length 8192] [--steps 32] [--repeats 3]
                                      [--errors normal:0,0.25 ...] [--tools DIR]

One context per configuration, each of --length + --steps cells. Each repeat empties them,
prefills the same --length tokens of the bundled encyclopedia in n_batch pieces, the
configurations taking turns piece by piece (so that this machine's drift falls on all alike),
then decodes --steps tokens after it, again in turns. Ratios, one per repeat: the clean
run's time over the configuration's (below 1: what the hook costs). With llama-batched-bench
found (--tools, $LLAMA_TOOLS or PATH), its prompt speed at the same length (-npp, one
sequence, the same batch sizes) is run before each repeat and compared with kvinject's clean
prefill.
"""

from __future__ import annotations

import argparse
import re
import time

from kvinject.benchmarks.haystack import filler_sentences
from kvinject.engine.context import Context
from kvinject.engine.model import Model
from kvinject.engine.options import BackendOptions
from kvinject.error_models import parse_error
from tools import find_tool, run_tool, spread

ERRORS = ["normal:0,0.25"]
N_BATCH = 512  # kvinject's and llama.cpp's default batch and ubatch


def text_tokens(model: Model, length: int) -> list[int]:
    """The first ``length`` tokens of the bundled encyclopedia (about 40K tokens), repeated if need be."""
    tokens = model.tokenize(" ".join(filler_sentences(None)))
    return (tokens * (length // len(tokens) + 1))[:length]


def repeat(model: Model, contexts: dict, tokens: list[int], steps: int) -> tuple[dict[str, float], dict[str, float]]:
    """Seconds of prefill and of --steps decodes per configuration, taking turns."""
    prefill = dict.fromkeys(contexts, 0.0)
    decode = dict.fromkeys(contexts, 0.0)
    for ctx in contexts.values():
        ctx.begin_item(0, 0)
    for start in range(0, len(tokens), N_BATCH):
        piece = tokens[start : start + N_BATCH]
        entries = [(t, start + j, 0, start + j == len(tokens) - 1) for j, t in enumerate(piece)]
        for spec, ctx in contexts.items():
            t0 = time.perf_counter()
            ctx.decode(entries)
            prefill[spec] += time.perf_counter() - t0
    for i in range(steps):
        entry = [(tokens[i], len(tokens) + i, 0, True)]
        for spec, ctx in contexts.items():
            t0 = time.perf_counter()
            ctx.decode(entry)
            decode[spec] += time.perf_counter() - t0
    return prefill, decode


def batched_bench_pp(tool, model: Model, length: int) -> float:
    """llama-batched-bench's prompt speed (S_PP t/s) for one sequence of ``length`` tokens."""
    out = run_tool(
        [tool, "-m", model.path, "-t", model.backend.n_threads, "-ngl", model.n_gpu_layers, "-c", length + 64, "-b", N_BATCH, "-ub", N_BATCH]
        + ["-npp", length, "-ntg", 1, "-npl", 1, "-ctk", "f16", "-ctv", "f16"]
    )
    row = next(line for line in out.splitlines() if re.match(rf"\|\s+{length}\s+\|\s+1\s+\|\s+1\s+\|", line))
    return float(row.strip("|").split("|")[5])  # PP, TG, B, N_KV, T_PP s, S_PP t/s


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default=None)
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument("--length", type=int, default=8192)
    ap.add_argument("--steps", type=int, default=32)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--errors", nargs="+", default=ERRORS, help="error specs compared with none")
    ap.add_argument("--tools", help="folder holding llama-batched-bench (else $LLAMA_TOOLS or PATH; skipped when absent)")
    args = ap.parse_args()
    model = Model(args.model, BackendOptions(threads=args.threads))
    tokens = text_tokens(model, args.length)
    try:
        tool = find_tool("llama-batched-bench", args.tools)
    except SystemExit:
        tool = None
    specs = ["none", *args.errors]
    contexts = {s: Context(model, error=parse_error(s), n_ctx=args.length + args.steps + 64, n_batch=N_BATCH) for s in specs}
    print(f"model {model.path.name}, {model.backend.n_threads} threads, prefill of {args.length} tokens then {args.steps} decodes, {args.repeats} repeats")
    runs, reference = [], []
    try:
        for _ in range(args.repeats):
            if tool is not None:
                reference.append(batched_bench_pp(tool, model, args.length))
            runs.append(repeat(model, contexts, tokens, args.steps))
    finally:
        for ctx in contexts.values():
            ctx.close()
    clean_pp = [args.length / prefill["none"] for prefill, _ in runs]
    print(f"{'':<18}{'prefill tok/s':>14}{'ms/decode':>11}  ratios to none (prefill; decode): median (min, max) over repeats")
    for spec in specs:
        pp = [args.length / prefill[spec] for prefill, _ in runs]
        ms = [decode[spec] / args.steps * 1e3 for _, decode in runs]
        line = f"{spec:<18}{sorted(pp)[len(pp) // 2]:>14.1f}{sorted(ms)[len(ms) // 2]:>11.2f}"
        if spec != "none":
            line += f"  {spread([p['none'] / p[spec] for p, _ in runs])}; {spread([d['none'] / d[spec] for _, d in runs])}"
        print(line)
    if reference:
        print(f"{'llama-batched-bench':<18}{sorted(reference)[len(reference) // 2]:>14.1f}")
        print(f"kvinject clean prefill / llama-batched-bench, paired per repeat: {spread([k / r for k, r in zip(clean_pp, reference)])}")


if __name__ == "__main__":
    main()
