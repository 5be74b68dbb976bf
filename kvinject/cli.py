"""The ``kvinject`` command line: a thin layer over the Python API."""

from __future__ import annotations

import inspect
import json
import math
import os
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Optional

import typer
from rich.console import Console
from rich.table import Table
from rich.text import Text

from . import __version__, interrupts
from .benchmarks.base import GenerationBenchmark
from .config import Configuration, configurations
from .error_models import REGISTRY
from .exceptions import KvinjectError
from .jsonutil import dumps
from .options import BackendOptions, CacheOptions
from .outputs import check_writable
from .target import Target

app = typer.Typer(
    help=(
        "Inject controlled error into the K and V vectors of a llama.cpp model as they enter "
        "the KV cache, and measure what it does.\n\n"
        "Start with `kvinject errors` (the error models), `kvinject info` (model, backend and "
        'cache sizes) and `kvinject generate "The capital of France is" --error normal:0,0.5`.'
    ),
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    rich_markup_mode=None,  # help texts show spec syntax such as ERROR[@K[/V]] literally
)


def _print_version(given: bool) -> None:
    if given:
        print(__version__)
        raise typer.Exit()


@app.callback()
def _options(
    version: Annotated[bool, typer.Option("--version", help="Print kvinject's version and exit.", callback=_print_version, is_eager=True)] = False,
) -> None:
    """--version; the app's help is Typer(help=...) above."""


# Piped or redirected output has no width to fit: give the tables room rather than cut
# their cells short (COLUMNS still decides where it is set); they are made to fit 100.
console = Console(width=None if sys.stdout.isatty() or "COLUMNS" in os.environ else 200)

# Options shared by every command that loads a model.
ModelOpt = Annotated[
    Optional[str],
    typer.Option("--model", "-m", help="GGUF file, hf:OWNER/REPO/FILE.gguf, or a bundled model (smollm2, gemma3-270m). Default: smollm2."),
]
GpuOpt = Annotated[Optional[int], typer.Option("--n-gpu-layers", help="Layers to offload to the GPU (-1: all). Default: all with a GPU backend, else 0.")]
FlashOpt = Annotated[str, typer.Option("--flash-attn", help="Flash attention: auto, on or off.")]
CacheKOpt = Annotated[str, typer.Option("--cache-type-k", help="K cache type: f32, f16, bf16, q8_0, q4_0, q4_1, iq4_nl, q5_0, q5_1.")]
CacheVOpt = Annotated[str, typer.Option("--cache-type-v", help="V cache type (quantized V needs flash attention).")]
CtxOpt = Annotated[int, typer.Option("--ctx", help="Context size in tokens.")]
ThreadsOpt = Annotated[Optional[int], typer.Option("--threads", help="CPU threads. Default: physical cores.")]
ParallelOpt = Annotated[
    Optional[int],
    typer.Option(
        "--parallel",
        "-j",
        help="Sequences decoded together: prompts generated at once (ifeval, nexttoken, passkey, niah, vt; default 8 on CPU, 32 on GPU, "
        "fewer for prompts of over 1K tokens) "
        "or perplexity chunks per decode (default: as many as fill 512 tokens, 2048 on GPU). 1 is sequential evaluation.",
    ),
]
RotationOpt = Annotated[str, typer.Option("--kv-rotation", help="llama.cpp's Hadamard rotation of quantized K/V caches: on or off.")]
VerboseOpt = Annotated[bool, typer.Option("--verbose", help="Show llama.cpp's log.")]
ErrorOpt = Annotated[
    Optional[list[str]],
    typer.Option("--error", "-e", help="Error model spec, repeatable (see `kvinject errors`), e.g. normal:0,0.25. The control (none) always runs."),
]
TargetOpt = Annotated[str, typer.Option("--target", help="Which vectors get the error: kv, k or v.")]
LayersOpt = Annotated[Optional[str], typer.Option("--layers", help="Layers that get the error, e.g. 0-3,10. Default: all.")]
PositionsOpt = Annotated[
    Optional[str],
    typer.Option(
        "--positions",
        help="Cached tokens that get the error: positions and ranges (0-3, 100-), first:N, prompt, generated, "
        "or spans the bench declares (needle, haystack, context, question); a comma-separated union. Default: all.",
    ),
]
HeadsOpt = Annotated[
    Optional[str],
    typer.Option(
        "--heads",
        help="KV heads that get the error, e.g. 0 or 0-1, of `kvinject info`'s n_head_kv (query head q reads KV head q // (n_head / n_head_kv)). Default: all.",
    ),
]
SeedOpt = Annotated[int, typer.Option("--seed", min=0, help="Seed of the noise (with the run index), >= 0.")]
FormatOpt = Annotated[str, typer.Option("--format", help="Output: table or json.")]
WideOpt = Annotated[bool, typer.Option("--wide", help="Tables with every column (secondary metrics); by default they fit 100 columns.")]


def _on_off(name: str, value: str) -> bool:
    if value not in ("on", "off"):
        raise KvinjectError(f"{name} must be on or off, got '{value}'")
    return value == "on"


def _cache(flash_attn: str, cache_type_k: str, cache_type_v: str, kv_rotation: str) -> CacheOptions:
    return CacheOptions(cache_type_k, cache_type_v, flash_attn, _on_off("--kv-rotation", kv_rotation))


def _load(model: str | None, backend: BackendOptions, verbose: bool):
    from .llama_log import set_verbose
    from .model import Model

    set_verbose(verbose)
    with console.status(f"loading {model or 'the default model'}...", spinner="dots"):
        return Model(model, backend)


@dataclass(frozen=True)
class _Setup:
    """What the flags shared by the commands that run a model say: the model, its backend and cache."""

    model: str | None
    backend: BackendOptions
    cache: CacheOptions
    verbose: bool

    def load(self):
        return _load(self.model, self.backend, self.verbose)


def _setup(
    model: ModelOpt = None,
    n_gpu_layers: GpuOpt = None,
    flash_attn: FlashOpt = "auto",
    cache_type_k: CacheKOpt = "f16",
    cache_type_v: CacheVOpt = "f16",
    threads: ThreadsOpt = None,
    parallel: ParallelOpt = None,
    kv_rotation: RotationOpt = "on",
    verbose: VerboseOpt = False,
) -> _Setup:
    backend = BackendOptions(n_gpu_layers=n_gpu_layers, threads=threads, parallel=parallel)
    return _Setup(model, backend, _cache(flash_attn, cache_type_k, cache_type_v, kv_rotation), verbose)


def _setup_flags(parallel: bool):
    """Give the decorated command the flags of :func:`_setup` (``--parallel`` where it decodes
    sequences together), declared once; it gets them as ``setup``."""

    def decorate(func):
        shared = [
            p.replace(kind=inspect.Parameter.KEYWORD_ONLY)
            for p in inspect.signature(_setup, eval_str=True).parameters.values()
            if parallel or p.name != "parallel"
        ]
        signature = inspect.signature(func, eval_str=True)

        def command(**kwargs):
            setup = _setup(**{p.name: kwargs.pop(p.name) for p in shared})
            return func(**kwargs, setup=setup)

        command.__signature__ = signature.replace(parameters=[p for p in signature.parameters.values() if p.name != "setup"] + shared)
        command.__name__, command.__doc__ = func.__name__, func.__doc__
        return command

    return decorate


def _print_table(table) -> None:
    """A results table at the terminal's width, or wider where its numbers would not fit whole
    with the names folded (tables.print_width)."""
    from .tables import print_width

    width = print_width(table, console.width)
    (console if width == console.width else Console(width=width)).print(table)


def _fmt(value: float, spec: str = ".3f") -> str:
    return "-" if value is None or (isinstance(value, float) and math.isnan(value)) else format(value, spec)


@app.command()
def errors() -> None:
    """List the error models with their syntax and meaning."""
    from rich.padding import Padding

    from .error_models import Multiplicative

    console.print("Error models (--error SPEC)", style="bold", highlight=False)
    # The multiplicative noise models first (the study's), then the rest as registered; a syntax
    # line each, whole (a table column folded it mid-token), its meaning and an example below.
    for cls in sorted(REGISTRY.values(), key=lambda c: not issubclass(c, Multiplicative)):
        console.print(Text(cls.syntax, style="bold cyan"), soft_wrap=True)
        console.print(Padding(Text(cls.summary), (0, 0, 0, 4), expand=False))
        console.print(Padding(Text(f"e.g. {cls.example}", style="green"), (0, 0, 1, 4), expand=False))
    console.print(
        "Apply to K or V only with --target k|v, to some layers with --layers 0-3,10, to some tokens with --positions first:4, "
        "and to some KV heads with --heads 0."
    )


@app.command()
def benchmarks(output_format: FormatOpt = "table") -> None:
    """List the benchmarks with their options (flags of `kvinject run`, keys of [bench.NAME] in
    grid files), metrics and the spans --positions may name."""
    from .benchmarks import BENCHMARKS
    from .benchmarks.options import describe, flag

    listing = [
        {
            "name": name,
            "summary": cls.summary,
            "options": [{"name": n, "type": t, "default": d, "help": h} for n, t, d, h in describe(cls.Options)],
            "primary": cls.primary,
            "metrics": list(cls.higher_is_better),
            "spans": list(cls.spans),
        }
        for name, cls in BENCHMARKS.items()
    ]
    if output_format == "json":
        print(dumps(listing))
        return
    if output_format != "table":
        raise KvinjectError(f"--format must be table or json, got '{output_format}'")
    table = Table(title="Benchmarks (--bench NAME)", show_lines=True)
    table.add_column("bench", style="bold cyan", no_wrap=True)
    table.add_column("measures")
    table.add_column("options: flags of `kvinject run`; grid keys without the --")
    for b in listing:
        options = Text()
        for o in b["options"]:
            options.append(f"{flag(o['name'])} {o['type']}", style="bold")
            options.append(f"{'' if o['default'] == '-' else ' = ' + o['default']}  {o['help']}\n")
        spans = f"\n--positions spans: {', '.join(b['spans'])}" if b["spans"] else ""
        measures = Text(f"{b['summary']}\nmetrics: {', '.join(b['metrics'])} (headline {b['primary']}){spans}")
        options.rstrip()
        table.add_row(b["name"], measures, options)
    console.print(table)


@app.command()
@_setup_flags(parallel=False)
def generate(
    prompt: Annotated[str, typer.Argument(help="The prompt to complete.")],
    error: ErrorOpt = None,
    target: TargetOpt = "kv",
    layers: LayersOpt = None,
    positions: PositionsOpt = None,
    heads: HeadsOpt = None,
    max_tokens: Annotated[int, typer.Option("--max-tokens", "-n", help="Tokens to generate.")] = 32,
    chat: Annotated[bool, typer.Option("--chat/--raw", help="Wrap the prompt in the model's chat template.")] = False,
    seed: SeedOpt = 0,
    output_format: FormatOpt = "table",
    ctx: CtxOpt = 2048,
    *,
    setup: _Setup,
) -> None:
    """Greedy completion of PROMPT under the control and each --error, side by side."""
    from .generate import generate as run_generate

    if output_format not in ("table", "json"):
        raise KvinjectError(f"--format must be table or json, got '{output_format}'")
    configs = configurations("none", error or [], Target.parse(target, layers, positions, heads), setup.cache)
    with setup.load() as m:
        with console.status("generating...", spinner="dots"):
            results = run_generate(m, prompt, configs, max_tokens=max_tokens, chat=chat, seed=seed, n_ctx=ctx)
    if output_format == "json":
        print(dumps({"prompt": prompt, "model": str(m.path), "seed": seed, "results": [r.to_dict() for r in results]}))
        return
    # Only the components some configuration put error into get columns, so the completion keeps
    # its width; with both, K/V side by side and the relative error's std alone (--format json has all).
    hit = [c for c in "kv" if any(getattr(r.realized, c).values for r in results)]
    columns: dict[str, Callable[..., str]] = {}  # header: cell from a Realized
    if len(hit) == 2:
        columns["rel. err std K/V"] = lambda z: f"{_fmt(z.k.rel_err_std)} / {_fmt(z.v.rel_err_std)}"
        columns["sign flips K/V"] = lambda z: f"{_fmt(z.k.sign_flip_frac, '.2%')} / {_fmt(z.v.sign_flip_frac, '.2%')}"
        columns["SNR dB K/V"] = lambda z: f"{_fmt(z.k.snr_db, '.1f')} / {_fmt(z.v.snr_db, '.1f')}"
    for c in hit if len(hit) == 1 else ():
        columns[f"{c.upper()} rel. err mean±std"] = lambda z, c=c: f"{_fmt(getattr(z, c).rel_err_mean)} ± {_fmt(getattr(z, c).rel_err_std)}"
        columns[f"{c.upper()} sign flips"] = lambda z, c=c: _fmt(getattr(z, c).sign_flip_frac, ".2%")
        columns[f"{c.upper()} SNR dB"] = lambda z, c=c: _fmt(getattr(z, c).snr_db, ".1f")
    table = Table(title=f"{prompt!r}", show_lines=True)
    table.add_column("error", overflow="fold")
    table.add_column("completion", overflow="fold", ratio=1)
    for col in columns:
        table.add_column(col, justify="right", overflow="fold")
    for r in results:
        # the label not markup: it holds [target:layers]
        table.add_row(Text(r.config.label), r.text, *(show(r.realized) for show in columns.values()))
    console.print(table)


def _bench_flags(func=None, *, kind=None):
    """Give ``func`` (the run command) one flag per benchmark option, made from the benchmarks'
    Options dataclasses: a benchmark's new option is a new flag without an edit here. Their
    values reach ``func`` as ``bench_values``. ``kind``: the options of that kind of benchmark
    only (divergence takes generation benchmarks)."""
    if func is None:
        return lambda f: _bench_flags(f, kind=kind)
    from .benchmarks import option_owners
    from .benchmarks.options import flag, metavar, shown_default, value_type

    signature = inspect.signature(func, eval_str=True)
    params = []
    for name, owners in option_owners(kind).items():
        if name == "data":  # --data BENCH=PATH, declared with the command
            continue
        if name in signature.parameters:  # a benchmark author's mistake, caught by the tests
            raise TypeError(f"the option '{name}' of {', '.join(b for _, b, _ in owners)} is already a `kvinject run` option: rename it")
        # Strings, so that Options.parse sees what was typed (typer would take 1_000 and nan); a
        # yes/no option is a flag pair (--chat/--no-chat), unset unless given.
        typ, many = value_type(owners[0][0], name)
        value = Optional[bool] if typ is bool else Optional[list[str]] if many else Optional[str]
        flags = [f"{flag(name)}/--no-{flag(name)[2:]}"] if typ is bool else [flag(name)]
        shown = {} if typ is bool else {"metavar": metavar(owners[0][0], name)}
        helps: dict[str, list[str]] = {}
        for _, bench, f in owners:
            default = shown_default(f)
            helps.setdefault(f.metadata["help"].rstrip(".") + (f" (default {default})" if default != "-" else ""), []).append(bench)
        text = " ".join(f"{', '.join(b)}: {h}." for h, b in helps.items())
        params.append(
            inspect.Parameter(
                name,
                inspect.Parameter.KEYWORD_ONLY,
                default=None,
                annotation=Annotated[value, typer.Option(*flags, help=text, **shown)],
            )
        )
    names = [p.name for p in params]

    def command(**kwargs):
        return func(**{k: v for k, v in kwargs.items() if k not in names}, bench_values={k: kwargs[k] for k in names})

    command.__signature__ = signature.replace(parameters=[p for p in signature.parameters.values() if p.name != "bench_values"] + params)
    command.__doc__ = func.__doc__
    return command


@app.command(name="run")
@_bench_flags
@_setup_flags(parallel=True)
def run_command(
    bench: Annotated[list[str], typer.Option("--bench", "-b", help="Benchmark, repeatable (see `kvinject benchmarks`).")],
    error: ErrorOpt = None,
    control: Annotated[str, typer.Option("--control", help="The control configuration, ERROR[@K[/V]], e.g. none@f32 for an f32 cache.")] = "none",
    target: TargetOpt = "kv",
    layers: LayersOpt = None,
    positions: PositionsOpt = None,
    heads: HeadsOpt = None,
    runs: Annotated[int, typer.Option("--runs", "-r", help="Runs per configuration (a configuration without randomness runs once).")] = 5,
    seed: SeedOpt = 0,
    data: Annotated[
        Optional[list[str]], typer.Option("--data", help="Data for a bench: PATH or hf:NAME[:CONFIG][@SPLIT], or BENCH=... with several benches.")
    ] = None,
    output: Annotated[Optional[Path], typer.Option("--output", "-o", help="Write every record, aggregate and setting as JSON.")] = None,
    csv: Annotated[Optional[Path], typer.Option("--csv", help="Also write the aggregates as CSV.")] = None,
    output_format: FormatOpt = "table",
    wide: WideOpt = False,
    *,
    setup: _Setup,
    bench_values: dict | None = None,
) -> None:
    """Score benchmarks under the control and each --error, over repeated runs, with statistics.

    Example: kvinject run --bench ifeval --bench nexttoken --error normal:0,0.25 --error none@q8_0 --runs 5
    """
    from .benchmarks import make_benches
    from .runner import Report, metadata
    from .runner import run as run_benches

    if output_format not in ("table", "json"):
        raise KvinjectError(f"--format must be table or json, got '{output_format}'")
    if runs < 1:
        raise KvinjectError(f"--runs must be >= 1, got {runs}")
    cache = setup.cache
    tgt = Target.parse(target, layers, positions, heads)
    configs = configurations(control, error or [], tgt, cache)
    check_writable(output, csv)
    benches = make_benches(bench, bench_values or {}, data or [])
    with setup.load() as m:
        report = Report(metadata(m, benches, configs, runs, seed, {"cache": cache.to_dict()}), benches={b.name: b for b in benches})
        with _progress() as progress:
            bars = {}

            def bar(b, total):
                bars[b.name] = progress.add_task(b.name, total=total)
                return lambda n: progress.advance(bars[b.name], n)

            try:
                for result in run_benches(m, benches, configs, runs, seed, bar):
                    report.results.append(result)
                    if not progress.console.is_terminal:  # a log (a cluster job's): no bar redraws, a timed line per run
                        primary = next(b.primary for b in benches if b.name == result.bench)
                        score = result.metrics.get(primary, math.nan)
                        line = f"{time.strftime('%H:%M:%S')} {result.bench} {result.config.label} run {result.run}: {primary} {score:.4g}"
                        progress.console.print(line, markup=False, highlight=False, soft_wrap=True)
            except KeyboardInterrupt:
                report.interrupted = True
    data = report.to_dict()
    if output:
        output.write_text(dumps(data))
    if csv:
        import pandas as pd

        pd.json_normalize(data["aggregates"]).to_csv(csv, index=False)
    if output_format == "json":
        print(dumps(data))
    else:
        from .tables import bench_table

        for b in benches:
            _print_table(bench_table(b.name, b.primary, b.secondary, data["aggregates"], wide, console.width))
        if output:
            console.print(f"[dim]results written to {output}")
    if report.interrupted:
        Console(stderr=True).print(f"[yellow]interrupted: {len(report.results)} finished runs kept{f' in {output}' if output else ''}")
        raise typer.Exit(130)


def _progress():
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn

    return Progress(
        TextColumn("{task.description:<11}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        TextColumn("ETA"),
        TimeRemainingColumn(),
        console=Console(stderr=True),
        transient=False,
    )


@app.command()
def sweep(
    grid: Annotated[Path, typer.Argument(help="Grid file (TOML, see docs/grid-format.md).")],
    store: Annotated[
        Optional[Path], typer.Option("--store", help="Results store (SQLite). Default: GRID.results.sqlite, or GRID.shardIofN.results.sqlite.")
    ] = None,
    shard: Annotated[
        Optional[str], typer.Option("--shard", help="Run a deterministic 1/n of the cells: i/n, e.g. $SLURM_ARRAY_TASK_ID/$SLURM_ARRAY_TASK_COUNT.")
    ] = None,
    dry_run: Annotated[
        bool,
        typer.Option("--dry-run", help="List the expanded cells, what is left to run, which other workers compute what, and a time estimate; run nothing."),
    ] = False,
    max_cells: Annotated[int, typer.Option("--max-cells", min=1, help="Refuse a grid that expands to more cells (a guard against a mistyped range).")] = 5000,
    parallel: ParallelOpt = None,
    verbose: VerboseOpt = False,
) -> None:
    """Run every cell of a grid into a results store. Safe to interrupt: finished runs are kept,
    and running the same command again does only what is missing. Several workers (one per GPU,
    say) may run the same command on one store on one machine: they split the cell groups."""
    from .grid import bench_labels, load_grid
    from .llama_log import set_verbose
    from .store import Store
    from .sweep import Sweep, default_store, parse_shard

    set_verbose(verbose)
    parsed_shard = parse_shard(shard) if shard is not None else None
    g = load_grid(grid, max_cells)
    if parallel is not None:
        g.parallel = parallel
    store_path = store or default_store(grid, parsed_shard)
    if dry_run:  # read what is done and claimed; create and change nothing
        opened = Store(store_path, readonly=True) if store_path.exists() else Store(Path(":memory:"))
    else:
        opened = Store(store_path)
    with opened as s:
        sw = Sweep(g, s, parsed_shard)
        planned = sw.plan()
        left = [p for p in planned if p.runs]
        if dry_run:
            claims = sw.claimed()
            table = Table()
            for col in ("model", "bench", "configuration", "seed", "runs left", "claimed by"):
                table.add_column(col)
            controls = {p.cell.group: p.cell.config for p in planned if p.cell.control}
            for p, bench in zip(planned, bench_labels([p.cell for p in planned])):
                claim = claims.get(p.cell.group) if p.runs else None
                worker = f"{claim.worker.host}:{claim.worker.pid}{'' if claim.alive(sw.claim_timeout) else ' (expired)'}" if claim else ""
                shown = p.cell.config.label_beside(controls.get(p.cell.group, p.cell.config))
                label = Text(shown + (" (control)" if p.cell.control else ""))  # not markup: [v:all] is text
                table.add_row(p.cell.model, bench, label, str(p.cell.seed), str(len(p.runs)), worker)
            console.print(table)
            minutes = sw.estimate_seconds(left) / 60
            being = sum(len(p.runs) for p in left if (c := claims.get(p.cell.group)) and c.alive(sw.claim_timeout))
            runs_left = sum(len(p.runs) for p in left)
            print(
                f"{grid}: {_count(len(planned), 'cell')}{f' (shard {shard})' if shard else ''}, {_count(runs_left, 'run')} left"
                + (f", {being} of them being computed by workers now" if being else "")
            )
            if runs_left:
                print(f"estimate: about {max(minutes, 1):.0f} min on 2 CPU cores, timed on the default model (docs/performance.md)")
            print(f"store: {store or default_store(grid, parsed_shard)}")
            return
        resume = f"kvinject sweep {grid}" + (f" --shard {shard}" if shard else "") + (f" --store {store}" if store else "")
        try:
            written = _run_sweep(sw)
        except KeyboardInterrupt:
            _interrupted(store_path, resume)
            raise typer.Exit(130)
    console.print(f"{written} runs written to {store_path}, nothing left to run; report with: kvinject report {store_path}", soft_wrap=True)


def _count(n: int, noun: str) -> str:
    return f"{n} {noun}{'' if n == 1 else 's'}"


def _interrupted(store: Path, resume: str) -> None:
    # Perplexity scores a batch of runs (up to 16) together, chunk by chunk: none of them is
    # finished until the last chunk, and an interrupt loses them all.
    Console(stderr=True).print(
        f"interrupted: every finished run is in {store}; the runs under way were not finished "
        f"(perplexity finishes a batch of runs together) and start again with: {resume}",
        style="yellow",
        markup=False,  # a path may hold [brackets]
        soft_wrap=True,
    )


def _run_sweep(sw) -> int:
    """Run a sweep with a progress bar per cell group and its notices above them; where stderr
    is no terminal (a cluster job's log), bars do not show: a timed line per stored run does."""
    with _progress() as progress:
        log = (
            None
            if progress.console.is_terminal
            else lambda line: progress.console.print(f"{time.strftime('%H:%M:%S')} {line}", markup=False, highlight=False, soft_wrap=True)
        )
        return sw.run(
            lambda name, total: (lambda task: lambda n: progress.advance(task, n))(progress.add_task(name, total=total)),
            lambda message: progress.console.print(message, markup=False, highlight=False, soft_wrap=True),
            log,
        )


@app.command(name="profile")
@_bench_flags
@_setup_flags(parallel=True)
def profile(
    error: Annotated[str, typer.Option("--error", "-e", help="The error spec put into one layer's K or V at a time, e.g. normal:0,0.5.")],
    bench: Annotated[str, typer.Option("--bench", "-b", help="The benchmark measured (see `kvinject benchmarks`).")] = "perplexity",
    metric: Annotated[
        Optional[str],
        typer.Option("--metric", help="The metric mapped: default kld (KL divergence from the control) for perplexity, else the bench's headline."),
    ] = None,
    runs: Annotated[int, typer.Option("--runs", "-r", help="Runs per layer and component (an error without randomness runs once).")] = 1,
    seed: SeedOpt = 0,
    data: Annotated[Optional[str], typer.Option("--data", help="The bench's data: PATH or hf:NAME[:CONFIG][@SPLIT].")] = None,
    store: Annotated[Optional[Path], typer.Option("--store", help="Results store (default: profile-MODEL-BENCH-ERROR.results.sqlite here).")] = None,
    by_head: Annotated[bool, typer.Option("--by-head", help="Each KV head of each layer's K and V alone (layers x heads x 2 runs).")] = False,
    heatmap: Annotated[Optional[Path], typer.Option("--heatmap", help="Draw the map (layers x K, V, or their heads) to this PNG (needs matplotlib).")] = None,
    csv: Annotated[Optional[Path], typer.Option("--csv", help="Write the map as CSV (a row per layer).")] = None,
    *,
    setup: _Setup,
    bench_values: dict | None = None,
) -> None:
    """Map where a model is sensitive: ERROR in one layer's K or V at a time, every layer (with
    --by-head, one KV head of it at a time), on one metric (a resumable sweep: Ctrl-C any time,
    the same command goes on).

    Example: kvinject profile --error normal:0,0.5 --ctx 512 --chunks 8 --heatmap layers.png
    """
    from .benchmarks import make_benches
    from .llama_log import set_verbose
    from .plots import sensitivity_map
    from .profile import profile_grid, profile_metric, sensitivity
    from .report import load_records
    from .store import Store
    from .sweep import Sweep

    set_verbose(setup.verbose)
    if runs < 1:
        raise KvinjectError(f"--runs must be >= 1, got {runs}")
    config = Configuration.parse(error, cache=setup.cache)
    err, cache = config.error, config.cache  # ERROR@K/V: the profile's cache types
    if not err.injects:
        raise KvinjectError(f"--error {error} puts no error anywhere: give an error model (see `kvinject errors`)")
    (b,) = make_benches([bench], bench_values or {}, [data] if data else [])
    metric = profile_metric(bench, metric)
    check_writable(heatmap, csv)
    given = {k for k, v in (bench_values or {}).items() if v not in (None, [], ())} | ({"data"} if data else set())
    grid = profile_grid(setup.model, b, given, err, cache, setup.backend, runs, seed, store, by_head)
    with Store(grid.path) as s:
        try:
            _run_sweep(Sweep(grid, s))
        except KeyboardInterrupt:
            _interrupted(grid.path, "the same command")
            raise typer.Exit(130)
    table = sensitivity(load_records([grid.path]), err, metric, by_head)
    name = Path(grid.cells[0].model).name
    where = "one KV head of one layer's K or V" if by_head else "one layer's K or V"
    t = Table(title=f"{bench}: {metric} with {err.spec} in {where} ({name})", title_justify="left")
    for col in ("layer", *(c.upper() for c in table.columns)):
        t.add_column(col, justify="right")
    for layer, row in table.iterrows():
        t.add_row(str(layer), *(_fmt(row[c], ".4g") for c in table.columns))
    console.print(t)
    if csv:
        table.to_csv(csv)
    if heatmap:
        sensitivity_map(table, metric, f"{name} {bench}: {metric} with {err.spec} in {where}", heatmap)
        Console(stderr=True).print(f"heatmap written to {heatmap}")
    console.print(f"[dim]results in {grid.path}")


@app.command(name="divergence")
@_bench_flags(kind=GenerationBenchmark)
@_setup_flags(parallel=False)
def divergence_command(
    error: Annotated[list[str], typer.Option("--error", "-e", help="A configuration compared with the reference, ERROR[@K[/V]], repeatable.")],
    reference: Annotated[
        str, typer.Option("--reference", help="The reference configuration: it generates the tokens, and every configuration is compared with it.")
    ] = "recompute@f32",
    bench: Annotated[Optional[str], typer.Option("--bench", "-b", help="The generation benchmark whose items are the prompts (default gsm8k).")] = None,
    prompt: Annotated[Optional[list[str]], typer.Option("--prompt", help="A prompt given as text instead of a benchmark's items, repeatable.")] = None,
    span: Annotated[str, typer.Option("--span", help="Positions summarized and drawn: generated, prompt or all.")] = "generated",
    target: TargetOpt = "kv",
    layers: LayersOpt = None,
    positions: PositionsOpt = None,
    heads: HeadsOpt = None,
    seed: SeedOpt = 0,
    data: Annotated[Optional[str], typer.Option("--data", help="The bench's data: PATH or hf:NAME[:CONFIG][@SPLIT].")] = None,
    heatmap: Annotated[
        Optional[Path], typer.Option("--heatmap", help="Draw layers x positions to this PNG, a panel per configuration (needs matplotlib).")
    ] = None,
    output: Annotated[Optional[Path], typer.Option("--output", "-o", help="Write every item's distances per layer and position as JSON.")] = None,
    output_format: FormatOpt = "table",
    *,
    setup: _Setup,
    bench_values: dict | None = None,
) -> None:
    """Layer-wise divergence: the relative L2 distance of each layer's output (the residual
    stream) under each --error configuration from the reference's, on the reference's greedy
    tokens, per layer and position; the table gives each layer's mean and max over positions.

    Example: kvinject divergence --error none@f16 --error none@f32 --limit 4 --max-tokens 64 --heatmap layers.png
    """
    from .benchmarks import make_benches
    from .divergence import SPANS, bench_prompts, check_bench, divergence, text_prompts
    from .plots import divergence_map

    if output_format not in ("table", "json"):
        raise KvinjectError(f"--format must be table or json, got '{output_format}'")
    if span not in SPANS:
        raise KvinjectError(f"--span must be one of {', '.join(SPANS)}, got '{span}'")
    values = {k: v for k, v in (bench_values or {}).items() if v not in (None, [], ())}
    if prompt and (bench or data or set(values) - {"max_tokens"}):
        raise KvinjectError("--prompt gives the prompts as text: it takes --max-tokens, not a bench, its data or its options")
    cache = setup.cache
    ref = Configuration.parse(reference, cache=cache)
    configs = list(dict.fromkeys(Configuration.parse(e, Target.parse(target, layers, positions, heads), cache) for e in error))
    benches = None if prompt else make_benches([bench or "gsm8k"], values, [data] if data else [])
    if benches:
        check_bench(benches[0])
    check_writable(heatmap, output)
    with setup.load() as m:
        prompts = text_prompts(m, prompt, int(values.get("max_tokens", 64))) if prompt else bench_prompts(m, benches[0])
        with _progress() as progress:
            task = progress.add_task("divergence", total=len(prompts.tokens) * (1 + len(configs)))
            result = divergence(m, ref, configs, prompts, seed, lambda n: progress.advance(task, n))
    data_out = {"model": str(m.path), "seed": seed, "cache": cache.to_dict(), **result.to_dict(span)}
    if output:
        output.write_text(dumps(data_out))
    name = Path(str(m.path)).name
    if output_format == "json":
        print(dumps(data_out))
    else:
        t = Table(
            title=f"{name}: relative L2 distance of each layer's output from {ref.label}, {len(result.items)} items, {result.count(span)} {span} positions",
            title_justify="left",
        )
        t.add_column("layer", justify="right")
        for c in configs:
            t.add_column(Text(f"{c.label}\nmean"), justify="right")  # not markup: labels hold [target:layers]
            t.add_column("max", justify="right")
        summary = result.summary(span)
        for layer in range(result.n_layer):
            t.add_row(str(layer), *(_fmt(float(s[k][layer]), ".3g") for s in summary for k in ("mean", "max")))
        console.print(t)
    if heatmap:
        offsets, grids = result.by_position(span)
        divergence_map(offsets, grids, [c.label for c in configs], f"{name}: distance of each layer's output from {ref.label}", heatmap)
        Console(stderr=True).print(f"heatmap written to {heatmap}")


@app.command()
def report(
    stores: Annotated[list[Path], typer.Argument(help="Results stores written by kvinject sweep (shards are merged).")],
    output_format: Annotated[str, typer.Option("--format", help="table, markdown, csv, json or latex.")] = "table",
    filters: Annotated[
        Optional[list[str]], typer.Option("--filter", help="Keep records whose setting KEY equals VALUE, e.g. bench=ifeval, target=k, cache_v=q8_0.")
    ] = None,
    all_metrics: Annotated[bool, typer.Option("--all-metrics", help="Every metric, not only each bench's primary one.")] = False,
    metric: Annotated[
        Optional[str],
        typer.Option(
            "--metric",
            help="Tabulate and draw this metric instead of each bench's primary one, e.g. token_match (eviction's agreement "
            "with the full cache); see `kvinject benchmarks`. Benches without it are left out.",
        ),
    ] = None,
    wide: WideOpt = False,
    plot: Annotated[Optional[Path], typer.Option("--plot", help="Draw degradation curves to this PNG (needs matplotlib).")] = None,
    heatmap: Annotated[
        Optional[Path],
        typer.Option("--heatmap", help="Draw score over length x depth (passkey, niah, vt) to this PNG, a panel per configuration (needs matplotlib)."),
    ] = None,
    frontier: Annotated[
        Optional[Path],
        typer.Option("--frontier", help="Draw each bench's score against bits per K/V element to this PNG, with the Pareto front (needs matplotlib)."),
    ] = None,
    outcomes: Annotated[
        Optional[Path],
        typer.Option(
            "--outcomes", help="Draw the shares of items masked, benign, SDC and DUE per configuration to this PNG (fault campaigns; needs matplotlib)."
        ),
    ] = None,
) -> None:
    """Merge results stores and print the study-style table: score, CIs, percent of control and
    the paired test, per bench and configuration."""
    from .plots import frontier as draw_frontier
    from .plots import heatmap as draw_heatmap
    from .plots import outcomes as draw_outcomes
    from .plots import plot as draw
    from .report import FORMATS, check_metric, load_records, render, select, study_table, summarize, terminal_tables
    from .tables import report_table

    if output_format not in FORMATS:
        raise KvinjectError(f"--format must be one of {', '.join(FORMATS)}")
    if metric and all_metrics:
        raise KvinjectError("--metric picks one metric and --all-metrics shows every one: give one of them")
    check_writable(plot, heatmap, frontier, outcomes)
    records = select(load_records(stores), filters or [])
    df = summarize(records)
    if df.empty:
        raise KvinjectError("no control to compare these records with: a shard's store may lack it; give report the store that holds it too")
    if metric:
        check_metric(df, metric)
    # Figures first: one these records cannot give fails before the tables print.
    if plot:
        draw(df, plot, metric)
        Console(stderr=True).print(f"plot written to {plot}")
    if heatmap:
        draw_heatmap(records, heatmap)
        Console(stderr=True).print(f"heatmap written to {heatmap}")
    if frontier:
        draw_frontier(df, frontier, metric)
        Console(stderr=True).print(f"frontier written to {frontier}")
    if outcomes:
        draw_outcomes(df, outcomes)
        Console(stderr=True).print(f"outcomes written to {outcomes}")
    table = df if all_metrics else study_table(df, metric, digits=3 if output_format == "table" else 4)
    if output_format == "table":
        parts = [(f"{len(records)} runs from {len(stores)} store(s)", table)] if all_metrics or wide else terminal_tables(table)
        for title, part in parts:
            console.print(title, style="italic", highlight=False)  # not a table title: that wraps at the table's width
            _print_table(report_table(part))
        if not (all_metrics or wide):
            console.print("--wide: every column in one table (ci_runs: the 95% interval across runs)", style="dim", highlight=False)
    else:
        print(render(table, output_format))


@app.command()
def score(
    bench: Annotated[str, typer.Argument(help="The benchmark whose checkers score the responses: ifeval.")],
    data: Annotated[str, typer.Option("--data", help="IFEval input_data.jsonl (or hf:google/IFEval).")],
    responses: Annotated[Path, typer.Option("--responses", help="JSONL with 'prompt' and 'response' per line (IFEval's input_response_data format).")],
    output: Annotated[
        Optional[Path], typer.Option("--output", "-o", help="Write one verdict per response line, in order (per-instruction strict/loose), as JSONL.")
    ] = None,
    output_format: FormatOpt = "table",
) -> None:
    """Score responses generated elsewhere with kvinject's IFEval checkers. Every line is scored:
    a prompt may come several times (responses of several runs, seeds or models)."""
    from .benchmarks.ifeval.bench import load_items
    from .benchmarks.ifeval.scoring import metrics, read_responses, score_responses

    if bench != "ifeval":
        raise KvinjectError(f"only ifeval responses can be scored, got '{bench}'")
    if output_format not in ("table", "json"):
        raise KvinjectError(f"--format must be table or json, got '{output_format}'")
    check_writable(output)
    items = load_items(data)
    answers = read_responses(responses)
    if not answers:
        raise KvinjectError(f"{responses} holds no response")
    verdicts = score_responses(items, answers, str(responses))
    if output:
        output.write_text("".join(json.dumps(v.to_dict()) + "\n" for v in verdicts))
    covered = len({v.prompt for v in verdicts})
    result = {"scored": len(verdicts), "prompts": covered, "prompts_without_response": len(items) - covered, **metrics(verdicts)}
    if output_format == "json":
        print(dumps(result))
        return
    missing = len(items) - covered
    table = Table(
        title=f"IFEval: {len(verdicts)} responses to {covered} prompts scored" + (f"; {missing} prompts of the data without a response" if missing else "")
    )
    table.add_column("metric")
    table.add_column("value", justify="right")
    for key, value in metrics(verdicts).items():
        table.add_row(key, f"{value:.4f}")
    console.print(table)


@app.command()
def info(
    model: ModelOpt = None,
    n_gpu_layers: GpuOpt = None,
    ctx: CtxOpt = 4096,
    threads: ThreadsOpt = None,
    output_format: FormatOpt = "table",
    verbose: VerboseOpt = False,
) -> None:
    """Versions, backend, the model's attention shape and the KV cache size per cache type."""
    from .info import gather

    with _load(model, BackendOptions(n_gpu_layers=n_gpu_layers, threads=threads), verbose) as m:
        with console.status("measuring cache sizes...", spinner="dots"):
            report = gather(m, ctx)
    if output_format == "json":
        print(dumps(report))
        return
    head = Table.grid(padding=(0, 2))
    head.add_column(no_wrap=True)
    head.add_column(overflow="fold")  # a model's path whole, its file name at the end
    for key in (
        "kvinject",
        "llama_cpp_python",
        "backend",
        "model",
        "sha256",
        "architecture",
        "n_layer",
        "n_head",
        "n_head_kv",
        "head_dim_k",
        "head_dim_v",
        "n_ctx_train",
        "threads",
        "n_gpu_layers",
    ):
        head.add_row(f"[bold]{key}", str(report[key]))
    console.print(head)
    console.print(f"KV cache at --ctx {ctx}: estimate 2·n_layer·n_head_kv·head_dim·ctx·bytes vs llama.cpp's allocation", highlight=False)
    table = Table()
    for col in ("cache type", "bits/value", "estimate MiB", "allocated MiB", "ratio"):
        table.add_column(col, justify="right")
    for row in report["cache_sizes"]:
        table.add_row(row["type"], f"{row['bits_per_value']:g}", f"{row['estimate_mib']:.2f}", _fmt(row["allocated_mib"], ".2f"), _fmt(row["ratio"], ".3f"))
    console.print(table)
    console.print(report["llama_cpp_system"], style="dim", markup=False, highlight=False)


@app.command()
def version() -> None:
    """Print kvinject's version."""
    print(__version__)


def main() -> None:
    interrupts.install()
    try:
        app()
    except KvinjectError as e:
        Console(stderr=True, soft_wrap=True).print("[bold red]error:[/]", Text(str(e)), highlight=False)  # one line, however long
        sys.exit(2)
