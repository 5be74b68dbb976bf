"""`kvinject lm-eval`: lm-evaluation-harness's own command line, with the ``kvinject`` model."""

from __future__ import annotations

import argparse
import functools
import logging
import re
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import typer
from rich.console import Console

from ..benchmarks.lmeval import TASKS
from ..exceptions import KvinjectError
from ..files import write_text
from ..jsonutil import dumps
from ..lmeval.refusals import after_requests, from_below, said
from ..lmeval.settings import LM_EVAL_OWN
from ..values import parse_float, parse_int, split_list, unique
from .outputs import check_writable

# lm-eval's subcommands; without one, lm-eval runs `run`.
SUBCOMMANDS = ("run", "ls", "validate")

PREFACE = """kvinject lm-eval ARGS: lm-evaluation-harness's command line, with --model kvinject (the default here).

  kvinject lm-eval --model_args model=smollm2 'error="normal:0,0.25"' --tasks gsm8k --limit 50

--model_args (key=value; quote a value that holds a comma): model (a bundled name, a GGUF file
or hf:OWNER/REPO/FILE.gguf), error (ERROR[@K[/V]], as kvinject run --error), target, layers,
positions, heads, cache_type_k, cache_type_v, flash_attn, kv_rotation, seed, run, threads,
parallel, n_gpu_layers, max_length. The error that reached the cache is printed at the end,
and with --output_path written beside lm-eval's results (kvinject.json).
kvinject's own tasks (kvinject_nextword) are found unless --include_path (or --config's)
names another folder.
lm-eval's own options follow.
"""


def lm_eval(ctx: typer.Context) -> None:
    """lm-evaluation-harness with --model kvinject: any lm-eval task under K/V error (its options unchanged; see --help)."""
    try:
        from lm_eval.__main__ import cli_evaluate
    except ImportError:
        raise KvinjectError("kvinject lm-eval needs lm-evaluation-harness: pip install 'kvinject[lm-eval]'") from None
    from ..lmeval.model import KvinjectLM  # registers --model kvinject

    args = list(ctx.args) or ["run", "--help"]
    command = args[0] if args[0] in SUBCOMMANDS else "run"
    given = _given(command, args[1:] if args[0] == command else args)
    if "-h" in args or "--help" in args:
        print(PREFACE)
    else:
        if command == "run" and given.model is None:
            args += ["--model", "kvinject"]  # here the default; lm-eval's own is hf
        if given.include_path is None:
            args += ["--include_path", str(TASKS)]  # kvinject's own tasks; lm-eval's CLI takes one folder
    _check_args(given)
    from ..lmeval.tasks import check_include_path, skipped

    if given.include_path is not None:
        check_include_path(given.include_path, "--include_path")
    output = getattr(given, "output_path", None)
    if output and command == "run":
        path = Path(output)
        if path.suffix == ".json":  # a file, kvinject's beside it
            check_writable({"--output_path": path, "kvinject's own": _own_output(path)})
        else:  # a folder of results (and --log_samples' logs), made if missing
            check_writable(folders={"--output_path": path})
    sys.argv = ["lm-eval", *args]
    with _refusals_in_one_line(KvinjectLM, lambda: skipped([given.include_path] if given.include_path else [])):
        cli_evaluate()
    for lm in KvinjectLM.instances:
        Console(stderr=True).print(f"kvinject: {lm.configuration.label}: {lm.realized_line()}", markup=False, highlight=False, soft_wrap=True)
    if output and KvinjectLM.instances:  # beside lm-eval's results: what reached the cache
        target = _own_output(Path(output))
        target.parent.mkdir(parents=True, exist_ok=True)
        write_text(
            target,
            dumps([{"configuration": lm.configuration.label, **lm.configuration.to_dict(), "realized": lm.realized.summary()} for lm in KvinjectLM.instances]),
        )


def _own_output(path: Path) -> Path:
    """Where kvinject's own results (what reached the cache) go, beside lm-eval's at ``path``."""
    return path.with_suffix(".kvinject.json") if path.suffix == ".json" else path / "kvinject.json"


@contextmanager
def _refusals_in_one_line(model: type, also: Callable[[], str]) -> Iterator[None]:
    """lm-eval's refusals of what the user gave, in one line: its argument parser's (a usage
    and exit 2), and what it raises reading the tasks, the limit and the model before a request
    reaches a kvinject ``model`` ("Tasks not found", a model name it lacks), followed by what
    ``also`` says (the task YAMLs it skipped); what it raises after that, saying where. An error
    raised in kvinject's own code is a bug, and keeps its traceback."""

    original = argparse.ArgumentParser.error
    argparse.ArgumentParser.error = _refuse
    try:
        yield
    except Exception as e:
        if not from_below(e):
            raise
        if any(lm.started for lm in model.instances):
            raise KvinjectError(f"lm-eval: {after_requests(e)}") from None
        raise KvinjectError(f"lm-eval: {said(e)}{also()}") from None
    finally:
        argparse.ArgumentParser.error = original


def _refuse(parser: argparse.ArgumentParser, message: str) -> None:
    """An lm-eval argument parser's error, in one line."""
    raise KvinjectError(f"lm-eval: {message} (kvinject lm-eval --help lists its options)")


def _given(command: str, args: list[str]) -> argparse.Namespace:
    """What ``args`` give each option of lm-eval's ``command``, read as its own parser reads
    them (short forms, `-Mhf`, `--flag=VALUE`, a prefix such as `--lim`) but left as the text
    typed: each option's last value, all values of those that take several. Options it does
    not know are left to lm-eval's parser to refuse."""
    from lm_eval._cli.harness import HarnessCLI  # lm-eval 0.4's parsers (the extra's pin)

    theirs = HarnessCLI()._subparsers.choices[command]
    raw = argparse.ArgumentParser(add_help=False, allow_abbrev=theirs.allow_abbrev)
    raw.error = functools.partial(_refuse, raw)  # type: ignore[method-assign]
    for action in theirs._actions:
        if not action.option_strings:
            raw.add_argument(action.dest, nargs=action.nargs)
        elif action.nargs == 0:
            raw.add_argument(*action.option_strings, dest=action.dest, action="store_true")
        elif type(action) is argparse._StoreAction:  # the last value given
            raw.add_argument(*action.option_strings, dest=action.dest, nargs=action.nargs, const=action.const)
        else:  # lm-eval's own actions gather every value given (--tasks, --model_args)
            raw.add_argument(*action.option_strings, dest=action.dest, nargs=action.nargs, action="extend" if action.nargs in ("+", "*") else "append")
    given, _ = raw.parse_known_args(args)
    if getattr(given, "config", None):
        flags = {a.dest for a in theirs._actions if a.nargs == 0}
        many = {a.dest for a in theirs._actions if a.option_strings and a.nargs != 0 and type(a) is not argparse._StoreAction}
        for key, value in _config(given.config).items():  # lm-eval's order: the command line over the file
            if key in vars(given) and getattr(given, key) in (None, False) and value is not None:
                setattr(given, key, value if key in flags else [_text(v) for v in _listed(value)] if key in many else _text(value))
    return given


def _config(path: str) -> dict:
    """lm-eval's --config YAML, read by lm-eval's own reader. Its values count as given: with
    kvinject's own --model and --include_path added to the command line, the file's model and
    task folder were replaced without a word."""
    from lm_eval.config.evaluate_config import EvaluatorConfig

    try:
        return EvaluatorConfig.load_yaml_config(path)
    except Exception as e:
        if not from_below(e):
            raise
        raise KvinjectError(f"lm-eval: --config {path}: {said(e)}") from None


def _listed(value: object) -> list:
    return value if isinstance(value, list) else [value]


def _text(value: object) -> str:
    """A --config value as the command line's text: a mapping (model_args: {error: "normal:0,0.25"})
    as key=value pieces, a value with a comma quoted as --model_args takes it."""
    if isinstance(value, dict):
        return ",".join(f'{k}="{v}"' if "," in str(v) else f"{k}={v}" for k, v in value.items())
    return str(value)


def _check_args(given: argparse.Namespace) -> None:
    """Each --model_args piece is key=value, each key once and not one of lm-eval's own. An
    error spec's comma ends a piece where lm-eval splits them, and lm-eval's own message
    ("expected `key=value`, got '0.25'") does not say why. --tasks, as every list, names each
    task once; --limit and --num_fewshot are read as kvinject reads numbers, --verbosity as
    the logging level lm-eval sets it to."""
    keys = []
    for token in getattr(given, "model_args", None) or []:
        pieces = re.findall(r"""(?:[^,"']|"[^"]*"|'[^']*')+""", token)
        keys += [piece.split("=", 1)[0].strip() for piece in pieces if "=" in piece]
        for before, piece in zip([None, *pieces], pieces):
            if "=" not in piece and before is not None and "=" in before:
                key, value = before.split("=", 1)
                raise KvinjectError(
                    f"--model_args: '{piece}' is no key=value: a comma separates model arguments, so a value that holds one is quoted: "
                    f"""'{key}="{value},{piece}"' (in single quotes for the shell)"""
                )
    unique("--model_args", keys)  # lm-eval would keep the last value of a key given twice
    own = next((k for k in keys if k in LM_EVAL_OWN), None)
    if own is not None:  # lm-eval passes its own as well: "got multiple values for keyword argument"
        raise KvinjectError(f"--model_args: {own} is lm-eval's own option: give it as --{own}")
    tasks = getattr(given, "tasks", None)
    if tasks:  # `run` gathers every --tasks, `validate` keeps the last
        unique("--tasks", [t for token in ([tasks] if isinstance(tasks, str) else tasks) for t in split_list("--tasks", token)])
    limit = getattr(given, "limit", None)
    if limit is not None and parse_float("--limit", limit) <= 0:
        raise KvinjectError(f"--limit must be above 0 (below 1: a fraction of each task's items), got {limit}")
    fewshot = getattr(given, "num_fewshot", None)
    if fewshot is not None and parse_int("--num_fewshot", fewshot) < 0:
        raise KvinjectError(f"--num_fewshot must be at least 0, got {fewshot}")
    verbosity = getattr(given, "verbosity", None)  # lm-eval sets it after the evaluation: a bad one lost the results
    if verbosity is not None and verbosity.upper() not in logging.getLevelNamesMapping():
        raise KvinjectError(f"--verbosity must be a logging level (DEBUG, INFO, WARNING, ERROR, CRITICAL), got {verbosity!r}")
