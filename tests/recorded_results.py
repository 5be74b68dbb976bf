"""The three original benchmarks' results on the tiny model in a canonical JSON form, to hold the
benchmark code's results bit-identical across refactors (test_recorded_results.py).

``python -m tests.recorded_results OUT.json`` records them with the code at hand.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from kvinject.benchmarks import make_bench
from kvinject.engine.model import Model, versions
from kvinject.error_models.configuration import Configuration
from kvinject.experiments.runner import run

FIXTURES = Path(__file__).resolve().parent / "fixtures"
BENCHES = {
    "ifeval": {"data": str(FIXTURES / "ifeval/input_data.jsonl"), "max_tokens": 12},
    "nexttoken": {"limit": 8},
    "perplexity": {"chunks": 3, "ctx": 64},
}
CONFIGS = ["none", "normal:0,0.5", "signflip:0.05", "quant:4", "none@q8_0"]


def record(model: Model) -> dict[str, object]:
    out: dict[str, object] = {"system": versions()["llama_cpp_system"], "results": []}
    benches = [make_bench(name, dict(options)) for name, options in BENCHES.items()]
    configs = [Configuration.parse(c) for c in CONFIGS]
    for r in run(model, benches, configs, runs=2, seed=7):
        record = r.to_dict()
        record.pop("seconds")
        out["results"].append(record)
    out["settings"] = {b.name: {k: v for k, v in b.settings.items() if k != "data"} for b in benches}  # data: a path
    # Through JSON so that the comparison is of what a results file holds (NaN included).
    return json.loads(json.dumps(out, default=str), parse_constant=str)  # NaN as "NaN": comparable


if __name__ == "__main__":
    from kvinject.engine.model import resolve_model

    from .tiny_model import write_tiny_model

    tiny = write_tiny_model(Path(sys.argv[1]).with_suffix(".gguf"), resolve_model(None))
    with Model(str(tiny)) as model:
        Path(sys.argv[1]).write_text(json.dumps(record(model), indent=1, sort_keys=True) + "\n")
