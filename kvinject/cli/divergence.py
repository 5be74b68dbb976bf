"""`kvinject divergence`: how far each layer's output departs from a reference configuration's."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Optional

import typer
from rich.console import Console
from rich.table import Table
from rich.text import Text

from ..benchmarks.base import GenerationBenchmark
from ..engine.target import Target
from ..error_models.configuration import Configuration, check_selection_applies
from ..exceptions import KvinjectError
from ..files import write_text
from ..jsonutil import dumps
from ..values import unique
from .flags import FormatOpt, HeadsOpt, LayersOpt, PositionsOpt, SeedOpt, Setup, TargetOpt, bench_flags, setup_flags
from .outputs import check_writable
from .render import console, fmt, progress_bars


@bench_flags(kind=GenerationBenchmark)
@setup_flags(parallel=False)
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
    setup: Setup,
    bench_values: dict | None = None,
) -> None:
    """Layer-wise divergence: the relative L2 distance of each layer's output (the residual
    stream) under each --error configuration from the reference's, on the reference's greedy
    tokens, per layer and position; the table gives each layer's mean and max over positions.

    Example: kvinject divergence --error none@f16 --error none@f32 --limit 4 --max-tokens 64 --heatmap layers.png
    """
    from ..analysis.plots import divergence_map
    from ..benchmarks import bench_class, make_benches
    from ..experiments.divergence import SPANS, bench_prompts, check_bench, divergence, text_prompts

    if span not in SPANS:
        raise KvinjectError(f"--span must be one of {', '.join(SPANS)}, got '{span}'")
    values = {k: v for k, v in (bench_values or {}).items() if v not in (None, [], ())}
    prompt = unique("--prompt", prompt or [])
    if prompt and (bench or data or set(values) - {"max_tokens"}):
        raise KvinjectError("--prompt gives the prompts as text: it takes --max-tokens, not a bench, its data or its options")
    cache = setup.cache
    ref = Configuration.parse(reference, cache=cache)
    selection = Target.parse(target, layers, positions, heads)
    parsed = {e: Configuration.parse(e, selection, cache) for e in error}
    configs = [parsed[e] for e in unique("--error", error, key=parsed.get)]
    check_selection_applies(selection, configs)
    benches = None if prompt else make_benches([bench or "gsm8k"], values, [data] if data else [])
    if benches:
        check_bench(benches[0])
    # --prompt's --max-tokens, checked as a generation bench checks it, before the model loads
    max_tokens = bench_class("gsm8k").Options.parse({"max_tokens": values["max_tokens"]}, cli=True).max_tokens if prompt and "max_tokens" in values else 64
    check_writable({"--output": output}, figures={"--heatmap": heatmap}, inputs=[data], stdout=["--output"])
    with setup.load() as m:
        prompts = text_prompts(m, prompt, max_tokens) if prompt else bench_prompts(m, benches[0])
        with progress_bars() as progress:
            task = progress.add_task("divergence", total=len(prompts.tokens) * (1 + len(configs)))
            result = divergence(m, ref, configs, prompts, seed, lambda n: progress.advance(task, n))
    data_out = {"model": str(m.path), "seed": seed, "cache": cache.to_dict(), **result.to_dict(span)}
    if output:
        write_text(output, dumps(data_out))
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
            t.add_row(str(layer), *(fmt(float(s[k][layer]), ".3g") for s in summary for k in ("mean", "max")))
        console.print(t)
    if heatmap:
        offsets, grids = result.by_position(span)
        divergence_map(offsets, grids, [c.label for c in configs], f"{name}: distance of each layer's output from {ref.label}", heatmap)
        Console(stderr=True).print(f"heatmap written to {heatmap}")
