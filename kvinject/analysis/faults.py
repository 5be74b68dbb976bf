"""Fault campaigns read per fault: vulnerability maps (campaign size: kvinject/experiments/campaign.py).

A run of ``faults:1`` records, for every item, the site of its one fault (layer, K or V, the
token's position and stage (a prompt's token or a generated one), KV head, element, bit, the
field of the stored format the bit lies in: sign, exponent, mantissa, or a block's scale or code) and
the item's outcome against the golden run (masked, benign, SDC, DUE: benchmarks/outcomes.py).
So each item of each run is one injection, and the rates of SDC and DUE per bit position,
field, layer or component are shares of single-fault injections, with Wilson's interval.
Items with more than one fault (``faults:K``, K > 1) are left out of the maps: their outcome
cannot be put down to one site.
"""

from __future__ import annotations

from typing import Any

import pandas as pd

from ..benchmarks.outcomes import CAUSES
from ..benchmarks.outcomes import METRICS as OUTCOMES
from ..exceptions import KvinjectError
from .stats import proportion_ci

CAUSED = [f"due_{c}" for c in CAUSES]
# What a map can be drawn by: the fields of a recorded fault.
DIMENSIONS = ("bit", "field", "format", "layer", "kv", "head", "element", "position", "stage")
# A map's rows are also split by fault model and ECC (columns "kind" and "ecc" where any is not a
# single flip without ECC): injections of different models do not pool.


def fault_map(records: list[dict[str, Any]], by: list[str]) -> pd.DataFrame:
    """Per model, bench, stored format and value of ``by``: the single-fault injections and the
    rates of each outcome among them, with Wilson's 95% interval for SDC and DUE, and the DUE
    rate of each cause (``due_nonfinite``...; records before format 6 knew only
    non-finite logits). Every
    configuration's injections are pooled (each drew its sites uniformly from its own space;
    ``report --filter error=...`` takes one)."""
    unknown = [b for b in by if b not in DIMENSIONS]
    if not by or unknown:
        raise KvinjectError(f"--faults draws maps by {', '.join(DIMENSIONS)} (several comma-separated), got '{','.join(by)}'")
    by = [b for b in by if b != "format"]  # a column of every map: bit 14 of f16 is not bit 14 of bf16
    rows: dict[tuple, dict[str, list[float]]] = {}
    for record in records:
        faults, items = record.get("faults"), record["items"]
        if faults is None or not all(o in items for o in OUTCOMES):
            continue
        for i, sites in enumerate(faults):
            if sites is None or len(sites) != 1:
                continue
            site = {"stage": "prompt"} | sites[0]  # record formats before 5 name no stage: their faults all lay in prompts
            scheme = "secded" if "ecc" in site else "none"
            key = (record["settings"].get("model"), record["settings"]["bench"], site["format"], site.get("kind", "flip"), scheme, *(site[b] for b in by))
            outcomes = rows.setdefault(key, {o: [] for o in [*OUTCOMES, *CAUSED]})
            for o in OUTCOMES:
                outcomes[o].append(items[o][i])
            for o in CAUSED:
                outcomes[o].append(items[o][i] if o in items else items["due"][i] * (o == "due_nonfinite"))
    if not rows:
        raise KvinjectError("no single-fault injections in these records: --faults maps the runs of faults:1 (a generation bench, with its control)")
    out = []
    for key in sorted(rows, key=lambda k: tuple(map(str, k[:2])) + k[2:]):
        outcomes = rows[key]
        row: dict[str, Any] = {"model": key[0], "bench": key[1], "format": key[2], "kind": key[3], "ecc": key[4], **dict(zip(by, key[5:]))}
        row["faults"] = len(outcomes["sdc"])
        for o in [*OUTCOMES, *CAUSED]:
            row[o] = sum(outcomes[o]) / len(outcomes[o])
        for o in ("sdc", "due"):
            row[f"{o}_ci"] = list(proportion_ci(outcomes[o]))
        out.append(row)
    table = pd.DataFrame(out)
    # The fault model and ECC are columns where any fault differs from a single flip without ECC.
    return table.drop(columns=[c for c, plain in (("kind", "flip"), ("ecc", "none")) if (table[c] == plain).all()])


def readable(table: pd.DataFrame, digits: int) -> pd.DataFrame:
    """The map for reading: each interval as one 'low–high' column, the causes of DUE as one
    'cause count' column."""
    g = f".{digits}g"
    causes = [", ".join(f"{c} {round(row[f'due_{c}'] * row['faults'])}" for c in CAUSES if row[f"due_{c}"]) for _, row in table.iterrows()]
    intervals = [c for c in table.columns if c.endswith("_ci")]
    out = table.drop(columns=CAUSED).assign(**{c: [f"{lo:{g}}–{hi:{g}}" for lo, hi in table[c]] for c in intervals})
    return out.assign(due_cause=causes)


def machine(table: pd.DataFrame) -> pd.DataFrame:
    """The map for files read by programs (csv, json): each interval's bounds as two columns."""
    intervals = [c for c in table.columns if c.endswith("_ci")]
    out = table.drop(columns=intervals)
    for c in (i.removesuffix("_ci") for i in intervals):
        out.insert(out.columns.get_loc(c) + 1, f"{c}_low", [lo for lo, _ in table[f"{c}_ci"]])
        out.insert(out.columns.get_loc(c) + 2, f"{c}_high", [hi for _, hi in table[f"{c}_ci"]])
    return out
