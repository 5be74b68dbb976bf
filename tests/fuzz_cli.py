"""Command lines generated from the `kvinject` command tree itself: each command's smallest
valid invocation on the tiny model (BASES, and BENCHES for each registered bench), changed one
option at a time to each value of the option's strategy, chosen by what the option means
(MEANINGS, by flag) or else by its type: a new flag, bench option or error model is fuzzed the
day it is added, or :func:`missing` names what it lacks.

Paths are relative to a workspace (:func:`workspace`) that each command gets a fresh copy of."""

from __future__ import annotations

import functools
import json
import random
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from kvinject.benchmarks import BENCHMARKS, option_owners
from kvinject.error_models import REGISTRY
from tests.cli_tree import annotation, commands, flag, is_option

# Identical [[bench]] tables (twice2) and one model by two paths (twice) would repeat cells.
GRID = "[sweep]\nruns = 1\nmodels = ['tiny.gguf']\n[[bench.nexttoken]]\nlimit = 1\n"
MODEL = "tiny.gguf"  # a link to the tiny model in each workspace
STORE = "store.results.sqlite"  # a store of one nexttoken run with faults:1, read by report and replay
KEPT = "kept.txt"  # a file that no command may truncate
NUMBERS = ["1e10", "1e-400", "inf", "nan", "0x10", "-0", "1_000", "0.5", "-1", "0", "1", "99999999999999999999", "", "١"]
NUMBER_LISTS = ["1024,1024", "1024,,2048", ",", "1024", "0", "-1", "1e10", "50,50.0", "nan"]
PATHS_READ = ["missing.txt", ".", "/proc/version", "/dev/null", "empty.txt", KEPT, "missing/sub/x"]
# Outputs: a folder, a system file, a device, a missing parent, an existing file, an input.
PATHS_WRITTEN = ["out.x", ".", "/proc/version", "/dev/full", "missing/sub/x.out", KEPT, STORE, "grid.toml", "-"]
RUN = ["--runs", "2", "--model", MODEL]  # 2: a control with randomness (--control, --temperature) then has runs of its own
LENGTHS = ["--lengths", "1024", "--depths", "50", "--samples", "1", "--max-tokens", "2"]
BENCHES = {  # the smallest run of each registered bench
    "nexttoken": ["--limit", "1"],
    "perplexity": ["--limit", "1", "--ctx", "64"],
    "passkey": LENGTHS,
    "niah": LENGTHS,
    "vt": LENGTHS,
    "ifeval": ["--limit", "1", "--max-tokens", "2"],
    "gsm8k": ["--limit", "1", "--max-tokens", "2", "--shots", "0"],
    "lmeval": ["--task", "kvinject_nextword", "--limit", "1"],
}
SPEC = ["--error", "normal:0,0.5"]
BASES: dict[str, list[list[str]]] = {
    "errors": [[]],
    "benchmarks": [[]],
    "version": [[]],
    "info": [["--model", MODEL, "--ctx", "64"]],
    "generate": [["Hi", "--max-tokens", "2", "--ctx", "64", "--model", MODEL]],
    "run": [["--bench", name, *extra, *RUN] for name, extra in BENCHES.items()],
    "tune": [["--bits", "4", "--ctx", "64", "--chunks", "2", "--candidates", "1", "--model", MODEL, "--dry-run"]],
    "profile": [[*SPEC, "--bench", "nexttoken", "--limit", "1", "--model", MODEL]],
    "divergence": [[*SPEC, "--prompt", "Hi", "--max-tokens", "2", "--model", MODEL]],
    "sweep": [["grid.toml", "--store", "out.results.sqlite"], ["grid.toml", "--slurm", "--dry-run"]],
    "report": [[STORE]],
    "replay": [[STORE, "--item", "0"]],
    "score": [["ifeval", "--data", "ifeval.jsonl", "--responses", "responses.jsonl"]],
    "lm-eval": [["--model_args", f"model={MODEL}", "--tasks", "kvinject_nextword", "--limit", "1"]],
}
LAYERS = ["0", "0-1", "1,1", "0,,1", ",", "", "-1", "0-99999", "1e10", "5-2", "0x1"]
CHOICES = ["bogus", "", " "]
MEANINGS: dict[str, list[str]] = {
    "--control": ["none", "normal:0,0.5", "bogus", "", "none@q8_0"],
    "--reference": ["recompute@f32", "none", "bogus", "normal:0,0.5", ""],
    "--target": ["kv", "k", "v", "x", ""],
    "--layers": LAYERS,
    "--heads": LAYERS,
    "--positions": ["0-3", "prompt", "generated", "needle", "first:1e10", "first:0", "1,1", "", "100-", "3-1"],
    "--format": ["table", "json", "csv", "bogus"],
    "--flash-attn": ["on", "off", "auto", "maybe"],
    "--cache-type-k": ["q8_0", "q4_0", "f32", "bogus", ""],
    "--cache-type-v": ["q8_0", "f32", "bogus", ""],
    "--kv-rotation": ["on", "off", "maybe"],
    "--model": [MODEL, ".", "/dev/null", "missing.gguf", KEPT, "empty.txt"],
    "--bench": [*BENCHMARKS, "bogus", "nexttoken,nexttoken", ""],
    "--data": PATHS_READ + ["text.txt", "nexttoken=text.txt", "bogus=text.txt"],
    "--responses": PATHS_READ + ["ifeval.jsonl"],
    "--choice": ["quant:4", "none", "quant:4,quant:4", "bogus", "", "normal:0,0.5"],
    "--holdout-data": PATHS_READ + ["text.txt"],
    "--shots-data": PATHS_READ + ["text.txt"],
    "--include-path": PATHS_READ,
    "--haystack": CHOICES,
    "--family": CHOICES,
    "--key-type": CHOICES,
    "--value-type": CHOICES,
    "--prompt": ["Hi", "", "Hi,Hi", "x" * 5000],
    "--span": ["generated", "prompt", "bogus", ""],
    "--metric": ["accuracy", "ppl", "bogus", ""],
    "--filter": ["bench=nexttoken", "bogus", "x=1", "error=", "="],
    "--faults": ["field,bit", "bit,bit", "bogus", "", ","],
    "--shard": ["1/2", "0/0", "3/2", "x", "1/1e10", ""],
    "--time": ["1:00:00", "", "bogus", "-1"],
    "--partition": ["gpu", "", "a b"],
    "--gres": ["gpu:1", "", "bogus"],
    "--sbatch-arg": ["--mem=1G", "", "--output=/proc/version", "--arr=0-3", "-a0-3", "-t 10", "--", "--gres-flags=enforce-binding"],
    "--gen-kwargs": ["temperature=0", "bogus", "", "max_gen_toks=1e10"],
    "--exclude-instructions": ["punctuation:no_comma", "a,a", "a,,b", ",", "bogus"],
    "--task": ["kvinject_nextword", "a,a", "a,,b", ",", "bogus"],
    "prompt": ["Hi", "", "x" * 5000],
    "bench": ["ifeval", "bogus", ""],
    "grid": ["grid.toml", "twice.toml", "twice2.toml", "missing.toml", ".", "/dev/null", KEPT, "empty.txt"],
    "stores": [STORE, "missing.sqlite", ".", KEPT, "/dev/null", "empty.txt"],
    "--model_args": [f"model={MODEL},error=normal:0,0.25", f"model={MODEL},seed=1_000", f"model={MODEL},max_length=1e10", "model=missing.gguf"],
}


# lm-eval's own options (its `run` parser, which `kvinject lm-eval` passes them to), by meaning
# or else by type; left out: those that send results over the network, write lm-eval's request
# cache into its own install, or run a dataset's or task's code.
LM_EVAL_LEFT_OUT = {"--help", "--wandb_args", "--wandb_config_args", "--trackio_args", "--hf_hub_log_args", "--cache_requests", "--use_cache"}
LM_EVAL_LEFT_OUT |= {"--check_integrity", "--trust_remote_code", "--confirm_run_unsafe_code"}
LM_EVAL_MEANINGS: dict[str, list[str]] = {
    "--model_args": MEANINGS["--model_args"],
    "--tasks": ["kvinject_nextword", "a,a", "a,,b", ",", "bogus", ""],
    "--model": ["kvinject", "hf", "bogus", ""],
    "--limit": ["0", "-1", "nan", "inf", "0.001", "1_000", "0x10", "1e-400", "", "١"],  # not 1e10 or 0.5: valid, a whole task or half (minutes)
    "--config": PATHS_READ,
    "--include_path": PATHS_READ,
    "--output_path": PATHS_WRITTEN,
    "--samples": [*PATHS_READ, "{}", '{"kvinject_nextword": [0, 0]}', "bogus"],
    "--batch_size": ["1", "auto", "0", "-1", "bogus", "1e10", ""],
    "--device": ["cpu", "bogus", ""],
    "--gen_kwargs": MEANINGS["--gen-kwargs"],
    "--metadata": ["a=1", "bogus", "", "max_length=1e10"],
    "--seed": ["1", "1,2,3,4", "1,1", "bogus", "nan", "1e10", ""],
    "--verbosity": ["INFO", "bogus", ""],
    "--apply_chat_template": ["", "bogus"],
    "--fewshot_as_multiturn": ["true", "bogus", ""],
    "--system_instruction": ["Be brief.", ""],
}


@functools.cache  # built once: each option's spellings ask it which prefixes are its own
def lm_eval_parser() -> Any:
    from lm_eval._cli import HarnessCLI

    return HarnessCLI()._subparsers.choices["run"]


def lm_eval_options() -> list[Any]:
    """lm-eval's `run` options but those left out, each an argparse action."""
    return [a for a in lm_eval_parser()._actions if a.option_strings and not set(a.option_strings) & LM_EVAL_LEFT_OUT]


def lm_eval_spellings(action: Any, value: str) -> list[list[str]]:
    """Each way lm-eval's parser reads ``action`` given ``value``: `--flag V`, `--flag=V`, a
    prefix of the long form where no other option shares it, and with a short form `-f V` and
    `-fV` (kvinject reads the flags it checks as that parser does)."""
    long, shorts = action.option_strings[0], [o for o in action.option_strings if not o.startswith("--")]
    apart = value and not value.startswith("-")  # "-1" apart would read as a flag
    ways = [[long, value] if apart else [f"{long}={value}"], [f"{long}={value}"]]
    prefix = long[:-1]
    if not [o for o in lm_eval_parser()._option_string_actions if o.startswith(prefix) and o != long]:
        ways.append([prefix, value] if apart else [f"{prefix}={value}"])
    for short in shorts:
        ways += [[short, value] if apart else [short + value], [short + value] if value else [short, value]]
    return ways


def lm_eval_values(action: Any) -> list[str] | None:
    name = action.option_strings[0]
    if name in LM_EVAL_MEANINGS:
        return LM_EVAL_MEANINGS[name]
    if action.nargs == 0:
        return [""]  # a flag: given
    return NUMBERS if action.type in (int, float) else None


def lm_eval_with(base: list[str], action: Any, value: str, spelling: int = 0) -> list[str]:
    """``base`` with one of lm-eval's options set to ``value``, written the ``spelling``-th way
    (cycled) of :func:`lm_eval_spellings`, in place of the base's own where it gives one."""
    if action.nargs == 0:
        return [*base, action.option_strings[0]]
    ways = lm_eval_spellings(action, value)
    given = next((base.index(o) for o in action.option_strings if o in base[:-1]), None)
    rest = base if given is None else [*base[:given], *base[given + 2 :]]
    return [*rest, *ways[spelling % len(ways)]]


def options(command: str) -> list[Any]:
    return [p for p in commands()[command].params if not (is_option(p) and flag(p) == "--help")]


def values(param: Any) -> list[str] | None:
    """The strategy of one option or argument: its meaning's values, else its type's; None: none."""
    name = flag(param)
    if name == "--error":
        return error_specs()
    if name in MEANINGS:
        return MEANINGS[name]
    hint, metavar = annotation(param), getattr(param, "metavar", None) or ""
    if metavar.startswith(("INTEGER[", "NUMBER[")):
        return NUMBER_LISTS
    if hint in (int, float) or metavar in ("INTEGER", "NUMBER"):
        return NUMBERS
    if hint is Path:
        return PATHS_WRITTEN
    if hint is bool:
        return [""]  # the flag given (its value unused)
    return None


def missing() -> list[str]:
    """What has no strategy: commands without a base, options, benches without a base."""
    out = [f"kvinject {c}: no smallest command in BASES" for c in commands() if c not in BASES]
    out += [f"kvinject {c} {flag(p)}: no strategy" for c in commands() for p in options(c) if values(p) is None]
    out += [f"bench {name}: no smallest run in BENCHES" for name in BENCHMARKS if name not in BENCHES]
    out += [f"kvinject lm-eval {a.option_strings[0]}: no strategy" for a in lm_eval_options() if lm_eval_values(a) is None]
    out += [f"error model {name}: no documented example" for name, cls in REGISTRY.items() if not getattr(cls, "example", None)]
    return out


def error_specs() -> list[str]:
    """Each error model's documented example, then with one field at a time replaced by each
    adversarial number: evict's first field is a name, which random specs never got past."""
    out = []
    for cls in REGISTRY.values():
        out.append(cls.example)
        name, _, body = cls.example.partition(":")
        parts = body.split(",") if body else []
        for i, part in enumerate(parts):
            key = part.partition("=")[0] + "=" if "=" in part else ""
            out += [f"{name}:{','.join([*parts[:i], key + value, *parts[i + 1 :]])}" for value in NUMBERS]
    return out


def _bases_for(command: str, param: Any) -> list[list[str]]:
    """The bases an option applies to: a bench option to the runs of the benches that have it."""
    bases = BASES[command]
    if command not in ("run", "profile", "tune", "divergence") or not is_option(param):
        return bases
    owners = option_owners().get(param.name)
    if not owners or param.name in ("data", "limit"):
        return bases
    names = {bench for _, bench, _ in owners}
    if command == "run":
        return [b for b in bases if b[1] in names]
    name = sorted(names)[0]
    return [[*b, "--bench", name, *BENCHES[name]] for b in bases]


def with_value(base: list[str], param: Any, value: str) -> list[str]:
    """``base`` with ``param`` set to ``value``: replaced where the base gives it, else added."""
    if not is_option(param):
        arguments = [i for i, a in enumerate(base) if not a.startswith("-") and (i == 0 or not base[i - 1].startswith("-"))]
        return [value, *base[1:]] if arguments and arguments[0] == 0 else [value, *base]
    name = flag(param)
    if getattr(param, "is_flag", False):
        return [*base, name]
    args = list(base)
    for opt in param.opts:
        if opt in args[:-1]:
            i = args.index(opt)
            args[i + 1] = value
            return args
    return [*args, f"{name}={value}" if value.startswith("-") else name, *([] if value.startswith("-") else [value])]


def single(command: str) -> Iterator[list[str]]:
    """Every base of ``command``, then each with one option at a time set to each of its values."""
    yield from BASES[command]
    if command == "lm-eval":  # its options are lm-eval's own, passed on
        for action in lm_eval_options():
            for spelling, value in enumerate(lm_eval_values(action) or []):
                yield lm_eval_with(BASES["lm-eval"][0], action, value, spelling)
        return
    for param in options(command):
        for base in _bases_for(command, param):
            for value in values(param) or []:
                yield with_value(base, param, value)
    outputs = [p for p in options(command) if is_option(p) and annotation(p) is Path]
    for a in outputs:  # two outputs that are one file
        for b in outputs:
            if flag(a) < flag(b):
                yield with_value(with_value(BASES[command][0], a, "same.out"), b, "./same.out")


def all_single() -> list[list[str]]:
    return [[command, *args] for command in BASES for args in single(command)]


def sample(count: int, seed: int = 0) -> list[list[str]]:
    """``count`` commands: the single changes in a fixed shuffled order, then random commands
    with two or three changes, drawn from the same strategies."""
    rng = random.Random(seed)
    singles = all_single()
    rng.shuffle(singles)
    out = singles[:count]
    while len(out) < count:
        command = rng.choice([c for c in BASES if c != "lm-eval"])
        args = list(rng.choice(BASES[command]))
        params = options(command)
        for param in rng.sample(params, min(len(params), rng.randint(2, 3))):
            args = with_value(args, param, rng.choice(values(param) or [""]))
        out.append([command, *args])
    return out


def workspace(folder: Path, model: Path) -> None:
    """The files the generated commands name (the store is added by the tests' fixture)."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / MODEL).symlink_to(model)
    (folder / KEPT).write_text("kept")
    (folder / "empty.txt").write_text("")
    (folder / "text.txt").write_text("The cat sat on the mat. " * 40)
    (folder / "grid.toml").write_text(GRID + "[[errors]]\nspec = 'normal:0,0.5'\n")
    (folder / "twice.toml").write_text("[sweep]\nruns = 1\nmodels = ['tiny.gguf', './tiny.gguf']\n[bench.nexttoken]\nlimit = 1\n")
    (folder / "twice2.toml").write_text(GRID + "[[bench.nexttoken]]\nlimit = 1\n")
    prompt = json.dumps("Write a short poem about the sea.")
    (folder / "ifeval.jsonl").write_text(f'{{"key": 1, "prompt": {prompt}, "instruction_id_list": ["punctuation:no_comma"], "kwargs": [{{}}]}}\n')
    (folder / "responses.jsonl").write_text(f'{{"prompt": {prompt}, "response": "no commas here"}}\n')
