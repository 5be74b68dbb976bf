"""Generation throughput: kvinject's IFEval-style evaluation against llama-batched-bench at the
same parallelism, and with injection.

    python perf/generation_speed.py [--tools DIR] [--parallel 8] [--prompts 32] [--max-tokens 100] [--forms fixed ifeval]

llama-batched-bench: --parallel sequences of a prompt as long as kvinject's mean prompt and
--max-tokens generated tokens each, past end-of-generation tokens; its S t/s column (prompt
and generated tokens over the whole time). kvinject, in two forms, both on the bundled
IFEval-style prompts (chat template, greedy), --parallel sequences with continuous refilling,
tokens/s over prompt and generated tokens:

- fixed: every prompt generates exactly --max-tokens, as batched-bench does. Injection
  changes the outputs but not the work, so normal:0,0.25 against none is the hook's cost;
  the two runs take turns decode by decode, each timed while it holds the turn.
- ifeval: the benchmark as users run it (stops at end of generation, scoring included).
  Injection changes when responses end, so the work differs too: its ratio includes that.
  (Leave it out with --forms fixed where the model's outputs mean nothing: random weights.)

All in this one run, same model, threads and cache type, alternating --repeats times,
medians reported; the injection overhead is the median of the ratios of the paired runs
(fixed: taking turns; ifeval: back to back, in alternating order).
"""

from __future__ import annotations

import argparse
import re
import statistics
from functools import partial

from kvinject.benchmarks import IFEval
from kvinject.engine.generation.batching import generate_all
from kvinject.engine.model import Model
from kvinject.engine.options import BackendOptions
from kvinject.error_models.configuration import Configuration
from kvinject.experiments.executor import evaluate, generation_context
from measurements import add_record_flag, model_label, record
from tools import TakeTurns, find_tool, run_tool, spread

SPECS = ("none", "normal:0,0.25")


def batched_bench(tool, model: Model, prompt: int, args: argparse.Namespace) -> float:
    """llama-batched-bench's S t/s for one row: pp=prompt, tg=max tokens, pl=parallel."""
    out = run_tool(
        [
            tool,
            "-m",
            model.path,
            "-t",
            model.backend.n_threads,
            "-ngl",
            model.n_gpu_layers,
            "-c",
            args.parallel * (prompt + args.max_tokens) + 64,
            "-b",
            2048,
            "-ub",
            512,
            "-npp",
            prompt,
            "-ntg",
            args.max_tokens,
            "-npl",
            args.parallel,
            "-ctk",
            "f16",
            "-ctv",
            "f16",
        ]
    )
    row = next(line for line in out.splitlines() if re.match(rf"\|\s+{prompt}\s+\|\s+{args.max_tokens}\s+\|\s+{args.parallel}\s+\|", line))
    return float(row.strip("|").split("|")[-1])


def fixed_generation(model: Model, prompts: list[list[int]], spec: str, max_tokens: int, turns: TakeTurns | None = None, run: int = 0) -> int:
    """Prompt and generated tokens when every prompt generates exactly ``max_tokens``; with
    ``turns``, as its run ``run``."""
    per_seq = max(map(len, prompts)) + max_tokens + 1
    call = turns.call if turns else lambda fn, *args: fn(*args)
    ctx = call(generation_context, model, Configuration.parse(spec), 0, 0, per_seq, model.parallel)
    try:
        if turns:
            ctx.decode = turns.wrap(run, ctx.decode)
        gens = generate_all(ctx, prompts, max_tokens, items=range(len(prompts)), ignore_eos=True)
        return sum(len(prompts[i]) + len(gen.tokens) for i, gen in gens)
    finally:
        call(ctx.close)


def fixed_pair(model: Model, prompts: list[list[int]], max_tokens: int) -> dict[str, float]:
    """tokens/s of each configuration generating the same fixed-length work, the two taking
    turns decode by decode (context set-up included)."""
    turns = TakeTurns(len(SPECS))
    tokens = turns.run([partial(fixed_generation, model, prompts, spec, max_tokens, turns, i) for i, spec in enumerate(SPECS)])
    return {spec: n / seconds for spec, n, seconds in zip(SPECS, tokens, turns.seconds)}


def ifeval_generation(model: Model, bench: IFEval, spec: str) -> tuple[float, int]:
    """(tokens/s, generated tokens) of the IFEval-style bench for one configuration."""
    (result,) = evaluate(bench, model, [(Configuration.parse(spec), [0])], seed=0, progress=lambda n: None)
    return result.tokens / result.seconds, sum(map(len, result.outputs))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tools", help="folder holding llama-batched-bench (else $LLAMA_TOOLS or PATH)")
    ap.add_argument("--model", default=None)
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument("--parallel", type=int, default=8)
    ap.add_argument("--prompts", type=int, default=32)
    ap.add_argument("--max-tokens", type=int, default=100)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--forms", nargs="+", choices=("fixed", "ifeval"), default=["fixed", "ifeval"])
    add_record_flag(ap)
    args = ap.parse_args()
    tool = find_tool("llama-batched-bench", args.tools)
    model = Model(args.model, BackendOptions(threads=args.threads, parallel=args.parallel))
    bench = IFEval(limit=args.prompts, max_tokens=args.max_tokens)
    prompts = bench.prompt_tokens(model)
    mean_prompt = round(sum(map(len, prompts)) / len(prompts))
    fixed_generation(model, prompts[: args.parallel], "none", 8)  # warm up
    speeds: dict[str, list[float]] = {"ref": []} | {f"{form} {spec}": [] for form in args.forms for spec in SPECS}
    generated: dict[str, list[int]] = {spec: [] for spec in SPECS}
    for repeat in range(args.repeats):
        speeds["ref"].append(batched_bench(tool, model, mean_prompt, args))
        if "fixed" in args.forms:
            for spec, speed in fixed_pair(model, prompts, args.max_tokens).items():
                speeds[f"fixed {spec}"].append(speed)
        # Every other repeat runs normal:0,0.25 first, so a steady drift of the machine's
        # speed does not favour the configuration that always runs second.
        for spec in (SPECS if repeat % 2 == 0 else SPECS[::-1]) if "ifeval" in args.forms else ():
            speed, n = ifeval_generation(model, bench, spec)
            speeds[f"ifeval {spec}"].append(speed)
            generated[spec].append(n)
    median = {key: statistics.median(v) for key, v in speeds.items()}
    ref = median["ref"]
    print(
        f"model {model.path.name}, {model.backend.n_threads} threads, {model.n_gpu_layers} GPU layers, parallel {args.parallel}, "
        f"{len(prompts)} prompts (mean {mean_prompt} tokens), up to {args.max_tokens} generated; median of {args.repeats}"
    )
    print(f"{'run':<40}{'tok/s':>9}  ratio to llama-batched-bench, paired per repeat")
    print(f"{'llama-batched-bench':<40}{ref:>9.1f}")
    for key in speeds:
        if key != "ref":
            print(f"{'kvinject ' + key:<40}{median[key]:>9.1f}  {spread([s / r for s, r in zip(speeds[key], speeds['ref'])])}")
    # Each repeat pairs none and normal:0,0.25 (taking turns, or back to back): their paired
    # ratios are steadier than a ratio of medians on a machine whose speed drifts.
    for form in args.forms:
        paired = [noisy / clean for noisy, clean in zip(speeds[f"{form} normal:0,0.25"], speeds[f"{form} none"])]
        print(f"injection overhead, {form} (normal:0,0.25 / none, paired runs): {spread(paired)}")
        gpu, key = model.n_gpu_layers > 0, f"generation {model_label(args.model)} {form} x{args.parallel}"
        what = f"generation ({form}), {args.parallel} sequences"
        ratios = [s / r for s, r in zip(speeds[f"{form} none"], speeds["ref"])]
        record(args, "gpu" if gpu else "cpu", key, f"{what}, kvinject none / llama-batched-bench", ratios, gpu)
        record(args, "gpu" if gpu else "cpu", f"{key} normal:0,0.25/none", f"{what}, `normal:0,0.25` / none", paired, gpu)
    if "ifeval" in args.forms:
        print("generated tokens in the ifeval runs: " + ", ".join(f"{spec} {statistics.median(n):.0f}" for spec, n in generated.items()))


if __name__ == "__main__":
    main()
