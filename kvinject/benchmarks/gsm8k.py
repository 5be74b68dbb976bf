"""GSM8K-style grade-school math with chain-of-thought, scored as lm-evaluation-harness's `gsm8k`.

Prompt: ``--shots`` worked examples (default 5, as lm-eval's `gsm8k`; its 8-shot variant is
`gsm8k_cot`, with other examples and another answer format), each "Question: Q\\nAnswer: A"
and separated by a blank line, then "Question: Q\\nAnswer:". Greedy, ``--max-tokens`` 256,
stopped at "Question:", "</s>" or "<|im_end|>" (lm-eval's stop sequences), the response cut
there. ``--chat`` asks through the model's chat template instead, zero-shot by default, with
an instruction to end with "#### N"; shots, if asked for, go in the same user turn.

Where the worked examples come from: lm-eval draws them from GSM8K's train split, at random
for each question (its sampler: ``random.Random(1234).sample`` in evaluation order).
``--shots-data`` does the same from the file or ``hf:`` dataset given (the train split,
``hf:openai/gsm8k:main@train``). Without it: for the generated problems (the default), they
are generated problems of another stream of the same seed, any that repeats an evaluated
question skipped; for a GSM8K file or ``hf:`` dataset, its first ``--shots`` problems, left out
of the evaluated items: a GSM8K test file gives 1319 - shots items, and other shot counts
evaluate other items.

Answers: a GSM8K ``answer`` holds the worked solution and ends in "#### N"; the target is N
(commas and "$" removed). Responses are scored twice, as lm-eval does: strict takes the first
"#### N" in the response, flexible the last number-like run (``group_select: -1``); both are
normalized as lm-eval's exact_match does (commas, "$", everything up to "#### " and one
trailing "." removed, case ignored) and compared with the target as strings, so "18.0" is not
"18". The headline is the flexible score: it asks whether the model reached the number,
whatever the format, so it reads alike with and without --chat, and an error that only
breaks the "#### N" habit shows as the gap to the strict score, reported beside it.
"""

from __future__ import annotations

import random
import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from itertools import islice
from pathlib import Path
from typing import Any, ClassVar

import numpy as np

from ..data import load_hf, read_jsonl
from ..engine.generation.batching import Generation
from ..engine.model import Model
from ..engine.positions import Spans
from ..exceptions import DataError
from .arithmetic import Problem, generate, problems
from .base import GenerationBenchmark
from .options import Options, option
from .spans import token_spans
from .speed import Speed

STOPS = ("Question:", "</s>", "<|im_end|>")
STOP_TAIL = 16  # tokens detokenized to look for a stop sequence: more than any of them takes
STRICT = re.compile(r"#### (-?[0-9.,]+)")
FLEXIBLE = re.compile(r"(-?[$0-9.,]{2,})|(-?[0-9]+)")
IGNORED = [re.compile(p) for p in (",", r"\$", r"(?s).*#### ", r"\.$")]  # lm-eval's, in its order
NUMBER = re.compile(r"-?[0-9]+(\.[0-9]+)?")
INVALID = "[invalid]"  # what an extraction without a match gives: equals no target
SHOT_STREAM = 1  # generated shots are drawn with seed (data_seed, SHOT_STREAM)
FEWSHOT_SEED = 1234  # lm-eval's fewshot_random_seed, for --shots-data
CHAT_INSTRUCTION = 'Solve the problem step by step. Then write the final answer, a number, on the last line after "#### ".'
CHARS_PER_TOKEN = 4  # for the --dry-run estimate, made before a tokenizer is at hand


@dataclass(frozen=True)
class Question:
    question: str
    solution: str  # the worked solution, ending in "#### N"
    target: str  # N, normalized as extracted answers are


def normalize(answer: str) -> str:
    for pattern in IGNORED:
        answer = pattern.sub("", answer)
    return answer.lower()


def extract_strict(response: str) -> str:
    match = STRICT.search(response)
    return match.group(1).strip() if match else INVALID


def extract_flexible(response: str) -> str:
    matches = FLEXIBLE.findall(response)
    return next(g for g in matches[-1] if g).strip() if matches else INVALID


def truncate(response: str) -> str:
    """The response up to its first stop sequence."""
    return response[: min((i for i in (response.find(s) for s in STOPS) if i >= 0), default=len(response))]


def parse_items(rows: Iterable[tuple[str, dict[str, Any]]]) -> list[Question]:
    """Items from (where, row) pairs in GSM8K's format, ``where`` naming the row in errors."""
    items = []
    for where, row in rows:
        for key in ("question", "answer"):
            if key not in row:
                raise DataError(f"{where}: missing key {key!r}")
            if not isinstance(row[key], str):
                raise DataError(f"{where}: {key!r} must be a string, got {type(row[key]).__name__}")
        _, marker, final = row["answer"].rpartition("####")
        target = normalize(final.strip())
        if not marker or not NUMBER.fullmatch(target):
            raise DataError(f"{where}: the answer does not end in '#### N' with N a number")
        items.append(Question(row["question"], row["answer"], target))
    return items


def load_items(data: str) -> list[Question]:
    """A GSM8K jsonl file (``question``, ``answer``) or an ``hf:`` dataset in its format."""
    if data.startswith("hf:"):
        return parse_items((f"{data} row {i}", row) for i, row in enumerate(load_hf(data)))
    return parse_items((f"{data}:{number}", row) for number, row in read_jsonl(Path(data)))


def generated(problem: Problem) -> Question:
    return Question(problem.question, problem.solution, str(problem.answer))


@dataclass(frozen=True)
class GSM8KOptions(Options):
    data: str | None = option(None, "GSM8K jsonl (question, answer) or hf:openai/gsm8k:main@test. Default: generated problems.")
    limit: int | None = option(None, "Problems to evaluate (default: all).", minimum=1)
    shots: int | None = option(None, "Worked examples before each question (default: 5, or 0 with --chat).", minimum=0)
    shots_data: str | None = option(
        None,
        "Draw each question's worked examples at random from this GSM8K jsonl or hf: dataset, as lm-eval does from "
        "hf:openai/gsm8k:main@train. Default: the first --shots problems of --data.",
    )
    chat: bool = option(False, "Ask through the model's chat template, with an instruction to end with '#### N'.")
    max_tokens: int = option(256, "Tokens generated per problem.", minimum=1)
    # All are generated before --limit picks the first: 100000000 grew memory until killed.
    problems: int = option(200, "Generated problems (without --data).", minimum=1, maximum=100_000, only=("data", (None,)))
    data_seed: int = option(0, "Seed of the generated problems (without --data).", minimum=0, only=("data", (None,)))


class GSM8K(GenerationBenchmark):
    name = "gsm8k"
    summary = "GSM8K-style math word problems, k-shot chain of thought (lm-eval's strict '#### N' and flexible last-number match)."
    Options = GSM8KOptions
    options: GSM8KOptions
    primary = "exact_match_flexible"
    secondary = ("exact_match_strict", "diverged")
    higher_is_better: ClassVar[dict[str, bool]] = {"exact_match_flexible": True, "exact_match_strict": True}
    binary = frozenset({"exact_match_flexible", "exact_match_strict"})
    keep_texts = True
    spans = (*GenerationBenchmark.spans, "context", "question")  # the worked examples, the question asked

    @property
    def n_shots(self) -> int:
        o = self.options
        return o.shots if o.shots is not None else 0 if o.chat else 5

    def load(self) -> None:
        o, k = self.options, self.n_shots
        shots: list[Question] = []
        if o.data is None:
            items = [generated(p) for p in generate(o.problems, o.data_seed)]
            asked = {i.question for i in items}
            fresh = (p for p in problems((o.data_seed, SHOT_STREAM)) if p.question not in asked)
            shots = [generated(p) for p in islice(fresh, k)] if o.shots_data is None else []
        else:
            items = load_items(o.data)
            if o.shots_data is None:
                if len(items) <= k:
                    after = f" after the {k} worked examples" if k else ""
                    raise DataError(f"{o.data} holds {len(items)} problems: none left to evaluate{after}")
                shots, items = items[:k], items[k:]
        self.items, self.shots = items[: o.limit], shots  # shots shared by every question, if so
        if o.shots_data is None:
            per_item = [shots] * len(self.items)
        else:
            pool = load_items(o.shots_data)
            if len(pool) < k:
                raise DataError(f"{o.shots_data} holds {len(pool)} problems, fewer than the {k} worked examples asked")
            # From the evaluated set itself, lm-eval draws one more and drops the question asked.
            rnd, same = random.Random(FEWSHOT_SEED), o.shots_data == o.data
            draws = [rnd.sample(pool, k + same) for _ in self.items]
            per_item = [[s for s in drawn if s.question != item.question][:k] for drawn, item in zip(draws, self.items)]
        self.shot_texts = ["".join(f"Question: {s.question}\nAnswer: {s.solution}\n\n" for s in chosen) for chosen in per_item]
        self.prompt_texts = [self.prompt_text(shot, item.question) for shot, item in zip(self.shot_texts, self.items)]

    def __len__(self) -> int:
        return len(self.items)

    def prompt_text(self, shot_text: str, question: str) -> str:
        """The prompt before tokenizing: the shots and the question, or the chat turn's text."""
        if self.options.chat:
            return f"{shot_text}Question: {question}\n\n{CHAT_INSTRUCTION}"
        return f"{shot_text}Question: {question}\nAnswer:"

    @property
    def settings(self) -> dict[str, object]:
        o = self.options
        data = {"data": o.data} if o.data is not None else {"data": "generated", "problems": o.problems, "data_seed": o.data_seed}
        shots = {"shots_data": o.shots_data} if o.shots_data is not None else {}
        return {**data, "items": len(self), "shots": self.n_shots, **shots, "chat": o.chat, "max_tokens": o.max_tokens}

    def estimate_seconds(self, runs: int, speed: Speed) -> float:
        prompt_tokens = np.mean([len(t) for t in self.prompt_texts]) / CHARS_PER_TOKEN if self.prompt_texts else 0.0
        return runs * speed.generation(len(self), prompt_tokens, self.options.max_tokens)

    def prompts(self, model: Model) -> list[list[int]]:
        chat = self.options.chat
        self._texts = [model.chat_prompt(t) if chat else t for t in self.prompt_texts]
        self._tokens = [model.tokenize(t, parse_special=chat) for t in self._texts]
        return self._tokens

    def item_spans(self, model: Model) -> list[Spans]:
        """The worked examples (context) and the rest of the prompt text (question), chat template left out."""
        out = []
        for text, task, tokens, shot_text in zip(self._texts, self.prompt_texts, self._tokens, self.shot_texts):
            start, shots = text.index(task), len(shot_text)
            out.append(token_spans(model, text, tokens, {"context": [(start, start + shots)], "question": [(start + shots, start + len(task))]}))
        return out

    def limits(self, prompts: list[list[int]]) -> tuple[int, int]:
        return self.options.max_tokens, max(map(len, prompts)) + self.options.max_tokens + 1

    def stop(self, model: Model) -> Callable[[list[int]], bool]:
        return lambda out: any(s in model.detokenize(out[-STOP_TAIL:]) for s in STOPS)

    def score(self, index: int, generation: Generation) -> tuple[float, float]:
        response, target = truncate(generation.text), self.items[index].target
        return float(normalize(extract_strict(response)) == target), float(normalize(extract_flexible(response)) == target)

    def summarize(self, scores: list[tuple[float, float]]) -> tuple[dict[str, float], dict[str, list[float]]]:
        strict, flexible = [s for s, _ in scores], [f for _, f in scores]
        return {"exact_match_flexible": float(np.mean(flexible)), "exact_match_strict": float(np.mean(strict))}, {
            "exact_match_flexible": flexible,
            "exact_match_strict": strict,
        }
