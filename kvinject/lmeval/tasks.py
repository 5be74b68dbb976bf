"""lm-eval tasks as kvinject's lmeval bench runs them: by name from lm-eval's index (and an
``--include-path`` of YAMLs), optionally over a local copy of their data, evaluated by lm-eval
itself under one configuration, with each document's scores kept for kvinject's paired
statistics. One definition of each task: lm-eval's."""

from __future__ import annotations

import contextlib
import io
import logging
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path
from typing import Any

from lm_eval.evaluator import simple_evaluate
from lm_eval.tasks import TaskManager
from lm_eval.tasks._yaml_loader import load_yaml  # lm-eval's own reader of task YAMLs (includes, !function)

from ..exceptions import DataError
from .model import GEN_KWARGS, KvinjectLM
from .refusals import after_requests, from_below, refused, said

# lm-eval's dataset builders by the suffix of a local file.
BUILDERS = {".jsonl": "json", ".json": "json", ".csv": "csv", ".parquet": "parquet"}


@dataclass
class TaskSet:
    """What `simple_evaluate` takes: task names or, over local data, whole task configs."""

    names: tuple[str, ...]
    specs: list[str | dict[str, Any]]
    manager: TaskManager

    @cached_property
    def loaded(self) -> dict[str, Any]:
        """lm-eval's task objects by name, their datasets read once, each task's first document
        made into its prompt and target: what lm-eval refuses in a task (its YAML, its dataset,
        its templates) is said in one line before any work."""
        with refused(f"load {', '.join(self.names)}"):
            tasks = self.manager.load(self.specs)["tasks"]
            for task in (t for t in tasks.values() if len(t.eval_docs)):
                doc = task.eval_docs[0]  # a row (a slice of a Dataset is its columns)
                task.doc_to_text(doc)
                task.doc_to_target(doc)
        return tasks

    def docs(self, limit: int | None) -> dict[str, int]:
        """Documents evaluated per task (lm-eval's ``limit`` counts per task)."""
        return {name: len(task.eval_docs) if limit is None else min(limit, len(task.eval_docs)) for name, task in self.loaded.items()}

    def headlines(self) -> dict[str, str]:
        """Per task, the ``metric,filter`` whose per-document values kvinject pairs: the first
        higher-is-better metric of the task's list, under its first filter. Refused in one line:
        a task whose per-document values are no score (rolling log-likelihoods: perplexities),
        and tasks of different headline metrics, which one mean would pool."""
        out = {}
        for name, task in self.loaded.items():
            better = task.higher_is_better()
            metric = next((m for m in task._metric_fn_list if better.get(m)), None)
            if metric is None or task.config.output_type == "loglikelihood_rolling":
                raise DataError(
                    f"lmeval: {name} scores no document on its own ({', '.join(task._metric_fn_list)}): "
                    "run it with `kvinject lm-eval`, or perplexity with --bench perplexity"
                )
            filters = [f["name"] for f in task.config.filter_list or []]
            out[name] = f"{metric},{filters[0] if filters else 'none'}"
        if len({h.partition(",")[0] for h in out.values()}) > 1:
            raise DataError(f"lmeval: these tasks score by different metrics ({', '.join(f'{t} {h}' for t, h in out.items())}): give one per bench")
        return out


def check_include_path(folder: str | Path, flag: str) -> None:
    """A folder of task YAMLs that exists: lm-eval skips one that does not without a word."""
    path = Path(folder)
    if not path.is_dir() and not (path.is_file() and path.suffix in (".yaml", ".yml")):
        raise DataError(f"{flag} {folder}: no such folder (a folder of lm-eval task YAMLs)")
    found = list(_yamls(path))
    if not found:
        raise DataError(f"{flag} {folder}: the folder holds no task YAMLs")
    for yaml_path, config in found:
        if isinstance(config, dict) and "task" in config and not isinstance(config["task"], (str, list)):  # lm-eval's index sorts the names: a TypeError
            raise DataError(f"{flag} {folder}: {yaml_path}: task must be the task's name, got {config['task']!r}")


def _yamls(path: Path) -> Iterator[tuple[Path, Any]]:
    """Each YAML of the folder ``path`` (or the file) and what it holds, as lm-eval reads it
    (its tags unresolved); an exception where lm-eval reads none."""
    for yaml_path in [path] if path.is_file() else sorted([*path.rglob("*.yaml"), *path.rglob("*.yml")]):
        try:
            yield yaml_path, load_yaml(yaml_path, resolve_func=False, recursive=False)
        except Exception as e:  # yaml's own errors, a file that is no text: lm-eval skips the file
            yield yaml_path, e


def skipped(include_path: list[str | Path]) -> str:
    """The YAMLs of the folders that lm-eval skips without a word: no task of theirs is found."""
    unread = [f"{p} ({said(c) if isinstance(c, Exception) else 'no mapping'})" for f in include_path for p, c in _yamls(Path(f)) if not isinstance(c, dict)]
    return f"; lm-eval skipped {', '.join(unread)}" if unread else ""


def _manager(names: tuple[str, ...], include_path: list[str | Path] | None) -> TaskManager:
    """lm-eval's index of the tasks. Its own 14,000 YAMLs take 10 s to index (2-core Xeon,
    2026-11-28), in every command; plain tasks that the include folders hold (kvinject_nextword)
    are found in those alone. A group there may name lm-eval's tasks, so it gets the whole index."""
    if include_path:
        own = TaskManager(include_path=include_path, include_defaults=False)
        if all(n in own.all_subtasks for n in names):
            return own
    return TaskManager(include_path=include_path)


def task_set(names: tuple[str, ...], include_path: list[str | Path] | None = None, data: str | None = None, shots_data: str | None = None) -> TaskSet:
    """The tasks ``names`` (lm-eval's and those of the ``include_path`` folders); with ``data``,
    one task over that file instead of its dataset, its few-shot examples from ``shots_data``
    (default: the same file, as the task's few-shot split:
    lm-eval leaves a document out of its own examples only where that split is the evaluated one
    by name, so over one file gsm8k, whose are train and test, can show a question its own)."""
    logging.getLogger("lm_eval").setLevel(logging.ERROR)  # its INFO lines would interleave with the progress bars
    for folder in include_path or []:
        check_include_path(folder, "--include-path")
    with refused("index the tasks of --include-path"):
        manager = _manager(names, include_path)
    unknown = [n for n in names if n not in manager.all_tasks]
    if unknown:
        known = "`lm-eval ls tasks` lists them; --include-path adds a folder of task YAMLs"
        raise DataError(f"lm-eval has no task '{unknown[0]}' ({known}){skipped(include_path or [])}")
    if data is None:
        if shots_data is not None:
            raise DataError("--shots-data goes with --data: the examples of a task read from a local file")
        return TaskSet(names, list(names), manager)
    if len(names) != 1 or names[0] not in manager.all_subtasks:
        raise DataError("--data replaces the dataset of one task: give one task, not several or a group")
    with refused(f"read {names[0]}"):
        config = load_yaml(manager.task_index[names[0]].yaml_path, resolve_func=True, recursive=True)
    files = {}
    for path in filter(None, (data, shots_data)):
        if not Path(path).is_file():
            raise DataError(f"--data {path}: no such file")
        if Path(path).suffix not in BUILDERS:
            raise DataError(f"--data {path}: give a {', '.join(BUILDERS)} file")
        if Path(path).stat().st_size == 0:  # the datasets library's StopIteration said nothing
            raise DataError(f"--data {path}: the file is empty")
    evaluated = config.get("test_split") or config.get("validation_split") or "test"
    files[evaluated] = data
    examples = config.get("fewshot_split") or config.get("training_split")
    if examples:
        files[examples] = shots_data or data
    config.update(dataset_path=BUILDERS[Path(data).suffix], dataset_name=None, dataset_kwargs={"data_files": files})
    config.pop("custom_dataset", None)  # a task that makes its documents in code read them there, not from the file
    if examples is None and shots_data is not None:
        raise DataError(f"--shots-data: {names[0]} takes no few-shot examples from a split")
    return TaskSet(names, [config], manager)


@dataclass
class Scores:
    """One evaluation: lm-eval's aggregated metrics per task, and the headline metric of each
    document (task by task, in document order) for the paired statistics."""

    metrics: dict[str, float]
    headline: dict[str, str]  # task -> its metric,filter the items hold
    items: list[float]


def check_gen_kwargs(text: str) -> None:
    """``--gen-kwargs`` as lm-eval reads it, refused in one line before any model loads where it
    does not parse or names a setting kvinject's model does not honor."""
    from lm_eval.utils import simple_parse_args_string

    try:
        given = simple_parse_args_string(text)
    except ValueError:
        raise DataError(f"lmeval: --gen-kwargs takes KEY=VALUE pairs separated by commas, as lm-eval's --gen_kwargs (max_gen_toks=100), got '{text}'") from None
    unknown = sorted(set(given) - GEN_KWARGS)
    if not given or unknown:
        raise DataError(f"lmeval: --gen-kwargs sets {', '.join(sorted(GEN_KWARGS))}, got '{text}'")


def evaluate(
    lm: KvinjectLM, tasks: TaskSet, headlines: dict[str, str], limit: int | None, num_fewshot: int | None, chat: bool, gen_kwargs: str | None = None
) -> Scores:
    """lm-eval's evaluation of ``tasks`` with ``lm``: its prompts, few-shot examples, filters
    and metrics; each document's value of its task's headline metric (:meth:`TaskSet.headlines`)."""
    shown = io.StringIO()
    try:
        with contextlib.redirect_stderr(shown):  # lm-eval's progress bars, under kvinject's own
            out = simple_evaluate(
                model=lm,
                tasks=tasks.specs,
                task_manager=tasks.manager,
                limit=limit,
                num_fewshot=num_fewshot,
                log_samples=True,
                bootstrap_iters=0,  # kvinject's own intervals and tests come from the per-item values
                apply_chat_template=chat,
                gen_kwargs=gen_kwargs,
            )
    except Exception as e:
        if not from_below(e):  # kvinject's own: a bug, with what lm-eval said before it
            sys.stderr.write(shown.getvalue()[-4000:])
            raise
        why = after_requests(e) if lm.started else said(e)
        raise DataError(f"lmeval: lm-eval cannot evaluate {', '.join(tasks.names)}: {why}") from None
    metrics, items = {}, []
    for task, values in out["results"].items():
        for key in (k for k in values if "," in k and "_stderr," not in k):
            metrics[f"{task}/{key}"] = float(values[key])
    for task, headline in headlines.items():
        metric, _, filter_name = headline.partition(",")
        samples = sorted((s for s in out["samples"].get(task, []) if s.get("filter") == filter_name), key=lambda s: s["doc_id"])
        items += [float(s[metric]) for s in samples]
    return Scores(metrics, headlines, items)
