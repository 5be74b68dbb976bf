"""Reading IFEval files and scoring responses, strictly and loosely, as IFEval does.

Input formats are those of google-research `instruction_following_eval`:
`input_data.jsonl` (key, prompt, instruction_id_list, kwargs) and the response file
(prompt, response). Metric names are those of lm-evaluation-harness.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ...data import read_jsonl
from ...exceptions import DataError
from .instructions import INSTRUCTIONS, build_instruction


@dataclass
class IFEvalItem:
    key: int
    prompt: str
    instruction_id_list: list[str]
    kwargs: list[dict[str, Any]]


@dataclass
class PromptVerdict:
    key: int
    prompt: str
    response: str
    instruction_id_list: list[str]
    strict: list[bool]
    loose: list[bool]

    @property
    def follow_all_strict(self) -> bool:
        return all(self.strict)

    @property
    def follow_all_loose(self) -> bool:
        return all(self.loose)

    def to_dict(self) -> dict[str, Any]:
        return {
            "key": self.key,
            "prompt": self.prompt,
            "response": self.response,
            "instruction_id_list": list(self.instruction_id_list),
            "strict": list(self.strict),
            "loose": list(self.loose),
            "follow_all_strict": self.follow_all_strict,
            "follow_all_loose": self.follow_all_loose,
        }


def _require(obj: dict[str, Any], name: str, kind: type, where: str) -> Any:
    if name not in obj:
        raise DataError(f"{where}: missing key {name!r}")
    value = obj[name]
    if not isinstance(value, kind) or isinstance(value, bool):
        raise DataError(f"{where}: {name!r} must be {kind.__name__}, got {type(value).__name__}")
    return value


def read_items(path: str | Path) -> list[IFEvalItem]:
    """Read and validate an IFEval `input_data.jsonl`; every instruction must build."""
    return parse_items((f"{path}:{number}", obj) for number, obj in read_jsonl(Path(path)))


def parse_items(rows: Iterable[tuple[str, dict[str, Any]]]) -> list[IFEvalItem]:
    """Validate (where, row) pairs in IFEval's format, ``where`` naming the row in errors."""
    items: list[IFEvalItem] = []
    first_line_of_key: dict[int, str] = {}
    for where, obj in rows:
        key = _require(obj, "key", int, where)
        prompt = _require(obj, "prompt", str, where)
        ids = _require(obj, "instruction_id_list", list, where)
        kwargs = _require(obj, "kwargs", list, where)
        if not ids:
            raise DataError(f"{where}: instruction_id_list is empty")
        if len(ids) != len(kwargs):
            raise DataError(f"{where}: instruction_id_list has {len(ids)} entries but kwargs has {len(kwargs)}")
        if key in first_line_of_key:
            raise DataError(f"{where}: duplicate key {key} (first at {first_line_of_key[key]})")
        first_line_of_key[key] = where
        for instruction_id, instruction_kwargs in zip(ids, kwargs):
            if not isinstance(instruction_id, str):
                raise DataError(f"{where}: instruction ids must be strings, got {instruction_id!r}")
            try:
                build_instruction(instruction_id, instruction_kwargs)
            except DataError as exc:
                raise DataError(f"{where}: {exc}") from None
        items.append(IFEvalItem(key, prompt, ids, kwargs))
    return items


def read_responses(path: str | Path) -> list[tuple[int, str, str]]:
    """Read an IFEval response file into (line number, prompt, response), in file order; a
    prompt may come more than once (responses of several runs, seeds or models)."""
    path = Path(path)
    out = []
    for number, obj in read_jsonl(path):
        where = f"{path}:{number}"
        out.append((number, _require(obj, "prompt", str, where), _require(obj, "response", str, where)))
    return out


def score_responses(items: Iterable[IFEvalItem], responses: list[tuple[int, str, str]], source: str) -> list[PromptVerdict]:
    """One verdict per response, in order, each checked against its prompt's item; a response
    to a prompt that ``items`` lacks is an error naming its line of ``source``."""
    by_prompt: dict[str, IFEvalItem] = {}
    for item in items:
        seen = by_prompt.setdefault(item.prompt, item)
        if (seen.instruction_id_list, seen.kwargs) != (item.instruction_id_list, item.kwargs):
            raise DataError(
                f"the data holds the prompt {item.prompt[:60]!r} twice with other instructions (keys {seen.key} and {item.key}): "
                "a response names its prompt only, so it could be scored by either"
            )
    verdicts = []
    for number, prompt, response in responses:
        if prompt not in by_prompt:
            raise DataError(f"{source}:{number}: the prompt is not one of the data's ({prompt[:60]!r})")
        verdicts.append(score(by_prompt[prompt], response))
    return verdicts


def loose_variants(response: str) -> list[str]:
    """IFEval's eight loose readings of a response, in its order.

    The response as is and with all `*` removed, then the response without its
    first line, last line, or both (stripped), and those three with `*` removed.
    """
    lines = response.split("\n")
    without_first = "\n".join(lines[1:]).strip()
    without_last = "\n".join(lines[:-1]).strip()
    without_both = "\n".join(lines[1:-1]).strip()
    trimmed = [without_first, without_last, without_both]
    return [response, response.replace("*", ""), *trimmed, *(t.replace("*", "") for t in trimmed)]


def score(item: IFEvalItem, response: str) -> PromptVerdict:
    """Check every instruction of `item` against `response`, strictly and loosely."""
    variants = [v for v in loose_variants(response) if v.strip()]
    strict: list[bool] = []
    loose: list[bool] = []
    for instruction_id, kwargs in zip(item.instruction_id_list, item.kwargs):
        instruction = build_instruction(instruction_id, kwargs)
        # An empty response follows nothing, whatever a checker would say about it.
        strict.append(bool(response.strip()) and instruction.check(response))
        loose.append(any(instruction.check(v) for v in variants))
    return PromptVerdict(item.key, item.prompt, response, list(item.instruction_id_list), strict, loose)


def metrics(verdicts: Iterable[PromptVerdict]) -> dict[str, float]:
    """Prompt- and instruction-level accuracies, named as in lm-evaluation-harness."""
    verdicts = list(verdicts)
    if not verdicts:
        raise ValueError("metrics: no verdicts to aggregate")
    strict = [ok for v in verdicts for ok in v.strict]
    loose = [ok for v in verdicts for ok in v.loose]
    if not strict:
        raise ValueError("metrics: the verdicts hold no instructions")
    return {
        "prompt_level_strict_acc": sum(v.follow_all_strict for v in verdicts) / len(verdicts),
        "inst_level_strict_acc": sum(strict) / len(strict),
        "prompt_level_loose_acc": sum(v.follow_all_loose for v in verdicts) / len(verdicts),
        "inst_level_loose_acc": sum(loose) / len(loose),
    }


def exclude(items: Iterable[IFEvalItem], instruction_ids: Iterable[str]) -> list[IFEvalItem]:
    """Drop every item that carries any of `instruction_ids`."""
    dropped = set(instruction_ids)
    unknown = sorted(dropped - INSTRUCTIONS.keys())
    if unknown:
        raise DataError(f"cannot exclude unknown instruction id(s): {', '.join(unknown)}")
    return [item for item in items if not dropped.intersection(item.instruction_id_list)]
