"""Replay one recorded fault alone: one item of one run of a fault campaign, decoded again.

An item's faults are drawn from a stream seeded by (seed, run, item) and land where they land
whatever else shares its decodes, so its run's configuration decoding that item by itself draws
the same faults and, on the same build and CPU, gives the same tokens and outcome. ``faults:K,
only=J`` draws all K as the run did and keeps the J-th: that fault without the others.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

from ..benchmarks import make_bench
from ..benchmarks.base import GenerationBenchmark
from ..benchmarks.outcomes import METRICS as OUTCOMES
from ..benchmarks.outcomes import classify
from ..engine.generation.batching import generate_all
from ..engine.model import Model, file_sha256, resolve_model
from ..error_models.configuration import Configuration
from ..exceptions import KvinjectError
from ..record_format import unstamped
from .executor import generation_context


@dataclass(frozen=True)
class Replayed:
    """A recorded item and its replay: the faults, tokens and outcome of each."""

    label: str
    run: int
    item: int
    recorded_faults: list[dict[str, Any]]
    faults: list[dict[str, Any]]
    recorded_tokens: list[int]
    tokens: list[int]
    recorded_outcome: str | None  # None where the item's recorded faults were not replayed alone
    outcome: str

    @property
    def same(self) -> bool:
        """The replay landed the faults it replays where the record says and gave its tokens (and
        outcome, where it replays all of the item's faults)."""
        if self.recorded_outcome is None:
            return self.faults == self.recorded_faults
        return self.faults == self.recorded_faults and self.tokens == self.recorded_tokens and self.outcome == self.recorded_outcome


def replay(record: dict[str, Any], control: dict[str, Any], item: int, fault: int | None = None, model_path: str | None = None) -> Replayed:
    """Decode item ``item`` of ``record``'s run again with its configuration (with ``fault``,
    only that one of its faults), and classify it against ``control``, the golden run of its
    experiment. ``model_path``: where the model file is now, if not where the record says."""
    s = record["settings"]
    bench = make_bench(s["bench"], s["options"])
    if not isinstance(bench, GenerationBenchmark):
        raise KvinjectError(f"a replay decodes one item of a generation bench again, and {s['bench']} is not one")
    faults = record.get("faults") or []
    recorded = faults[item] if item < len(faults) else None
    if recorded is None:
        raise KvinjectError(f"item {item} of {record['label']} run {record['run']} recorded no faults: give an item of a faults:K run below {len(bench)}")
    config = Configuration.from_dict(s)
    if fault is not None:
        if not config.error.placed:
            raise KvinjectError(f"--fault picks one of the faults of a faults:K run, and {config.label} places none")
        if not 0 <= fault < len(recorded):
            raise KvinjectError(f"item {item} recorded {len(recorded)} faults: give --fault 0..{len(recorded) - 1}")
        config = replace(config, error=replace(config.error, only=fault))
        recorded = [recorded[fault]]
    golden = bench.golden(control)  # its tokens and scores, as the run classified against them
    if golden is None:
        raise KvinjectError(
            f"the control of {record['label']} has no generated tokens ({unstamped(2)}): no outcomes to replay; run the campaign again into a new store"
        )
    path = resolve_model(model_path or s.get("model"))
    if file_sha256(path) != s["model_sha256"]:
        raise KvinjectError(f"{path} is not the model file the record was made with (its sha256 differs): give that file with --model")
    with Model(str(path)) as model:
        prompts = bench.prompts(model)
        max_tokens, per_seq = bench.limits(prompts)
        with generation_context(model, config, s["seed"], record["run"], per_seq, 1) as ctx:
            ((_, gen),) = generate_all(ctx, [prompts[item]], max_tokens, bench.temperature, stop=bench.stop(model), items=[item])
        scores = bench.summarize([bench.score(item, gen)])[1][bench.primary]
    outcomes = classify(
        [golden.outputs[item]], [golden.items[bench.primary][item]], [gen.tokens], scores, [bench.due(gen)], bench.higher_is_better[bench.primary]
    )
    whole = fault is None or len(faults[item]) == 1
    return Replayed(
        config.label,
        record["run"],
        item,
        recorded,
        gen.faults or [],
        record["outputs"][item],
        gen.tokens,
        next(o for o in OUTCOMES if record["items"][o][item]) if whole else None,
        next(o for o, v in outcomes.items() if v[0]),
    )
