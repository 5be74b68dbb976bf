"""IFEval-style instruction following, with the study's protocol: the model's chat template,
greedy decoding capped at --max-tokens (default 100), optional exclusion of instruction ids."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Iterator

import numpy as np

from ...batching import generate_all
from ...data import bench_data, load_hf
from ...model import Model
from ..base import Benchmark, Plan, Progress, RunResult, at_least_one, divergence, generation_context
from .scoring import IFEvalItem, exclude, metrics, parse_items, read_items, score

DEFAULT_DATA = "ifeval_style.jsonl"


def load_items(data: str | None) -> list[IFEvalItem]:
    """The bundled prompt set, an IFEval ``input_data.jsonl`` file, or ``hf:google/IFEval``."""
    if data is not None and data.startswith("hf:"):
        return parse_items((f"{data} row {i}", row) for i, row in enumerate(load_hf(data)))
    return read_items(Path(data) if data is not None else bench_data(DEFAULT_DATA))


class IFEval(Benchmark):
    name = "ifeval"
    summary = "IFEval-style instruction following (strict and loose, prompt and instruction level)."
    primary = "prompt_level_strict_acc"
    secondary = ("inst_level_strict_acc", "prompt_level_loose_acc", "diverged")
    higher_is_better = {
        "prompt_level_strict_acc": True,
        "inst_level_strict_acc": True,
        "prompt_level_loose_acc": True,
        "inst_level_loose_acc": True,
        "diverged": False,
    }
    binary = frozenset({"prompt_level_strict_acc", "prompt_level_loose_acc"})

    def __init__(
        self,
        data: str | None = None,
        limit: int | None = None,
        max_tokens: int = 100,
        temperature: float = 0.0,
        exclude_ids: tuple[str, ...] = (),
        n_ctx: int = 2048,
    ):
        self.data = data
        items = exclude(load_items(data), exclude_ids) if exclude_ids else load_items(data)
        self.items = items[: at_least_one("limit", limit)]
        self.max_tokens = max_tokens
        self.temperature = temperature
        self.exclude_ids = tuple(exclude_ids)
        self.n_ctx = n_ctx

    def __len__(self) -> int:
        return len(self.items)

    @property
    def settings(self) -> dict[str, object]:
        return {
            "data": self.data or f"bundled:{DEFAULT_DATA}",
            "items": len(self),
            "max_tokens": self.max_tokens,
            "temperature": self.temperature,
            "exclude_instructions": list(self.exclude_ids),
            "chat_template": True,
        }

    def prompt_tokens(self, model: Model) -> list[list[int]]:
        """Each item's prompt in the model's chat template, as tokens."""
        return [model.tokenize(model.chat_prompt(item.prompt), parse_special=True) for item in self.items]

    def evaluate(self, model: Model, plan: Plan, seed: int, progress: Progress) -> Iterator[RunResult]:
        prompts = self.prompt_tokens(model)
        control: list[list[int]] | None = None
        for config, runs in plan:
            for run in runs:
                result = self._run(model, config, run, seed, prompts, control, progress)
                if control is None:
                    control = result.outputs
                yield result

    def _run(self, model, config, run, seed, prompts, control, progress) -> RunResult:
        start = time.perf_counter()
        n = len(prompts)
        verdicts, outputs, texts = [None] * n, [[] for _ in range(n)], [""] * n
        nonfinite = tokens = 0
        per_seq = min(self.n_ctx, max(map(len, prompts)) + self.max_tokens + 1)
        with generation_context(model, config, seed, run, per_seq) as ctx:
            for i, gen in generate_all(ctx, prompts, self.max_tokens, self.temperature, items=range(n)):
                verdicts[i] = score(self.items[i], gen.text)
                outputs[i], texts[i] = gen.tokens, gen.text
                nonfinite += gen.nonfinite_steps > 0
                tokens += len(prompts[i]) + len(gen.tokens)
                progress(1)
            realized = ctx.realized
        items = {
            "prompt_level_strict_acc": [float(v.follow_all_strict) for v in verdicts],
            "prompt_level_loose_acc": [float(v.follow_all_loose) for v in verdicts],
            "inst_level_strict_acc": [float(np.mean(v.strict)) for v in verdicts],
            "inst_level_loose_acc": [float(np.mean(v.loose)) for v in verdicts],
        }
        return RunResult(
            self.name,
            config,
            run,
            metrics(verdicts),
            items,
            realized,
            nonfinite,
            time.perf_counter() - start,
            tokens,
            divergence(control, outputs) if control is not None else {},
            outputs,
            texts,
        )
