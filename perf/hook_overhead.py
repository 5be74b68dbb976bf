"""Decode time with the K/V hook against the same decode without it, interleaved decode by decode.

    python perf/hook_overhead.py [--model M] [--steps 100] [--sequences 1 8] [--errors normal:0,0 ...]
        [--prompt-tokens N] [--flash-attn off] [--no-launch]

For each number of sequences, one context per configuration holds the same prompt per sequence
(a short sentence, or it repeated to --prompt-tokens: cache-resident compressors such as KIVI,
with its 128 exact tokens, or eviction to a budget act only on longer caches); then --steps
times, each context decodes the next token of every sequence, the configurations one after
the other, each timed until the device has computed it (on a GPU llama_decode returns before:
timed alone, a clean decode of SmolLM2-135M on an H100 read 0.13 ms where it takes 1.2, and a
hooked one, which waits at every claim, 2.7). Interleaving single decodes keeps this machine's speed
drift out of the comparison: the ratio reported is the median over steps of the clean
decode's time over the configuration's. With layers on a GPU, ``--no-launch`` replaces the
hook's kernel launches by nothing (values unchanged): what the graph splits and the waits cost
alone, against the full hook's time in a run without it.
"""

from __future__ import annotations

import argparse
import statistics
import time

from kvinject.engine.context import Context
from kvinject.engine.model import Model
from kvinject.engine.options import BackendOptions, CacheOptions
from kvinject.error_models import parse_error
from measurements import add_record_flag, model_label, record
from tools import spread

ERRORS = ["normal:0,0", "normal:0,0.25"]
PROMPT = "The history of the printing press begins in the fifteenth century, when"


def decode_times(model: Model, cache: CacheOptions, prompt: list[int], specs: list[str], n_seq: int, steps: int) -> dict[str, list[float]]:
    n_ctx = n_seq * (len(prompt) + steps) + 64
    # A stream of cells per sequence, as generation benchmarks decode, unless a configuration
    # edits cached cells (KIVI, eviction), which keeps one pool: then all do, like for like.
    errors = {spec: parse_error(spec) for spec in specs}
    streams = all(e.resident is None for e in errors.values())
    contexts = {spec: Context(model, cache, error=e, n_seq=n_seq, n_ctx=n_ctx, streams=streams) for spec, e in errors.items()}
    times: dict[str, list[float]] = {spec: [] for spec in specs}
    try:
        for ctx in contexts.values():
            for seq in range(n_seq):
                ctx.begin_item(seq, seq)
                ctx.prefill(prompt, seq=seq)
        for i in range(steps):
            entries = [(prompt[-1], len(prompt) + i, seq, True) for seq in range(n_seq)]
            for spec, ctx in contexts.items():
                start = time.perf_counter()
                ctx.decode(entries)
                ctx.synchronize()
                times[spec].append(time.perf_counter() - start)
    finally:
        for ctx in contexts.values():
            ctx.close()
    return times


def launch_nothing():
    """Point the hook's launches, compiled or from Python, at a function of cuLaunchKernel's
    signature that launches nothing; the claims, their synchronizations and the decodes stay.
    Returns the function, which must live as long as the launches."""
    from dataclasses import replace

    from numba import cfunc, types

    from kvinject.engine.callback import device_launch

    @cfunc(types.int32(types.voidptr, *[types.uint32] * 7, types.voidptr, types.voidptr, types.voidptr))
    def nothing(function, gx, gy, gz, bx, by, bz, shared, stream, params, extra):
        return 0

    cuda_driver = device_launch.cuda_driver
    device_launch.cuda_driver = lambda: replace(cuda_driver(), launch=nothing.address)
    return nothing


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default=None)
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument("--steps", type=int, default=100)
    ap.add_argument("--blocks", type=int, default=5, help="the steps are cut into blocks, one ratio each, for the spread")
    ap.add_argument("--sequences", type=int, nargs="+", default=[1, 8])
    ap.add_argument("--errors", nargs="+", default=ERRORS, help="error specs compared with none")
    ap.add_argument("--prompt-tokens", type=int, default=None, help="repeat the prompt to this many tokens")
    ap.add_argument("--flash-attn", default="auto", help="for every configuration (evict:h2o and tova need off)")
    ap.add_argument("--no-launch", action="store_true", help="on a GPU: the hook claims and synchronizes but launches no kernel")
    add_record_flag(ap)
    args = ap.parse_args()
    nothing = launch_nothing() if args.no_launch else None  # noqa: F841 (kept alive)
    model = Model(args.model, BackendOptions(threads=args.threads))
    prompt = model.tokenize(PROMPT)
    if args.prompt_tokens:
        prompt = (prompt * (args.prompt_tokens // len(prompt) + 1))[: args.prompt_tokens]
    cache = CacheOptions(flash_attn=args.flash_attn)
    print(f"model {model.path.name}, {model.backend.n_threads} threads, flash attention {args.flash_attn}" + (", no kernel launches" if args.no_launch else ""))
    print(f"{len(prompt)}-token prompt, {args.steps} interleaved decode steps")
    specs = ["none", *args.errors]
    w = max(16, *(len(s) + 2 for s in specs))
    print(f"{'sequences':>9}  {'error':<{w}}{'ms/decode':>10}  ratio to none: median over blocks of {args.steps // args.blocks} steps")
    for n_seq in args.sequences:
        times = decode_times(model, cache, prompt, specs, n_seq, args.steps)
        size = args.steps // args.blocks
        print(f"{n_seq:>9}  {'none':<{w}}{statistics.median(times['none']) * 1e3:>10.2f}")
        for spec in specs[1:]:
            pairs = [clean / t for clean, t in zip(times["none"], times[spec])]
            blocks = [statistics.median(pairs[i : i + size]) for i in range(0, size * args.blocks, size)]
            print(f"{n_seq:>9}  {spec:<{w}}{statistics.median(times[spec]) * 1e3:>10.2f}  {spread(blocks)}")
            key = f"decode {model_label(args.model)} {spec} x{n_seq}" + (f" prompt{args.prompt_tokens}" if args.prompt_tokens else "")
            key += " fa-off" * (args.flash_attn == "off") + " no-launch" * args.no_launch
            gpu = model.n_gpu_layers > 0
            record(args, "gpu" if gpu else "cpu", key, f"decode, {n_seq} sequence(s), `{spec}` / none", blocks, gpu)


if __name__ == "__main__":
    main()
