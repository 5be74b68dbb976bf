"""Any lm-evaluation-harness task as a kvinject bench: lm-eval's prompts, few-shot examples,
filters and metrics, each configuration and run evaluated by lm-eval through the ``kvinject``
model (kvinject/lmeval/), and each document's score kept for the control, repeats, paired tests,
stores, reports and plots. Needs the lm-eval extra (``pip install 'kvinject[lm-eval]'``)."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from .. import clock
from ..engine.model import Model
from ..exceptions import DataError
from .base import Benchmark, Golden, Plan, Progress, RunResult
from .options import Options, option
from .speed import Speed

# Rough prompt tokens of a document, for `sweep --dry-run`'s estimate only.
DOC_TOKENS = 300
# kvinject's own lm-eval tasks (kvinject_nextword), found beside lm-eval's.
TASKS = Path(__file__).resolve().parent / "lmeval_tasks"


@dataclass(frozen=True)
class LMEvalOptions(Options):
    task: tuple[str, ...] = option((), "lm-eval tasks or groups, e.g. gsm8k,arc_easy (`lm-eval ls tasks`).")
    data: str | None = option(None, "A local .jsonl/.json/.csv/.parquet file in place of one task's dataset.")
    shots_data: str | None = option(None, "With --data: the file of its few-shot examples (default: the same file).")
    include_path: str | None = option(None, "A folder of lm-eval task YAMLs (lm-eval's --include_path).")
    num_fewshot: int | None = option(None, "Few-shot examples (lm-eval's --num_fewshot; default: the task's).", minimum=0)
    chat: bool = option(False, "Through the model's chat template (lm-eval's --apply_chat_template).")
    gen_kwargs: str | None = option(None, "Generation settings of the tasks' generation requests, as lm-eval's --gen_kwargs: max_gen_toks=100.")
    max_length: int = option(2048, "Tokens of one sequence (rolling windows; longer contexts are cut from the start).", minimum=2)


class LMEval(Benchmark):
    name = "lmeval"
    summary = "Any lm-evaluation-harness task (--task), scored by lm-eval itself; score: each document's headline metric (higher is better)."
    Options = LMEvalOptions
    options: LMEvalOptions
    primary = "score"
    higher_is_better = {"score": True}
    # acc, exact_match, IFEval's prompt-level accuracies: Wilson's interval and exact McNemar,
    # as for kvinject's own pass/fail benches (a Wilcoxon test gave p = 0.11 where McNemar gives 0.18)
    binary_if_zero_one = frozenset({"score"})

    def load(self) -> None:
        if not self.options.task:
            raise DataError("lmeval: name the tasks with --task (lm-eval's names, e.g. gsm8k; `lm-eval ls tasks` lists them)")
        try:
            from ..lmeval.tasks import check_gen_kwargs, task_set
        except ImportError:
            raise DataError("the lmeval bench needs lm-evaluation-harness: pip install 'kvinject[lm-eval]'") from None
        o = self.options
        if o.gen_kwargs is not None:
            check_gen_kwargs(o.gen_kwargs)
        self.tasks = task_set(o.task, [TASKS, *filter(None, [o.include_path])], o.data, o.shots_data)
        self.docs = self.tasks.docs(o.limit)
        self.headlines = self.tasks.headlines()

    def __len__(self) -> int:
        return sum(self.docs.values())

    @property
    def settings(self) -> dict[str, object]:
        o = self.options
        return {
            "task": list(o.task),
            "data": o.data,
            "shots_data": o.shots_data,
            "include_path": o.include_path,
            "limit": o.limit,
            "num_fewshot": o.num_fewshot,
            "chat": o.chat,
            **({"gen_kwargs": o.gen_kwargs} if o.gen_kwargs is not None else {}),  # the store keys of runs without it stay
            "max_length": o.max_length,
            "docs": self.docs,
            "headlines": self.headlines,
        }

    def estimate_seconds(self, runs: int, speed: Speed) -> float:
        return runs * speed.generation(len(self), DOC_TOKENS * (1 + (self.options.num_fewshot or 0)), 32)

    def evaluate(self, model: Model, plan: Plan, seed: int, progress: Progress, golden: Golden | None = None) -> Iterator[RunResult]:
        from ..lmeval.model import KvinjectLM
        from ..lmeval.tasks import evaluate

        for config, runs in plan:
            for run in runs:
                start = clock.now()
                lm = KvinjectLM.on(model, config, seed, run, self.options.max_length)
                try:
                    scores = evaluate(lm, self.tasks, self.headlines, self.options.limit, self.options.num_fewshot, self.options.chat, self.options.gen_kwargs)
                    realized, bits = lm.realized, lm.context.cache_bits
                finally:
                    lm.close()
                if len(scores.items) != len(self):
                    raise DataError(f"lm-eval scored {len(scores.items)} documents of {len(self)}: a task without per-document scores?")
                progress(len(self))
                yield RunResult(
                    self.name,
                    config,
                    run,
                    {"score": float(np.mean(scores.items)), "bits": bits, **scores.metrics},
                    {"score": scores.items},
                    realized,
                    seconds=clock.now() - start,
                )
