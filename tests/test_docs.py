"""The documentation stays true to the code: every `kvinject ...` command that README.md,
CONTRIBUTING.md and docs/ show (in code blocks and inline code) names a command that exists and only flags that
command takes, every grid they show loads, and every relative link, repository path and Python
name they name exists."""

from __future__ import annotations

import importlib
import json
import re
import shlex
import subprocess
import sys
from pathlib import Path

import click
import pytest
import typer.main

from kvinject.cli.app import app
from kvinject.exceptions import KvinjectError
from kvinject.experiments.grid import load_grid

ROOT = Path(__file__).resolve().parent.parent
PAGES = [ROOT / "README.md", ROOT / "CONTRIBUTING.md", *sorted((ROOT / "docs").glob("*.md"))]

FENCED = re.compile(r"^```[^\n]*\n(.*?)^```", re.MULTILINE | re.DOTALL)
INLINE = re.compile(r"`([^`\n]+)`")
LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")
# A path in the repository, as the pages name them (from its root): docs/faults.md, kvinject/engine/graph/hook.py.
PATH = re.compile(r"(?<![\w./-])((?:docs|examples|kvinject|tests|perf)/[\w./*{}-]*[\w*}])")  # a glob or {i} stays whole: a placeholder
# A module named from the package's root (docs/architecture.md): engine/graph/hook.py.
MODULE = re.compile(r"(?<![\w./-])((?:engine|error_models|benchmarks|experiments|analysis|cli|lmeval)/[\w./-]*\.py)\b")
# What a command writes, not the repository holds: a sweep's default store, a report's plot.
WRITTEN = re.compile(r"^examples/[\w-]+\.(results\.sqlite|slurm)$|\.png$|\.csv$")
# Where a page's command or path is a placeholder the user fills in.
PLACEHOLDER = re.compile(r"[A-Z]{2,}|\.\.\.|…|[*{}<>$]")
# A name in the Python API: kvinject.Model, kvinject.engine.generation.cache_free.one_pass (not a file such as kvinject.json).
NAME = re.compile(r"(?<![\w./-])(kvinject(?:\.[A-Za-z_]\w*)+)(?![\w/-])")
FILES = {"kvinject.json"}

COMMAND = typer.main.get_command(app)
GRID_BLOCK = re.compile(r"^```toml\n(.*?)^```", re.MULTILINE | re.DOTALL)


def commands(text: str) -> list[str]:
    """The `kvinject ...` command lines of a page: the lines of its code blocks (continued with
    a backslash) and its inline code that start with ``kvinject``."""
    found = []
    for block in FENCED.findall(text):
        for line in block.replace("\\\n", " ").splitlines():
            line = " ".join(line.split()).removeprefix("$ ")
            found += [line] if line.startswith("kvinject ") else []
    outside = FENCED.sub("", text)
    return found + [code for code in INLINE.findall(outside) if code.startswith("kvinject ")]


def command_problem(line: str) -> str | None:
    """Why ``line`` would not parse as a kvinject command (a command that does not exist, a
    flag the command does not take), or None."""
    line = line.split(" #")[0]  # a comment after the command
    try:
        words = shlex.split(line)[1:]
    except ValueError:
        words = line.split()[1:]
    words = [w.strip("[]|") for w in words if w not in ("...", "…")]  # [--flag] says it is optional
    if not words or words[0].startswith("-"):
        return _flags_problem(COMMAND, words, "kvinject")
    if words[0] not in COMMAND.commands:
        return f"no command '{words[0]}'"
    command = COMMAND.commands[words[0]]
    if command.context_settings.get("ignore_unknown_options"):  # lm-eval: its options are lm-eval's
        return None
    return _flags_problem(command, words[1:], f"kvinject {words[0]}")


def _flags_problem(command: click.Command, words: list[str], name: str) -> str | None:
    known = {opt for p in command.get_params(click.Context(command)) for opt in (*p.opts, *p.secondary_opts)}
    for word in words:
        flag = word.split("=")[0]
        if re.fullmatch(r"--?[A-Za-z][\w-]*", flag) and flag not in known:
            return f"{name} has no option {flag}"
    return None


def path_problems(page: Path, text: str) -> list[str]:
    """The relative links of ``page`` and the repository paths it names that do not exist."""
    problems = []
    for target in LINK.findall(text):
        target = target.split("#")[0]
        if target and not re.match(r"^[a-z]+:", target) and not (page.parent / target).exists():
            problems.append(f"link to {target}")
    for path in PATH.findall(text):
        path = path.rstrip(".")
        if not PLACEHOLDER.search(path) and not WRITTEN.search(path) and not (ROOT / path).exists():
            problems.append(f"path {path}")
    problems += [f"module kvinject/{path}" for path in MODULE.findall(text) if not (ROOT / "kvinject" / path).exists()]
    for name in NAME.findall(text):
        if name not in FILES and not _resolves(name):
            problems.append(f"name {name}")
    return problems


def _resolves(name: str) -> bool:
    """Whether ``name`` is a module of kvinject or an attribute of one."""
    parts = name.split(".")
    for i in range(len(parts), 0, -1):
        try:
            obj = importlib.import_module(".".join(parts[:i]))
        except ImportError:
            continue
        return all((obj := getattr(obj, attr, None)) is not None for attr in parts[i:])
    return False


def grid_problems(text: str, folder: Path) -> list[str]:
    """Why the grids (TOML blocks with [sweep], [bench...] or [[errors]]) of a page would not
    load; a fragment is completed with the default model and a bench."""
    problems = []
    for i, block in enumerate(b for b in GRID_BLOCK.findall(text) if re.search(r"^\[(sweep|bench\.|\[errors)", b, re.MULTILINE)):
        if "[sweep]" not in block:
            block = '[sweep]\nmodels = ["smollm2"]\n' + ("" if "[bench." in block else "[bench.nexttoken]\n") + block
        path = folder / f"grid{i}.toml"
        path.write_text(block)
        try:
            load_grid(path)
        except KvinjectError as e:
            problems.append(str(e).replace(str(path), f"grid {i}"))
    return problems


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.name)
def test_every_grid_a_page_shows_loads(page, tmp_path):
    problems = grid_problems(page.read_text(), tmp_path)
    assert not problems, "\n".join(problems)


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.name)
def test_every_command_a_page_shows_parses(page):
    problems = [f"`{line}`: {why}" for line in commands(page.read_text()) if (why := command_problem(line))]
    assert not problems, "\n".join(problems)


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.name)
def test_every_link_and_path_a_page_names_exists(page):
    problems = path_problems(page, page.read_text())
    assert not problems, "\n".join(problems)


# docs/extending.md's two examples as the modules they say they are, run on the tiny model: the
# benchmark under the control and the error model, whose values must reach the cache.
EXAMPLES = """
import importlib.util, json, re, sys
from pathlib import Path
blocks = re.findall(r"^```python\\n(.*?)^```", Path("docs/extending.md").read_text(), re.MULTILINE | re.DOTALL)
for package, code in zip(("kvinject.benchmarks", "kvinject.error_models"), blocks, strict=True):
    module = importlib.util.module_from_spec(importlib.util.spec_from_loader(f"{package}.from_docs", loader=None))
    module.__package__ = package
    sys.modules[module.__name__] = module
    exec(compile(code, "docs/extending.md", "exec"), module.__dict__)
import kvinject
with kvinject.Model(sys.argv[1]) as model:
    bench = kvinject.make_bench("copy", {"limit": 2, "words": 3})
    results = list(kvinject.run(model, [bench], kvinject.configurations("none", ["bf16"]), runs=1))
print(json.dumps([[r.config.label, sorted(r.metrics), r.realized.k.changed] for r in results]))
"""


def test_the_extension_examples_run(tiny_path):
    out = subprocess.run([sys.executable, "-c", EXAMPLES, str(tiny_path)], capture_output=True, text=True, cwd=ROOT, timeout=300)
    assert out.returncode == 0, out.stderr
    (label, metrics, changed), (rounding, rounded_metrics, rounded) = json.loads(out.stdout)
    assert (label, rounding) == ("none", "bf16") and "exact" in metrics and "exact" in rounded_metrics
    assert changed == 0 and rounded > 0, "bf16 reached the cache, the control did not"


def test_the_checks_find_a_grid_that_does_not_load(tmp_path):
    page = '```toml\n[[errors]]\nmodel = "bitflip"\np = 0.0001\n```\n\n```toml\n[sweep]\nmodel = ["smollm2"]\n```\n'
    (problem,) = grid_problems(page, tmp_path)
    assert problem.startswith("grid 1: [sweep] has no key 'model'")


def test_the_checks_find_a_broken_command_link_and_path():
    page = """
Run `kvinject sweep examples/faults.toml --dry-run`, then:

```bash
kvinject report docs/faults.results.sqlite \\
    --metric masked --no-such-flag
kvinject frobnicate
```

See [the faults](faults.md), [nowhere](no-such-page.md), kvinject/engine/no_such_module.py, engine/graph/hook.py, engine/hooks.py,
`kvinject.engine.generation.cache_free.one_pass` and `kvinject.engine.generation.cache_free.no_such_function`.
"""
    lines = commands(page)
    assert lines == [
        "kvinject report docs/faults.results.sqlite --metric masked --no-such-flag",
        "kvinject frobnicate",
        "kvinject sweep examples/faults.toml --dry-run",
    ]
    assert [command_problem(line) for line in lines] == ["kvinject report has no option --no-such-flag", "no command 'frobnicate'", None]
    assert command_problem("kvinject sweep GRID.toml [--dry-run] [--frobnicate]") == "kvinject sweep has no option --frobnicate"
    assert command_problem("kvinject --version") is None and command_problem("kvinject --verbose") == "kvinject has no option --verbose"
    assert path_problems(ROOT / "docs" / "page.md", page) == [
        "link to no-such-page.md",
        "path kvinject/engine/no_such_module.py",
        "module kvinject/engine/hooks.py",
        "name kvinject.engine.generation.cache_free.no_such_function",
    ]
