"""Benchmarks scored under K/V error, by name.

Every module of this package is imported, and every Benchmark subclass with a ``name``
registers itself: a new benchmark is one file here, or one module of another package named
under the entry-point group ``kvinject.benchmarks`` (docs/extending.md).
"""

from __future__ import annotations

from dataclasses import Field, fields
from typing import Any

from ..exceptions import KvinjectError, SpecError
from ..plugins import import_modules, load_plugins
from ..values import unique
from .base import BENCHMARKS, Benchmark, GenerationBenchmark, Plan, RunResult
from .options import Options, flag

import_modules(__path__, __name__)


def bench_class(name: str) -> type[Benchmark]:
    cls = BENCHMARKS.get(name)
    if cls is None:
        raise KvinjectError(f"unknown bench '{name}': choose from {', '.join(BENCHMARKS)}")
    return cls


def parse_options(name: str, values: dict[str, Any], cli: bool = False) -> Options:
    """The options of bench ``name`` from CLI strings or grid/Python values, checked."""
    try:
        return bench_class(name).Options.parse(values, cli)
    except SpecError as e:
        raise SpecError(f"{name}: {e}") from None


def make_bench(name: str, values: dict[str, Any], cli: bool = False) -> Benchmark:
    """A benchmark from its name and option values (None: the default)."""
    return bench_class(name)(parse_options(name, values, cli))


def option_owners(kind: type[Benchmark] | None = None) -> dict[str, list[tuple[type[Options], str, Field]]]:
    """Each option name with the benchmarks (of ``kind``, if given) that take it (their Options
    class, name and field): one `kvinject run` flag per name, applied to every selected benchmark
    that has it."""
    owners: dict[str, list[tuple[type[Options], str, Field]]] = {}
    for name, cls in BENCHMARKS.items():
        if kind is not None and not issubclass(cls, kind):
            continue
        for f in fields(cls.Options):
            owners.setdefault(f.name, []).append((cls.Options, name, f))
    return owners


def data_for(benches: list[str], data: list[str]) -> dict[str, str]:
    """``PATH`` for a single bench, or ``BENCH=PATH`` for several (--data)."""
    out: dict[str, str] = {}
    for item in data:
        name, eq, path = item.partition("=")
        if eq and name in benches:
            if name in out:  # the data of one bench, given twice: which one was meant?
                raise SpecError(f"--data gives {name}'s data twice ({out[name]}, then {path}): give it once")
            out[name] = path
        elif eq and name in BENCHMARKS:  # not a file named "nexttoken=...": a bench left out
            raise SpecError(f"--data {item}: {name} is not a selected bench ({', '.join(benches)}); add --bench {name}")
        elif len(set(benches)) == 1:
            if benches[0] in out:
                raise SpecError(f"--data gives {benches[0]}'s data twice ({out[benches[0]]}, then {item}): give it once")
            out[benches[0]] = item
        else:
            raise SpecError(f"with several benches, give --data as BENCH=PATH (got '{item}')")
    return out


def make_benches(names: list[str], values: dict[str, Any], data: list[str] = ()) -> list[Benchmark]:
    """The benchmarks ``names`` (each once) from command-line values: each takes the values of
    the options it has; a value that none of them takes is an error, not ignored."""
    names = unique("--bench", names)
    classes = [bench_class(n) for n in names]
    given = {k: v for k, v in values.items() if v is not None and v != [] and v != ()}
    for key in given:
        if not any(key in {f.name for f in fields(c.Options)} for c in classes):
            takers = [b for _, b, _ in option_owners().get(key, [])]
            raise SpecError(f"{flag(key)} applies to {', '.join(takers) or 'no benchmark'}, not to {', '.join(names)}")
    paths = data_for(names, list(data))
    benches = []
    for name, cls in zip(names, classes):
        own = {f.name for f in fields(cls.Options)}
        benches.append(make_bench(name, {**{k: v for k, v in given.items() if k in own}, "data": paths.get(name)}, cli=True))
    return benches


from .gsm8k import GSM8K  # noqa: E402  (registered above; re-exported for the API)
from .ifeval.bench import IFEval  # noqa: E402
from .nexttoken import NextToken  # noqa: E402
from .perplexity import Perplexity  # noqa: E402

# Last: a plug-in may import what this module defines. A subclass registers as it is defined.
load_plugins("kvinject.benchmarks", lambda cls: None)

__all__ = [
    "BENCHMARKS",
    "GSM8K",
    "Benchmark",
    "GenerationBenchmark",
    "IFEval",
    "NextToken",
    "Options",
    "Perplexity",
    "Plan",
    "RunResult",
    "bench_class",
    "data_for",
    "make_bench",
    "make_benches",
    "option_owners",
    "parse_options",
]
