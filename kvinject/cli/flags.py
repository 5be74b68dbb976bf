"""The flags commands share, declared once: the model and its backend and cache (:func:`setup_flags`),
the target of the error, output formats, and one flag per benchmark option (:func:`bench_flags`)."""

from __future__ import annotations

import inspect
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Annotated, Optional

import typer

from ..engine.options import BackendOptions, CacheOptions
from ..exceptions import KvinjectError
from .render import console

MAX_CTX = 2**20  # the longest contexts models have (1M tokens); 2^31 made llama.cpp allocate until killed

# Options shared by every command that loads a model.
ModelOpt = Annotated[
    Optional[str], typer.Option("--model", "-m", help="GGUF file, hf:OWNER/REPO/FILE.gguf, or a bundled model (smollm2, gemma3-270m). Default: smollm2.")
]
GpuOpt = Annotated[Optional[int], typer.Option("--n-gpu-layers", help="Layers to offload to the GPU (-1: all). Default: all with a GPU backend, else 0.")]
FlashOpt = Annotated[str, typer.Option("--flash-attn", help="Flash attention: auto, on or off.")]
CacheKOpt = Annotated[str, typer.Option("--cache-type-k", help="K cache type: f32, f16, bf16, q8_0, q4_0, q4_1, iq4_nl, q5_0, q5_1.")]
CacheVOpt = Annotated[str, typer.Option("--cache-type-v", help="V cache type (quantized V needs flash attention).")]
CtxOpt = Annotated[int, typer.Option("--ctx", help="Context size in tokens.", callback=lambda value: check_ctx(value) or value)]
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
FormatOpt = Annotated[str, typer.Option("--format", help="Output: table or json.", callback=lambda value: check_format(value) or value)]
WideOpt = Annotated[bool, typer.Option("--wide", help="Tables with every column (secondary metrics); by default they fit 100 columns.")]


def on_off(name: str, value: str) -> bool:
    if value not in ("on", "off"):
        raise KvinjectError(f"{name} must be on or off, got '{value}'")
    return value == "on"


def cache_options(flash_attn: str, cache_type_k: str, cache_type_v: str, kv_rotation: str) -> CacheOptions:
    return CacheOptions(cache_type_k, cache_type_v, flash_attn, on_off("--kv-rotation", kv_rotation))


def load(model: str | None, backend: BackendOptions, verbose: bool):
    from ..engine.llama_log import set_verbose
    from ..engine.model import Model

    set_verbose(verbose)
    with console.status(f"loading {model or 'the default model'}...", spinner="dots"):
        return Model(model, backend)


@dataclass(frozen=True)
class Setup:
    """What the flags shared by the commands that run a model say: the model, its backend and cache."""

    model: str | None
    backend: BackendOptions
    cache: CacheOptions
    verbose: bool

    def load(self):
        return load(self.model, self.backend, self.verbose)


def setup_from_flags(
    model: ModelOpt = None,
    n_gpu_layers: GpuOpt = None,
    flash_attn: FlashOpt = "auto",
    cache_type_k: CacheKOpt = "f16",
    cache_type_v: CacheVOpt = "f16",
    threads: ThreadsOpt = None,
    parallel: ParallelOpt = None,
    kv_rotation: RotationOpt = "on",
    verbose: VerboseOpt = False,
) -> Setup:
    backend = BackendOptions(n_gpu_layers=n_gpu_layers, threads=threads, parallel=parallel)
    return Setup(model, backend, cache_options(flash_attn, cache_type_k, cache_type_v, kv_rotation), verbose)


def setup_flags(parallel: bool):
    """Give the decorated command the flags of :func:`setup_from_flags` (``--parallel`` where it decodes
    sequences together), declared once; it gets them as ``setup``."""

    def decorate(func):
        shared = [
            p.replace(kind=inspect.Parameter.KEYWORD_ONLY)
            for p in inspect.signature(setup_from_flags, eval_str=True).parameters.values()
            if parallel or p.name != "parallel"
        ]
        signature = inspect.signature(func, eval_str=True)

        def command(**kwargs):
            setup = setup_from_flags(**{p.name: kwargs.pop(p.name) for p in shared})
            return func(**kwargs, setup=setup)

        command.__signature__ = signature.replace(parameters=[p for p in signature.parameters.values() if p.name != "setup"] + shared)
        command.__name__, command.__doc__ = func.__name__, func.__doc__
        return command

    return decorate


def bench_flags(func=None, *, kind=None):
    """Give ``func`` (the run command) one flag per benchmark option, made from the benchmarks'
    Options dataclasses: a benchmark's new option is a new flag without an edit here. Their
    values reach ``func`` as ``bench_values``. ``kind``: the options of that kind of benchmark
    only (divergence takes generation benchmarks)."""
    if func is None:
        return lambda f: bench_flags(f, kind=kind)
    from ..benchmarks import option_owners
    from ..benchmarks.options import flag, metavar, shown_default, value_type

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
            inspect.Parameter(name, inspect.Parameter.KEYWORD_ONLY, default=None, annotation=Annotated[value, typer.Option(*flags, help=text, **shown)])
        )
    names = [p.name for p in params]

    def command(**kwargs):
        return func(**{k: v for k, v in kwargs.items() if k not in names}, bench_values={k: kwargs[k] for k in names})

    command.__signature__ = signature.replace(parameters=[p for p in signature.parameters.values() if p.name != "bench_values"] + params)
    command.__doc__ = func.__doc__
    return command


def check_ctx(value: int) -> None:
    """A context llama.cpp can make: 0 and -1 had ended in a traceback where the batch was sized."""
    if not 1 <= value <= MAX_CTX:
        raise KvinjectError(f"--ctx must be between 1 and {MAX_CTX} tokens, got {value}")


def check_wide(wide: bool, output_format: str) -> None:
    """--wide shapes the terminal's tables: with another --format it would change nothing."""
    if wide and output_format != "table":
        raise KvinjectError(f"--wide applies to --format table, not {output_format}: leave it out")


def check_format(value: str, formats: Sequence[str] = ("table", "json")) -> None:
    """Refuse an output format the command does not write."""
    if value not in formats:
        allowed = " or ".join(formats) if len(formats) == 2 else f"one of {', '.join(formats)}"
        raise KvinjectError(f"--format must be {allowed}, got '{value}'")
