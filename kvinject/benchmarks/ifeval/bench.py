"""IFEval-style instruction following, with the study's protocol: the model's chat template,
greedy decoding capped at --max-tokens (default 100), optional exclusion of instruction ids. A
model without a chat template (a base model such as the bundled Gemma 3 270M) reads the
instruction as plain text, as lm-evaluation-harness gives it without --apply_chat_template."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ...data import bench_data, load_hf
from ...engine.generation.batching import Generation
from ...engine.model import Model
from ...exceptions import DataError
from ..base import GenerationBenchmark
from ..options import Options, option
from ..speed import Speed
from .scoring import IFEvalItem, PromptVerdict, exclude, metrics, parse_items, read_items, score

DEFAULT_DATA = "ifeval_style.jsonl"


def load_items(data: str | None) -> list[IFEvalItem]:
    """The bundled prompt set, an IFEval ``input_data.jsonl`` file, or ``hf:google/IFEval``."""
    if data is not None and data.startswith("hf:"):
        items = parse_items((f"{data} row {i}", row) for i, row in enumerate(load_hf(data)))
    else:
        items = read_items(Path(data) if data is not None else bench_data(DEFAULT_DATA))
    if not items:
        raise DataError(f"{data} leaves no item to evaluate for ifeval")
    return items


@dataclass(frozen=True)
class IFEvalOptions(Options):
    data: str | None = option(None, "IFEval input_data.jsonl or hf:google/IFEval. Default: the bundled prompt set.")
    limit: int | None = option(None, "Prompts to evaluate (default: all).", minimum=1)
    max_tokens: int = option(100, "Tokens generated per prompt.", minimum=1)
    temperature: float = option(0.0, "Sampling temperature; 0 is greedy.", minimum=0)
    exclude_instructions: tuple[str, ...] = option((), "Drop prompts with these instruction ids, e.g. length_constraints:number_words.")
    ctx: int = option(2048, "Context cells per sequence (prompt and response).", minimum=8)


class IFEval(GenerationBenchmark):
    name = "ifeval"
    summary = "IFEval-style instruction following (strict and loose, prompt and instruction level)."
    Options = IFEvalOptions
    options: IFEvalOptions
    primary = "prompt_level_strict_acc"
    secondary = ("inst_level_strict_acc", "prompt_level_loose_acc", "diverged")
    higher_is_better = {
        "prompt_level_strict_acc": True,
        "inst_level_strict_acc": True,
        "prompt_level_loose_acc": True,
        "inst_level_loose_acc": True,
    }
    binary = frozenset({"prompt_level_strict_acc", "prompt_level_loose_acc"})
    # lm-eval pools instruction-level accuracy over all instructions, not per prompt
    weights = {"inst_level_strict_acc": "instructions", "inst_level_loose_acc": "instructions"}
    keep_texts = True

    def load(self) -> None:
        o = self.options
        items = load_items(o.data)
        self.items = (exclude(items, o.exclude_instructions) if o.exclude_instructions else items)[: o.limit]

    def __len__(self) -> int:
        return len(self.items)

    @property
    def temperature(self) -> float:
        return self.options.temperature

    @property
    def settings(self) -> dict[str, object]:
        return {
            "data": self.options.data or f"bundled:{DEFAULT_DATA}",
            "items": len(self),
            "max_tokens": self.options.max_tokens,
            "temperature": self.options.temperature,
            "exclude_instructions": list(self.options.exclude_instructions),
            "chat_template": "the model's, plain text without one",
        }

    def estimate_seconds(self, runs: int, speed: Speed) -> float:
        return runs * speed.generation(len(self), 60, self.options.max_tokens)

    def prompt_tokens(self, model: Model) -> list[list[int]]:
        """Each item's prompt in the model's chat template, or as it is for a model without one, as tokens."""
        chat = model.has_chat_template
        return [model.tokenize(model.chat_prompt(item.prompt) if chat else item.prompt, parse_special=chat) for item in self.items]

    def prompts(self, model: Model) -> list[list[int]]:
        return self.prompt_tokens(model)

    def limits(self, prompts: list[list[int]]) -> tuple[int, int]:
        return self.options.max_tokens, min(self.options.ctx, max(map(len, prompts)) + self.options.max_tokens + 1)

    def score(self, index: int, generation: Generation) -> PromptVerdict:
        return score(self.items[index], generation.text)

    def summarize(self, scores: list[PromptVerdict]) -> tuple[dict[str, float], dict[str, list[float]]]:
        items = {
            "prompt_level_strict_acc": [float(v.follow_all_strict) for v in scores],
            "prompt_level_loose_acc": [float(v.follow_all_loose) for v in scores],
            "inst_level_strict_acc": [float(np.mean(v.strict)) for v in scores],
            "inst_level_loose_acc": [float(np.mean(v.loose)) for v in scores],
            "instructions": [float(len(v.strict)) for v in scores],
        }
        return metrics(scores), items
