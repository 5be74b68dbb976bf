"""The document one ``kvinject run`` writes (``--output``), and its records as a results store
holds them, so that ``kvinject report`` reads a run's file as it reads a sweep's store."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..benchmarks.base import Benchmark, RunResult
from ..engine.realized_error import Realized, RealizedStats
from ..error_models.configuration import Configuration
from ..exceptions import KvinjectError
from ..experiments.grid import settings_key
from ..experiments.schemas import run_file


@dataclass
class RunOutput:
    """Everything one ``kvinject run`` produced, as its ``--output`` JSON holds it: settings, one
    record per (bench, config, run), and the aggregates per (bench, config, metric). The
    records are a results store's (kvinject/experiments/runner.py: records)."""

    meta: dict[str, object]
    records: list[dict[str, Any]] = field(default_factory=list)
    benches: dict[str, Benchmark] = field(default_factory=dict)
    interrupted: bool = False

    def aggregates(self) -> list[dict[str, object]]:
        # Imported here: its statistics import scipy.stats (60 MB), which a run made with this
        # output in hand would otherwise hold through every decode (its peak memory).
        from .aggregate import aggregate

        out = []
        for name, bench in self.benches.items():
            out += aggregate(bench, [record_result(r) for r in self.records if r["settings"]["bench"] == name])
        return out

    def to_dict(self) -> dict[str, object]:
        return {
            "meta": {**self.meta, "interrupted": self.interrupted},
            "records": [{k: v for k, v in r.items() if k not in ("cell", "settings")} for r in self.records],
            "aggregates": self.aggregates(),
        }


def record_result(record: dict[str, Any]) -> RunResult:
    """A stored record (:meth:`Store.records`) as the run it was, for :func:`aggregate`: its
    configuration, metrics, per-item values, and how many values the error changed (what
    changed_nothing reads of its realized statistics). A metric stored as null is NaN again."""
    s = record["settings"]
    config = Configuration.from_dict(s)
    realized = Realized(*(RealizedStats(values=r.get("values", 0), changed=r.get("changed", 0)) for r in (record["realized"].get(c, {}) for c in "kv")))
    return RunResult(
        s["bench"],
        config,
        record["run"],
        {k: (float("nan") if v is None else v) for k, v in record["metrics"].items()},
        {k: [float("nan") if x is None else x for x in v] for k, v in record["items"].items()},
        realized,
        record["nonfinite_items"],
    )


def output_records(path: Path) -> list[dict[str, Any]]:
    """The records of a ``kvinject run --output`` file, each with the settings a sweep stores
    beside it (:meth:`kvinject.experiments.sweep.Sweep._evaluate`): the model by content, the
    bench's options, the configuration, the seed, and whether it is the control (the first
    configuration). Its cell key is the store's (:func:`settings_key`), so a file given twice counts once."""
    if not Path(path).is_file():
        raise KvinjectError(f"no run output at {path}")
    try:
        data = json.loads(Path(path).read_text())
        run_file(path, data)
        meta, records = data["meta"], data["records"]
        configs = {c["label"]: {k: v for k, v in c.items() if k != "label"} for c in meta["configurations"]}
        control = meta["configurations"][0]["label"]
    except (OSError, UnicodeDecodeError, json.JSONDecodeError, KeyError, IndexError, TypeError) as e:
        raise KvinjectError(f"{path}: not a file written by kvinject run --output ({type(e).__name__}: {e})") from None
    out = []
    for record in records:
        settings = {
            "model_sha256": meta["model_sha256"],
            "bench": record["bench"],
            "options": dict(sorted(meta["options"][record["bench"]].items())),  # as a store's JSON keeps them
            **configs[record["label"]],
            "seed": meta["seed"],
        }
        cell = settings_key(settings)
        settings |= {"model": meta["model"], "control": record["label"] == control, "label": record["label"]}
        out.append({"cell": cell, "run": record["run"], "settings": settings, **record})
    return out
