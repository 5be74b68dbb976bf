"""Perplexity throughput: kvinject against llama.cpp's llama-perplexity, and with injection.

    python perf/perplexity_speed.py [--tools DIR] [--ctx 512] [--chunks 16] [--data FILE]

Both evaluate the same model, text, context, chunk count, threads and cache types in this one
run. Time is the evaluation of the chunks (decoding and scoring), without loading and
tokenizing: llama-perplexity's from its log timestamps (start of the chunk loop to the final
estimate), kvinject's from the benchmark's own clock. The PPL of both is printed to show that
they did the same work. Then the same kvinject evaluation under normal:0,0.25 against none.
The three alternate --repeats times; medians are reported, and the injection overhead is the
median of the ratios of runs made back to back.
"""

from __future__ import annotations

import argparse
import re
import statistics
import tempfile
from pathlib import Path

from kvinject.benchmarks import Perplexity
from kvinject.data import read_text
from kvinject.engine.model import Model
from kvinject.engine.options import BackendOptions, CacheOptions
from kvinject.error_models.configuration import Configuration
from measurements import add_record_flag, model_label, record
from tools import find_tool, run_tool, spread, stamp_before


def llama_perplexity(tool: Path, model: Model, data: Path, args: argparse.Namespace) -> tuple[float, float]:
    """(PPL, seconds) of llama-perplexity on the same settings."""
    out = run_tool(
        [
            tool,
            "-m",
            model.path,
            "-f",
            data,
            "-c",
            args.ctx,
            "--chunks",
            args.chunks,
            "-t",
            model.backend.n_threads,
            "-ngl",
            model.n_gpu_layers,
            "-ctk",
            args.cache_type,
            "-ctv",
            args.cache_type,
            *(["-b", args.ctx * args.parallel] if args.parallel else []),
        ]
    )
    seconds = stamp_before(out, "Final estimate") - stamp_before(out, "perplexity: calculating perplexity over")
    return float(re.search(r"Final estimate: PPL = ([\d.]+)", out)[1]), seconds


def kvinject_perplexity(model: Model, bench: Perplexity, spec: str, cache: CacheOptions) -> tuple[float, float]:
    """(PPL, seconds) of kvinject's perplexity bench for one configuration alone."""
    config = Configuration.parse(spec, cache=cache)
    (result,) = bench.evaluate(model, [(config, [0])], seed=0, progress=lambda n: None)
    return result.metrics["ppl"], result.seconds


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tools", help="folder holding llama-perplexity (else $LLAMA_TOOLS or PATH)")
    ap.add_argument("--model", default=None)
    ap.add_argument("--data", default=None, help="text file (default: the bundled encyclopedia corpus)")
    ap.add_argument("--ctx", type=int, default=512)
    ap.add_argument("--chunks", type=int, default=8)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument("--parallel", type=int, default=None, help="chunks per decode (default: kvinject's; llama-perplexity's -b 2048)")
    ap.add_argument("--cache-type", default="f16")
    add_record_flag(ap)
    args = ap.parse_args()
    tool = find_tool("llama-perplexity", args.tools)
    model = Model(args.model, BackendOptions(threads=args.threads, parallel=args.parallel))
    cache = CacheOptions(type_k=args.cache_type, type_v=args.cache_type)
    with tempfile.TemporaryDirectory() as tmp:
        data = Path(args.data) if args.data else Path(tmp) / "corpus.txt"
        if not args.data:
            data.write_text(read_text(None, "encyclopedia"))
        bench = Perplexity(data=str(data), chunks=args.chunks, ctx=args.ctx)
        bench.prepare(model)
        warm_up = Perplexity(data=str(data), chunks=model.chunks_per_decode(args.ctx), ctx=args.ctx)
        warm_up.prepare(model)
        kvinject_perplexity(model, warm_up, "none", cache)
        seconds: dict[str, list[float]] = {"ref": [], "none": [], "normal:0,0.25": []}
        for _ in range(args.repeats):
            ref_ppl, s = llama_perplexity(tool, model, data, args)
            seconds["ref"].append(s)
            for spec in ("none", "normal:0,0.25"):
                value, s = kvinject_perplexity(model, bench, spec, cache)
                seconds[spec].append(s)
                if spec == "none":
                    ppl = value
    ref_s, clean_s, noisy_s = (statistics.median(v) for v in seconds.values())
    tokens = len(bench) * args.ctx
    print(
        f"model {model.path.name}, {model.backend.n_threads} threads, {model.n_gpu_layers} GPU layers, "
        f"ctx {args.ctx}, {len(bench)} chunks, {model.chunks_per_decode(args.ctx)} per kvinject decode, cache {args.cache_type}; median of {args.repeats}"
    )
    print(f"{'run':<34}{'PPL':>9}{'tok/s':>9}  ratio to llama-perplexity, paired per repeat")
    print(f"{'llama-perplexity':<34}{ref_ppl:>9.4f}{tokens / ref_s:>9.1f}")
    print(f"{'kvinject, none':<34}{ppl:>9.4f}{tokens / clean_s:>9.1f}  {spread([r / c for r, c in zip(seconds['ref'], seconds['none'])])}")
    print(f"{'kvinject, normal:0,0.25':<34}{'':>9}{tokens / noisy_s:>9.1f}  {spread([r / n for r, n in zip(seconds['ref'], seconds['normal:0,0.25'])])}")
    # none and normal:0,0.25 run back to back in each repeat: their paired ratios are steadier
    # than a ratio of medians on a machine whose speed drifts.
    paired = [clean / noisy for clean, noisy in zip(seconds["none"], seconds["normal:0,0.25"])]
    print(f"injection overhead (normal:0,0.25 / none, paired runs): {spread(paired)}")
    gpu, key = model.n_gpu_layers > 0, f"perplexity {model_label(args.model)} ctx{args.ctx}"
    table, chunks = "gpu" if gpu else "cpu", f"ctx {args.ctx}, {len(bench)} chunks"
    record(args, table, key, f"perplexity speed, kvinject / llama-perplexity, {chunks}", [r / c for r, c in zip(seconds["ref"], seconds["none"])], gpu)
    record(args, table, f"{key} normal:0,0.25/none", f"perplexity, `normal:0,0.25` / none, {chunks}", paired, gpu)


if __name__ == "__main__":
    main()
