"""`kvinject benchmarks`: the benchmarks, their options, metrics and spans."""

from __future__ import annotations

from rich.table import Table
from rich.text import Text

from ..jsonutil import dumps
from .flags import FormatOpt
from .render import console


def benchmarks(output_format: FormatOpt = "table") -> None:
    """List the benchmarks with their options (flags of `kvinject run`, keys of [bench.NAME] in
    grid files), metrics and the spans --positions may name."""
    from ..benchmarks import BENCHMARKS
    from ..benchmarks.options import describe, flag

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
