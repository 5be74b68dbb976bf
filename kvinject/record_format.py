"""Record formats: a results store's records and `kvinject run --output`'s carry the number of
their format (``format``) and the kvinject that wrote them (``kvinject``), so that a reader can
tell what a record holds and how to read it. The number goes up when what a record holds, or
what one of its values means, changes; docs/grid-format.md lists the formats.

kvinject 0.1.0 wrote formats 1 to 6 without their number: a record without one is of those,
and what it lacks tells which.
"""

from __future__ import annotations

from typing import Any

from . import __version__

RECORD_FORMAT = 7

# What each format changed from the one before; docs/grid-format.md's table.
FORMATS = {
    1: "the first: a generation bench's record has no generated token ids",
    2: "each item's generated token ids (`outputs`), from which a resumed sweep takes its control's tokens",
    3: "IFEval's instructions per prompt (`instructions`), which weigh its instruction-level intervals",
    4: "`bitflip` and `faults` count the flipped values in the realized statistics, no longer also the rounding to fp16",
    5: "each recorded fault names its `stage`, `prompt` or `generated`",
    6: "each DUE item's cause (`due_nonfinite`, `due_raised`, `due_timeout`); from kvinject 0.2.0, `format` and `kvinject` in the record",
    7: "composite configurations (`kivi:2[k]+float:e4m3[v]`) as the `error`; their realized statistics add each part's (`parts`, by its place in the spec)",
}


def stamp(record: dict[str, Any]) -> dict[str, Any]:
    """The record with its format and the version of kvinject that writes it."""
    return {**record, "format": RECORD_FORMAT, "kvinject": __version__}


def unstamped(before: int) -> str:
    """How a message names a record without a format number, which lacks what ``before`` added."""
    return f"written by kvinject 0.1.0 before record format {before}"
