"""Generation throughput: kvinject's IFEval-style evaluation against llama-batched-bench at the
same parallelism, and with injection.

    python benchmarks/generation_speed.py [--tools DIR] [--parallel 8] [--prompts 32] [--max-tokens 100]

kvinject: the IFEval-style benchmark on the bundled prompts (chat template, greedy, up to
--max-tokens), --parallel sequences with continuous refilling; tokens/s counts prompt and
generated tokens over the benchmark's own clock (decoding, sampling and scoring included).
llama-batched-bench: --parallel sequences of a prompt as long as kvinject's mean prompt and
--max-tokens generated tokens each; its S t/s column (prompt and generated tokens over the
whole time). Both in this one run, same model, threads and cache type, alternating --repeats
times, medians reported. Then the same kvinject evaluation under normal:0,0.25 against none.
"""

from __future__ import annotations

import argparse
import re
import statistics

from tools import find_tool, run_tool

from kvinject.benchmarks import IFEval
from kvinject.config import Configuration
from kvinject.model import Model
from kvinject.options import BackendOptions


def batched_bench(tool, model: Model, prompt: int, args: argparse.Namespace) -> float:
    """llama-batched-bench's S t/s for one row: pp=prompt, tg=max tokens, pl=parallel."""
    out = run_tool([
        tool, "-m", model.path, "-t", model.backend.n_threads, "-ngl", model.n_gpu_layers,
        "-c", args.parallel * (prompt + args.max_tokens) + 64, "-b", 2048, "-ub", 512,
        "-npp", prompt, "-ntg", args.max_tokens, "-npl", args.parallel, "-ctk", "f16", "-ctv", "f16",
    ])
    row = next(line for line in out.splitlines() if re.match(rf"\|\s+{prompt}\s+\|\s+{args.max_tokens}\s+\|\s+{args.parallel}\s+\|", line))
    return float(row.strip("|").split("|")[-1])


def kvinject_generation(model: Model, bench: IFEval, spec: str) -> tuple[float, int]:
    """(tokens/s, generated tokens) of the IFEval-style bench for one configuration."""
    (result,) = bench.evaluate(model, [(Configuration.parse(spec), [0])], seed=0, progress=lambda n: None)
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
    args = ap.parse_args()
    tool = find_tool("llama-batched-bench", args.tools)
    model = Model(args.model, BackendOptions(threads=args.threads, parallel=args.parallel))
    bench = IFEval(limit=args.prompts, max_tokens=args.max_tokens)
    prompts = [len(model.tokenize(model.chat_prompt(i.prompt), parse_special=True)) for i in bench.items]
    mean_prompt = round(sum(prompts) / len(prompts))
    kvinject_generation(model, IFEval(limit=args.parallel, max_tokens=8), "none")  # warm up
    speeds: dict[str, list[float]] = {"ref": [], "none": [], "normal:0,0.25": []}
    for _ in range(args.repeats):
        speeds["ref"].append(batched_bench(tool, model, mean_prompt, args))
        for spec in ("none", "normal:0,0.25"):
            speed, generated = kvinject_generation(model, bench, spec)
            speeds[spec].append(speed)
    ref, clean, noisy = (statistics.median(v) for v in speeds.values())
    print(f"model {model.path.name}, {model.backend.n_threads} threads, {model.n_gpu_layers} GPU layers, parallel {args.parallel}, "
          f"{len(prompts)} prompts (mean {mean_prompt} tokens), up to {args.max_tokens} generated "
          f"(mean {generated / len(prompts):.0f} under noise); median of {args.repeats}")
    print(f"{'run':<34}{'tok/s':>9}{'ratio':>8}")
    print(f"{'llama-batched-bench':<34}{ref:>9.1f}{1:>8.3f}")
    print(f"{'kvinject ifeval, none':<34}{clean:>9.1f}{clean / ref:>8.3f}")
    print(f"{'kvinject ifeval, normal:0,0.25':<34}{noisy:>9.1f}{noisy / ref:>8.3f}")
    print(f"injection overhead (normal:0,0.25 / none): {noisy / clean:.3f}")


if __name__ == "__main__":
    main()
