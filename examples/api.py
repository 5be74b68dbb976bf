"""kvinject from Python: the same API the command line calls.

Scores the next-token bench under the control, Gaussian noise and llama.cpp's q8_0 cache, in
memory and then as a grid into a results store, and prints the report's table.

    python examples/api.py [MODEL] [STORE]

MODEL: a bundled name, a GGUF file or hf:OWNER/REPO/FILE.gguf (default: smollm2); STORE: the
results store to write (default: api.results.sqlite here; run again, it finds nothing left).
"""

import sys
from pathlib import Path

import kvinject

model_spec = sys.argv[1] if len(sys.argv) > 1 else "smollm2"
store_path = Path(sys.argv[2] if len(sys.argv) > 2 else "api.results.sqlite")

# In memory: run a bench under configurations, then the statistics against the control.
with kvinject.Model(model_spec) as model:
    configs = kvinject.configurations("none", ["normal:0,0.25", "none@q8_0"])
    bench = kvinject.make_bench("nexttoken", {"limit": 20})
    results = list(kvinject.run(model, [bench], configs, runs=2, seed=0))
for row in kvinject.aggregate(bench, results):
    if row["metric"] == bench.primary:
        print(f"{row['configuration']:<16} {bench.primary} {row['mean']:.3f}  {row['percent_of_control']:.1f}% of control")

# Into a store: a grid (the structure of a grid file), resumable like `kvinject sweep`.
grid = kvinject.build_grid(
    store_path,
    {
        "sweep": {"models": [model_spec], "runs": 2},
        "bench": {"nexttoken": {"limit": 20}},
        "cells": [{"error": "normal:0,0.25"}, {"error": "none@q8_0"}],
    },
)
with kvinject.Store(store_path) as store:
    written = kvinject.Sweep(grid, store).run()
print(f"{written} runs written to {store_path}")
table = kvinject.study_table(kvinject.summarize(kvinject.load_records([store_path])))
print(table[["bench", "configuration", "score", "% control", "p"]].to_string(index=False))
