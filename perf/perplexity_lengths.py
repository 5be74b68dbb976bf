"""Perplexity as the context grows: kvinject against llama-perplexity, speed and peak memory.

    python perf/perplexity_lengths.py --tools DIR [--model gemma3-270m] [--ctx 512,2048,8192,32768]

At each context length both evaluate the same text, chunks, threads and cache as whole
processes, taking turns (llama-perplexity, kvinject, llama-perplexity, ...), so a machine whose
speed drifts weighs on both alike. Time is the evaluation of the chunks: llama-perplexity's from
its log timestamps (start of the chunk loop to the final estimate), kvinject's from its record
(`seconds`). Peak memory is each process's maximum resident set (``wait4``). llama-perplexity
runs with ``--no-repack`` and ``--swa-full``: kvinject loads weights without repacking them
(docs/perplexity.md) and keeps a full-size cache for sliding-window layers, so the two compute
alike and their PPL must agree to the digit, which is checked. (llama-perplexity's default
sliding-window cache of window + ubatch cells sums attention over fewer cells, in another order:
Gemma 3 270M at 8192 tokens gives 21.2993 so, 21.2864 with --swa-full, as kvinject.)
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from kvinject.data import read_text
from kvinject.engine.model import resolve_model
from measurements import add_record_flag, model_label, record
from tools import find_tool, stamp_before


def measured(argv: list[str | Path]) -> tuple[str, str, float]:
    """Run ``argv``: its stdout, stderr and peak resident memory in GB (its own, from wait4)."""
    with tempfile.TemporaryFile("w+") as out, tempfile.TemporaryFile("w+") as err:
        proc = subprocess.Popen([str(a) for a in argv], stdout=out, stderr=err, text=True)
        _, status, usage = os.wait4(proc.pid, 0)
        proc.returncode = os.waitstatus_to_exitcode(status)
        out.seek(0), err.seek(0)
        stdout, stderr = out.read(), err.read()
    if proc.returncode:
        sys.exit(f"{argv[0]} failed ({proc.returncode}):\n{(stdout + stderr)[-2000:]}")
    return stdout, stderr, usage.ru_maxrss / 1e6  # ru_maxrss is in KB on Linux


def llama_perplexity(tool: Path, model: Path, data: Path, ctx: int, chunks: int, threads: int) -> tuple[float, float, float]:
    argv = [tool, "-m", model, "-f", data, "-c", ctx, "--chunks", chunks, "-t", threads, "-ngl", 0, "--no-repack", "--swa-full"]
    out, err, peak = measured(argv)
    log = out + err
    seconds = stamp_before(log, "Final estimate") - stamp_before(log, "perplexity: calculating perplexity over")
    return float(re.search(r"Final estimate: PPL = ([\d.]+)", log)[1]), seconds, peak


def kvinject_perplexity(model: str, data: Path, ctx: int, chunks: int, threads: int) -> tuple[float, float, float]:
    argv = [sys.executable, "-m", "kvinject", "run", "--bench", "perplexity", "--model", model, "--data", data, "--ctx", ctx, "--chunks", chunks]
    out, _, peak = measured([*argv, "--threads", threads, "--runs", 1, "--format", "json"])
    (record,) = json.loads(out)["records"]
    return record["metrics"]["ppl"], record["seconds"], peak


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tools", help="folder holding llama-perplexity (else $LLAMA_TOOLS or PATH)")
    ap.add_argument("--model", default="smollm2")
    ap.add_argument("--data", default=None, help="text file (default: the bundled encyclopedia corpus)")
    ap.add_argument("--ctx", default="512,2048,8192", help="context lengths, comma-separated")
    ap.add_argument("--tokens", type=int, default=8192, help="tokens scored at each length: chunks = max(1, tokens // ctx)")
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--threads", type=int, default=2)
    add_record_flag(ap)
    args = ap.parse_args()
    tool = find_tool("llama-perplexity", args.tools)
    path = resolve_model(args.model)
    print(f"model {path.name}, {args.threads} threads, llama-perplexity --no-repack --swa-full; medians of {args.repeats}, whole processes taking turns")
    print(f"{'ctx':>6}{'chunks':>7}{'PPL':>10}{'llama s':>9}{'kvinject s':>11}{'speed':>7}{'llama GB':>10}{'kvinject GB':>12}{'memory':>8}")
    with tempfile.TemporaryDirectory() as tmp:
        data = Path(args.data) if args.data else Path(tmp) / "corpus.txt"
        if not args.data:
            data.write_text(read_text(None, "encyclopedia"))
        for ctx in (int(c) for c in args.ctx.split(",")):
            chunks = max(1, args.tokens // ctx)
            runs: dict[str, list[tuple[float, float, float]]] = {"ref": [], "kvinject": []}
            for _ in range(args.repeats):
                runs["ref"].append(llama_perplexity(tool, path, data, ctx, chunks, args.threads))
                runs["kvinject"].append(kvinject_perplexity(args.model, data, ctx, chunks, args.threads))
            (ref_ppl, *_), (ppl, *_) = runs["ref"][0], runs["kvinject"][0]
            if f"{ppl:.4f}" != f"{ref_ppl:.4f}":
                print(f"ctx {ctx}: PPL differs: llama-perplexity {ref_ppl:.4f}, kvinject {ppl:.4f}")
            ref_s, s = (statistics.median(r[1] for r in runs[k]) for k in ("ref", "kvinject"))
            ref_gb, gb = (max(r[2] for r in runs[k]) for k in ("ref", "kvinject"))
            speeds = sorted(r[1] / k[1] for r, k in zip(runs["ref"], runs["kvinject"]))
            spread = f"{statistics.median(speeds):.3f} ({speeds[0]:.3f}–{speeds[-1]:.3f})"
            print(f"{ctx:>6}{chunks:>7}{ppl:>10.4f}{ref_s:>9.1f}{s:>11.1f}  {spread}{ref_gb:>10.2f}{gb:>12.2f}{gb / ref_gb:>8.2f}")
            label = model_label(args.model)
            what = f"kvinject / llama-perplexity, {label}, ctx {ctx}"
            record(args, "cpu", f"perplexity {label} ctx{ctx}", f"perplexity speed, {what}", speeds)
            record(args, "cpu", f"perplexity memory {label} ctx{ctx}", f"perplexity peak memory, {what}", [gb / ref_gb], n=args.repeats)


if __name__ == "__main__":
    main()
