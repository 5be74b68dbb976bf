"""`kvinject info`: versions, backend, the model's attention shape and KV cache sizes."""

from __future__ import annotations

from rich.table import Table

from ..engine.options import BackendOptions
from ..jsonutil import dumps
from .flags import CtxOpt, FormatOpt, GpuOpt, ModelOpt, ThreadsOpt, VerboseOpt, load
from .render import console, fmt


def info(
    model: ModelOpt = None,
    n_gpu_layers: GpuOpt = None,
    ctx: CtxOpt = 4096,
    threads: ThreadsOpt = None,
    output_format: FormatOpt = "table",
    verbose: VerboseOpt = False,
) -> None:
    """Versions, backend, the model's attention shape and the KV cache size per cache type."""
    from ..engine.info import gather

    with load(model, BackendOptions(n_gpu_layers=n_gpu_layers, threads=threads), verbose) as m:
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
        table.add_row(row["type"], f"{row['bits_per_value']:g}", f"{row['estimate_mib']:.2f}", fmt(row["allocated_mib"], ".2f"), fmt(row["ratio"], ".3f"))
    console.print(table)
    console.print(report["llama_cpp_system"], style="dim", markup=False, highlight=False)
