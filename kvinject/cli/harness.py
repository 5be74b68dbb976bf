"""`kvinject lm-eval`: lm-evaluation-harness's own command line, with the ``kvinject`` model."""

from __future__ import annotations

import re
import sys
from pathlib import Path

import typer
from rich.console import Console

from ..benchmarks.lmeval import TASKS
from ..exceptions import KvinjectError
from ..files import write_text
from ..jsonutil import dumps
from ..values import split_list, unique
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
kvinject's own tasks (kvinject_nextword) are found unless --include_path names another folder.
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
    if "-h" in args or "--help" in args:
        print(PREFACE)
    else:
        if command == "run" and not any(a == "--model" or a.startswith("--model=") for a in args):
            args += ["--model", "kvinject"]  # here the default; lm-eval's own is hf
        if not any(a.startswith("--include_path") for a in args):
            args += ["--include_path", str(TASKS)]  # kvinject's own tasks; lm-eval's CLI takes one folder
    _check_model_args(args)
    include = _value(args, "--include_path")
    if include is not None:
        from ..lmeval.tasks import check_include_path

        check_include_path(include, "--include_path")
    output = _value(args, "--output_path", "-o")
    if output and command == "run":
        path = Path(output)
        if path.suffix == ".json":  # a file, kvinject's beside it
            check_writable({"--output_path": path, "kvinject's own": _own_output(path)})
        else:  # a folder of results (and --log_samples' logs), made if missing
            check_writable(folders={"--output_path": path})
    sys.argv = ["lm-eval", *args]
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


def _check_model_args(args: list[str]) -> None:
    """Each --model_args piece is key=value, each key once. An error spec's comma ends a piece
    where lm-eval splits them, and lm-eval's own message ("expected `key=value`, got '0.25'")
    does not say why. --tasks, as every list, names each task once."""
    given = [a.split("=", 1)[1] for a in args if a.startswith("--model_args=")]
    if "--model_args" in args:
        after = args[args.index("--model_args") + 1 :]
        given += after[: next((i for i, a in enumerate(after) if a.startswith("-")), len(after))]
    keys = []
    for token in given:
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
    tasks = _value(args, "--tasks")
    if tasks:
        unique("--tasks", split_list("--tasks", tasks))


def _value(args: list[str], *flags: str) -> str | None:
    """The value of one of ``flags`` (a flag and its short form) in lm-eval's arguments
    (``--flag VALUE`` or ``--flag=VALUE``)."""
    for i, a in enumerate(args):
        if a in flags and i + 1 < len(args):
            return args[i + 1]
        if a.startswith(tuple(f + "=" for f in flags)):
            return a.split("=", 1)[1]
    return None
