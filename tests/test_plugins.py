"""Another package adds an error model and a benchmark through entry points, without an edit to
kvinject: a throwaway package written at test time, found on the path as pip would install it
(a dist-info with entry_points.txt), used by the `kvinject` command end to end."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

MODELS = """
from dataclasses import dataclass
from typing import ClassVar

from kvinject.error_models import EntryModel, register


@register
@dataclass(frozen=True)
class Halve(EntryModel):
    name: ClassVar[str] = "halve"
    syntax: ClassVar[str] = "halve"
    summary: ClassVar[str] = "Halve every component."
    example: ClassVar[str] = "halve"

    def apply(self, x, draws):
        x *= 0.5


@dataclass(frozen=True)
class Negate(EntryModel):  # not decorated: the entry point names the class, which is registered
    name: ClassVar[str] = "negate"
    syntax: ClassVar[str] = "negate"
    summary: ClassVar[str] = "Flip the sign of every component."
    example: ClassVar[str] = "negate"

    def apply(self, x, draws):
        x *= -1.0


@dataclass(frozen=True)
class Impostor(EntryModel):  # takes a built-in's name: refused, the built-in stays
    name: ClassVar[str] = "normal"
    syntax: ClassVar[str] = "normal"
    summary: ClassVar[str] = "Not kvinject's normal."
    example: ClassVar[str] = "normal"

    def apply(self, x, draws):
        x *= 0.0
"""

# A model written as before error models had parts: apply on ErrorModel would hook nothing.
OLD_STYLE = """
from kvinject.error_models import ErrorModel


class Double(ErrorModel):
    name = "double"
    syntax = summary = example = "double"

    def apply(self, x, draws):
        x *= 2.0
"""

BENCH = """
from dataclasses import dataclass

import numpy as np

from kvinject.benchmarks.base import GenerationBenchmark
from kvinject.benchmarks.options import Options, option


@dataclass(frozen=True)
class EchoOptions(Options):
    max_tokens: int = option(4, "Tokens generated per item.", minimum=1)


class Echo(GenerationBenchmark):
    name = "echo"
    summary = "Say a word back (exact match)."
    Options = EchoOptions
    primary = "exact"
    higher_is_better = {"exact": True}
    binary = frozenset({"exact"})

    def load(self):
        self.items = ["apple", "river", "stone"]

    def __len__(self):
        return len(self.items)

    def estimate_seconds(self, runs, speed):
        return runs * speed.generation(len(self), 8, self.options.max_tokens)

    def prompts(self, model):
        return [model.tokenize(f"Say {w}:") for w in self.items]

    def limits(self, prompts):
        return self.options.max_tokens, max(map(len, prompts)) + self.options.max_tokens + 1

    def score(self, index, generation):
        return float(generation.text.strip() == self.items[index])

    def summarize(self, scores):
        return {"exact": float(np.mean(scores))}, {"exact": scores}
"""

ENTRY_POINTS = """[kvinject.error_models]
halve = kvinject_demo.models
negate = kvinject_demo.models:Negate
broken = kvinject_demo.missing
impostor = kvinject_demo.models:Impostor
old = kvinject_demo.old_style

[kvinject.benchmarks]
echo = kvinject_demo.bench
"""


@pytest.fixture(scope="module")
def plugin_path(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("site")
    (root / "kvinject_demo").mkdir()
    (root / "kvinject_demo" / "__init__.py").write_text("")
    (root / "kvinject_demo" / "models.py").write_text(MODELS)
    (root / "kvinject_demo" / "old_style.py").write_text(OLD_STYLE)
    (root / "kvinject_demo" / "bench.py").write_text(BENCH)
    info = root / "kvinject_demo-0.1.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: kvinject-demo\nVersion: 0.1\n")
    (info / "entry_points.txt").write_text(ENTRY_POINTS)
    return root


def kvinject(plugin_path: Path, *args: object) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(plugin_path), *filter(None, [os.environ.get("PYTHONPATH")])])}
    return subprocess.run([sys.executable, "-m", "kvinject", *map(str, args)], capture_output=True, text=True, timeout=300, env=env)


def test_plugins_are_listed_and_a_broken_one_is_named_not_fatal(plugin_path):
    out = kvinject(plugin_path, "errors")
    assert out.returncode == 0, out.stderr
    assert "Halve every component." in out.stdout and "Flip the sign of every component." in out.stdout
    assert "'broken' of kvinject-demo (kvinject_demo.missing) failed to load" in out.stderr
    assert "'impostor' of kvinject-demo" in out.stderr and "the error model name 'normal' is taken by kvinject.error_models.noise.Normal" in out.stderr
    assert "Not kvinject's normal." not in out.stdout and "kv += kv * N(MEAN,STD)" in out.stdout
    assert "'old' of kvinject-demo (kvinject_demo.old_style) failed to load and is left out: Double defines apply: subclass EntryModel" in out.stderr
    listing = json.loads(kvinject(plugin_path, "benchmarks", "--format", "json").stdout)
    assert "echo" in [b["name"] for b in listing]


def test_a_plugin_model_reaches_the_cache_in_a_plugin_bench(plugin_path, tiny_path):
    out = kvinject(plugin_path, "run", "--model", tiny_path, "--bench", "echo", "--error", "halve", "--error", "negate", "--format", "json")
    assert out.returncode == 0, out.stderr
    records = {r["label"]: r for r in json.loads(out.stdout)["records"]}
    assert set(records) == {"none", "halve", "negate"}
    for label, relative in (("halve", -0.5), ("negate", -2.0)):  # (x' - x) / x of every value that reached the cache
        for component in "kv":
            realized = records[label]["realized"][component]
            assert realized["values"] > 0
            assert realized["rel_err_mean"] == pytest.approx(relative) and realized["rel_err_std"] == pytest.approx(0, abs=1e-6)
    assert records["none"]["realized"]["k"]["values"] == 0
