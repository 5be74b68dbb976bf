"""Rough speeds behind `kvinject sweep --dry-run`'s time estimate: 2 CPU cores and the default
model (docs/performance.md). Benchmarks express their estimate in these terms."""

from __future__ import annotations

import math
from dataclasses import dataclass

from ..engine.model import CPU_PARALLEL

# Prompt and perplexity tokens/s, and generated tokens/s of one sequence. With 8 sequences per
# decode llama.cpp generates 1.6 times as many tokens/s as with one, and no more beyond 8 on 2
# cores; in between, a power law through those two points.
PREFILL_TOK_S, DECODE_TOK_S = 180.0, 90.0
PARALLEL_GAIN, PARALLEL_CAP = 1.6, 8
# Those hold for prompts up to SHORT tokens; beyond, attention over the tokens before each one
# adds its share: an 8K-token prefill runs at 90 tokens/s against 235 at 512, about 1.8 µs
# more a token for every cached token before it, and a 1-sequence decode at 8K takes 96 ms
# against 11, about 10 µs a cached token (2-core AMD EPYC, SmolLM2-135M, 2026-11-23, c6ed653).
SHORT, PREFILL_ATTN_S, DECODE_ATTN_S = 512, 1.8e-6, 1.0e-5


@dataclass(frozen=True)
class Speed:
    parallel: int = CPU_PARALLEL  # sequences generated together
    prompts: bool = True  # False: a generation's prompt is restored from another configuration's (kvinject/engine/cache/prefills.py)

    @property
    def decode_tok_s(self) -> float:
        """Generated tokens/s over all sequences when ``parallel`` generate at once."""
        return DECODE_TOK_S * PARALLEL_GAIN ** (math.log(min(self.parallel, PARALLEL_CAP)) / math.log(PARALLEL_CAP))

    def prefill(self, tokens: float, length: float = SHORT) -> float:
        """Seconds to evaluate ``tokens`` prompt or perplexity tokens in prompts of ``length``."""
        return tokens / PREFILL_TOK_S + PREFILL_ATTN_S * tokens * max(0.0, length - SHORT) / 2

    def generation(self, items: int, prompt_tokens: float, new_tokens: float) -> float:
        """Seconds for ``items`` generations of ``new_tokens`` after ``prompt_tokens`` each."""
        long = max(0.0, prompt_tokens - SHORT)
        prefill = self.prefill(prompt_tokens, prompt_tokens) if self.prompts else 0.0
        return items * (prefill + new_tokens * (1 / self.decode_tok_s + DECODE_ATTN_S * long))
