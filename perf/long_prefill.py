"""Long-prompt generation: prefill and decode at long context with the K/V hook against without
it, and against llama-batched-bench, interleaved.

    python perf/long_prefill.py [--model M] [--length 8192] [--steps 32] [--sequences 1]
                                [--repeats 3] [--errors normal:0,0.25 ...] [--tools DIR]

One context per configuration and repeat, of --sequences x (--length + --steps) cells, a stream
of cells per sequence. Each repeat prefills each sequence with the same --length tokens of
the bundled encyclopedia in n_batch pieces, the configurations taking turns piece by piece, in
reversed order every other turn (so that this machine's drift and going first fall on all
alike), then decodes --steps tokens after them, every sequence's in one decode, again in turns:
llama-batched-bench's work for -npp --length -ntg --steps -npl --sequences.
Ratios, one per repeat: the clean run's time over the configuration's (below 1: what the hook
costs). With llama-batched-bench found (--tools, $LLAMA_TOOLS or PATH), it runs that row
before the first repeat and after each, and kvinject's clean run is compared with the mean of
the two runs around it: this machine's speed drifts by 10% within minutes, and kvinject's
contexts taking turns run twice as long as batched-bench (docs/performance.md).
`--errors` with no spec runs the clean context alone, one context at a time as batched-bench does.
`--bare` adds a context of llama-cpp-python's own, made with the same parameters and decoded
without kvinject: what kvinject's code adds over the library it drives.
"""

from __future__ import annotations

import argparse
import re
import time

import llama_cpp as ll

from kvinject.benchmarks.haystack import filler_sentences
from kvinject.engine.context import Context
from kvinject.engine.ggml import CACHE_TYPES
from kvinject.engine.model import Model
from kvinject.engine.options import BackendOptions, CacheOptions
from kvinject.error_models import parse_error
from measurements import add_record_flag, model_label, record
from tools import find_tool, run_tool, spread

ERRORS = ["normal:0,0.25"]
N_BATCH = 512  # kvinject's and llama.cpp's default batch and ubatch
BARE = "llama-cpp-python"  # the --bare context's name in the tables


def text_tokens(model: Model, length: int) -> list[int]:
    """The first ``length`` tokens of the bundled encyclopedia (about 40K tokens), repeated if need be."""
    tokens = model.tokenize(" ".join(filler_sentences(None)))
    return (tokens * (length // len(tokens) + 1))[:length]


class Bare:
    """A llama-cpp-python context with the parameters kvinject's clean Context sets (no hook),
    decoded through the same batch fields: the library's speed in this process."""

    def __init__(self, model: Model, n_ctx: int, n_seq: int) -> None:
        params = ll.llama_context_default_params()
        params.n_ctx, params.n_batch, params.n_ubatch, params.n_seq_max = n_ctx, N_BATCH, N_BATCH, n_seq
        params.kv_unified = False  # a stream per sequence, as Context(streams=True) and batched-bench
        params.n_threads = params.n_threads_batch = model.backend.n_threads
        cache = CacheOptions()  # the cache Context makes when given none: its types and flash attention
        params.type_k, params.type_v = CACHE_TYPES[cache.type_k], CACHE_TYPES[cache.type_v]
        params.flash_attn_type = cache.flash_attn_type
        params.no_perf = True
        self._ptr = ll.llama_init_from_model(model.ptr, params)
        if not self._ptr:
            raise RuntimeError(f"llama-cpp-python could not create a context of n_ctx={n_ctx}")
        self._batch = ll.llama_batch_init(N_BATCH, 0, n_seq)

    def begin_item(self, seq: int, item: int) -> None:
        """Nothing to seed: no noise without kvinject."""

    def decode(self, entries: list[tuple[int, int, int, bool]]) -> None:
        for i, (token, pos, seq, logits) in enumerate(entries):
            self._batch.token[i], self._batch.pos[i], self._batch.logits[i] = token, pos, logits
            self._batch.n_seq_id[i], self._batch.seq_id[i][0] = 1, seq
        self._batch.n_tokens = len(entries)
        if ll.llama_decode(self._ptr, self._batch) != 0:
            raise RuntimeError("llama_decode failed")

    def synchronize(self) -> None:
        ll.llama_synchronize(self._ptr)

    def close(self) -> None:
        ll.llama_batch_free(self._batch)
        ll.llama_free(self._ptr)


def turns(contexts: dict, i: int) -> list:
    """The configurations in the order they take the ``i``-th turn: reversed every other turn, so
    that going first (a cache warmed by the other's decode, or not) favours none of them."""
    items = list(contexts.items())
    return items[::-1] if i % 2 else items


def repeat(contexts: dict, tokens: list[int], steps: int, sequences: int) -> tuple[dict[str, float], dict[str, float]]:
    """Seconds of prefill and of --steps decodes per configuration, taking turns."""
    prefill = dict.fromkeys(contexts, 0.0)
    decode = dict.fromkeys(contexts, 0.0)
    for seq in range(sequences):
        for ctx in contexts.values():
            ctx.begin_item(seq, seq)
        for start in range(0, len(tokens), N_BATCH):
            piece = tokens[start : start + N_BATCH]
            entries = [(t, start + j, seq, start + j == len(tokens) - 1) for j, t in enumerate(piece)]
            for spec, ctx in turns(contexts, start // N_BATCH):
                t0 = time.perf_counter()
                ctx.decode(entries)
                ctx.synchronize()
                prefill[spec] += time.perf_counter() - t0
    for i in range(steps):
        entries = [(tokens[i], len(tokens) + i, seq, True) for seq in range(sequences)]
        for spec, ctx in turns(contexts, i):
            t0 = time.perf_counter()
            ctx.decode(entries)
            ctx.synchronize()
            decode[spec] += time.perf_counter() - t0
    return prefill, decode


def batched_bench(tool, model: Model, length: int, steps: int, sequences: int) -> tuple[float, float]:
    """llama-batched-bench's prompt speed (S_PP t/s) and whole time (T s) for --sequences of
    ``length`` prompt tokens and ``steps`` generated."""
    out = run_tool(
        [tool, "-m", model.path, "-t", model.backend.n_threads, "-ngl", model.n_gpu_layers, "-b", N_BATCH, "-ub", N_BATCH]
        + ["-c", sequences * (length + steps + 64), "-npp", length, "-ntg", steps, "-npl", sequences, "-ctk", "f16", "-ctv", "f16"]
        + ["--no-repack", "--swa-full"]  # as kvinject loads weights and sizes sliding-window caches
    )
    row = next(line for line in out.splitlines() if re.match(rf"\|\s+{length}\s+\|\s+{steps}\s+\|\s+{sequences}\s+\|", line))
    cells = row.strip("|").split("|")  # PP, TG, B, N_KV, T_PP s, S_PP t/s, T_TG s, S_TG t/s, T s, S t/s
    return float(cells[5]), float(cells[8])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default=None)
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument("--length", type=int, default=8192)
    ap.add_argument("--steps", type=int, default=32)
    ap.add_argument("--sequences", type=int, default=1, help="sequences prefilled one after the other, then decoded together")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--errors", nargs="*", default=ERRORS, help="error specs compared with none (none given: the clean context alone)")
    ap.add_argument("--bare", action="store_true", help="also a llama-cpp-python context decoded without kvinject")
    ap.add_argument("--tools", help="folder holding llama-batched-bench (else $LLAMA_TOOLS or PATH; skipped when absent)")
    add_record_flag(ap)
    args = ap.parse_args()
    model = Model(args.model, BackendOptions(threads=args.threads))
    tokens = text_tokens(model, args.length)
    try:
        tool = find_tool("llama-batched-bench", args.tools)
    except SystemExit:
        tool = None
    specs = ["none", *args.errors]
    shown = specs + [BARE] * args.bare
    n_ctx = args.sequences * (args.length + args.steps + 64)
    print(
        f"model {model.path.name}, {model.backend.n_threads} threads, {args.sequences} sequence(s): prefill of {args.length} tokens "
        f"each, then {args.steps} decodes; {args.repeats} repeats"
    )
    runs, bench = [], []
    if tool is not None:
        bench.append(batched_bench(tool, model, args.length, args.steps, args.sequences))
    for _ in range(args.repeats):
        # New contexts every repeat, as batched-bench makes its own: on this CPU one context's cache
        # ran 5-15% faster or slower than another's of the same configuration, whichever was hooked.
        # A stream of cells per sequence, as generation benchmarks decode (experiments/executor.py).
        contexts = {s: Context(model, error=parse_error(s), n_ctx=n_ctx, n_seq=args.sequences, n_batch=N_BATCH, streams=True) for s in specs}
        if args.bare:
            contexts[BARE] = Bare(model, n_ctx, args.sequences)
        try:
            runs.append(repeat(contexts, tokens, args.steps, args.sequences))
        finally:
            for ctx in contexts.values():
                ctx.close()
        if tool is not None:
            bench.append(batched_bench(tool, model, args.length, args.steps, args.sequences))
    prompt = args.length * args.sequences
    clean_pp = [prompt / prefill["none"] for prefill, _ in runs]
    gpu, shape = model.n_gpu_layers > 0, f"{args.length} tokens × {args.sequences}"
    table, key = "gpu" if gpu else "cpu", f"long-prompt {model_label(args.model)} {args.length}x{args.sequences}"
    print(f"{'':<18}{'prefill tok/s':>14}{'ms/decode':>11}  speed ratios (prefill; decode), median (min, max) over repeats: to none; none to {BARE}")
    for spec in shown:
        pp = [prompt / prefill[spec] for prefill, _ in runs]
        ms = [decode[spec] / args.steps * 1e3 for _, decode in runs]
        line = f"{spec:<18}{sorted(pp)[len(pp) // 2]:>14.1f}{sorted(ms)[len(ms) // 2]:>11.2f}"
        if spec != "none":
            # an error model's speed over the clean one's; for the bare context, kvinject's clean speed over the library's
            a, b = (spec, "none") if spec == BARE else ("none", spec)
            ratios = [p[a] / p[b] for p, _ in runs]
            decodes = [d[a] / d[b] for _, d in runs]
            line += f"  {spread(ratios)}; {spread(decodes)}\n{'':<18}prefill per repeat: {', '.join(f'{r:.3f}' for r in ratios)}"
            ratio = "none/bare" if spec == BARE else f"{spec}/none"
            record(args, table, f"{key} prefill {ratio}", f"prefill of {shape}, {ratio}", ratios, gpu)
            if spec == BARE:
                record(args, table, f"{key} decode {ratio}", f"decode at {shape}, {ratio}", decodes, gpu)
        print(line)
    if bench:
        # each repeat against the mean of the batched-bench runs before and after it
        reference = [((b0 + b1) / 2, (t0 + t1) / 2) for (b0, t0), (b1, t1) in zip(bench, bench[1:])]
        clean = [p["none"] + d["none"] for p, d in runs]
        print(f"{'llama-batched-bench':<18}{sorted(r for r, _ in bench)[len(bench) // 2]:>14.1f}  runs: {', '.join(f'{r:.1f}' for r, _ in bench)}")
        print(f"kvinject clean, per repeat: {', '.join(f'{k:.1f}' for k in clean_pp)}")
        print(f"kvinject clean / llama-batched-bench around it: prefill speed {spread([k / r for k, (r, _) in zip(clean_pp, reference)])}")
        whole = [t / k for k, (_, t) in zip(clean, reference)]
        print(f"  whole run (prefill and decodes) speed {spread(whole)}")
        record(args, table, key, f"long prompts, {shape}, then {args.steps} decodes, kvinject none / llama-batched-bench", whole, gpu)


if __name__ == "__main__":
    main()
