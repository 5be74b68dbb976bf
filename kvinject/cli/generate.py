"""`kvinject generate`: one prompt's greedy completion under each configuration, side by side."""

from __future__ import annotations

from collections.abc import Callable
from typing import Annotated

import typer
from rich.table import Table
from rich.text import Text

from ..engine.target import Target
from ..error_models.configuration import configurations
from ..jsonutil import dumps
from .flags import CtxOpt, ErrorOpt, FormatOpt, HeadsOpt, LayersOpt, PositionsOpt, SeedOpt, Setup, TargetOpt, setup_flags
from .render import console, fmt


@setup_flags(parallel=False)
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
    setup: Setup,
) -> None:
    """Greedy completion of PROMPT under the control and each --error, side by side."""
    from ..experiments.generate import generate as run_generate

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
        columns["rel. err std K/V"] = lambda z: f"{fmt(z.k.rel_err_std)} / {fmt(z.v.rel_err_std)}"
        columns["sign flips K/V"] = lambda z: f"{fmt(z.k.sign_flip_frac, '.2%')} / {fmt(z.v.sign_flip_frac, '.2%')}"
        columns["SNR dB K/V"] = lambda z: f"{fmt(z.k.snr_db, '.1f')} / {fmt(z.v.snr_db, '.1f')}"
    for c in hit if len(hit) == 1 else ():
        columns[f"{c.upper()} rel. err mean±std"] = lambda z, c=c: f"{fmt(getattr(z, c).rel_err_mean)} ± {fmt(getattr(z, c).rel_err_std)}"
        columns[f"{c.upper()} sign flips"] = lambda z, c=c: fmt(getattr(z, c).sign_flip_frac, ".2%")
        columns[f"{c.upper()} SNR dB"] = lambda z, c=c: fmt(getattr(z, c).snr_db, ".1f")
    table = Table(title=f"{prompt!r}", show_lines=True)
    table.add_column("error", overflow="fold")
    table.add_column("completion", overflow="fold", ratio=1)
    for col in columns:
        table.add_column(col, justify="right", overflow="fold")
    for r in results:
        # the label not markup: it holds [target:layers]
        table.add_row(Text(r.config.label), r.text, *(show(r.realized) for show in columns.values()))
    console.print(table)
    for r in results:  # a completion that ended in NaN logits must not read as the model's answer
        if r.changed_nothing:
            console.print(Text(f"{r.config.label}: changed no value that reached the cache: its completion is the control's", style="yellow"))
        bad = r.realized.k.nonfinite + r.realized.v.nonfinite
        if r.nonfinite_steps or bad:
            where = f"{bad} values reached the cache as NaN or Inf; " if bad else ""
            console.print(
                Text(f"{r.config.label}: {where}the logits were NaN or Inf at {r.nonfinite_steps} step(s), where greedy decoding means nothing", style="yellow")
            )
