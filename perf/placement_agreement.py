"""Where in the shared cache an item's cells lie, and whether its greedy output changes.

    python perf/placement_agreement.py [--prompts 16] [--offsets 64 200 300] [--threads 2] [--freed]

For each IFEval-style prompt: its greedy 100-token output in an empty cache, against its output
after another sequence has taken the first OFFSET cells, so that the item's cells start at
OFFSET. With --freed the other sequence is removed once the item's prompt is in, and the
item's generated tokens go to the freed cells, before its prompt's: cell order no longer
follows position order, as happens when parallel evaluation refills the cells of finished
items. Prints how many outputs differ per offset (docs/performance.md reads them).
"""

from __future__ import annotations

import argparse

import numpy as np

from kvinject.benchmarks import IFEval
from kvinject.engine.context import Context
from kvinject.engine.model import Model
from kvinject.engine.options import BackendOptions, CacheOptions

GENERATED = 100


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default=None)
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument("--flash-attn", default="on", choices=["on", "off"])
    ap.add_argument("--prompts", type=int, default=16)
    ap.add_argument("--offsets", type=int, nargs="+", default=[64, 200, 300])
    ap.add_argument("--freed", action="store_true", help="remove the other sequence after the item's prompt")
    args = ap.parse_args()
    model = Model(args.model, BackendOptions(threads=args.threads))
    cache = CacheOptions("f16", "f16", args.flash_attn)
    bench = IFEval(limit=args.prompts, max_tokens=GENERATED)
    prompts = bench.prompt_tokens(model)
    n_ctx = max(args.offsets) + max(map(len, prompts)) + GENERATED

    def output(prompt: list[int], offset: int) -> list[int]:
        """Greedy tokens, past end-of-generation tokens so every output has the same cells."""
        with Context(model, cache, n_ctx=2 * n_ctx, n_seq=2) as ctx:
            if offset:
                ctx.prefill([model.bos] * offset, seq=1)  # another sequence holds the first cells
            ctx.prefill(prompt)
            if offset and args.freed:
                ctx.forget(1)
            out = [int(np.argmax(ctx.logits(-1)))]
            for i in range(GENERATED - 1):
                ctx.decode([(out[-1], len(prompt) + i, 0, True)])
                out.append(int(np.argmax(ctx.logits(-1))))
            return out

    alone = [output(p, 0) for p in prompts]
    print(
        f"model {model.path.name}, {model.backend.n_threads} threads, flash attention {args.flash_attn}, "
        f"{len(prompts)} prompts{', other sequence freed after the prompt' if args.freed else ''}"
    )
    print(f"{'offset':>6}  {'outputs differing':>17}")
    for offset in args.offsets:
        differ = sum(output(p, offset) != a for p, a in zip(prompts, alone))
        print(f"{offset:>6}  {differ:>14}/{len(prompts)}")


if __name__ == "__main__":
    main()
