"""kvinject: inject controlled error into the KV cache of llama.cpp models.

The Python API, the one the command line calls (examples/api.py runs it end to end)::

    import kvinject

    with kvinject.Model("smollm2") as model:                       # a bundled name, a GGUF path or hf:
        configs = kvinject.configurations("none", ["normal:0,0.25", "none@q8_0"])
        bench = kvinject.make_bench("nexttoken", {"limit": 20})
        results = list(kvinject.run(model, [bench], configs, runs=2))
    rows = kvinject.aggregate(bench, results)                       # statistics against the control

A grid (``kvinject.build_grid`` from a dict, ``kvinject.load_grid`` from TOML) runs into a store
with ``kvinject.Sweep(grid, store).run()``; ``kvinject.load_records`` reads stores back and
``kvinject.summarize`` and ``kvinject.study_table`` make the report's tables.
"""

import importlib
import os

# Before numpy loads: BLAS worker threads that spin after a call compete with llama.cpp's
# threads for the cores; kvinject's numpy work is small and runs between decodes.
for _var in ("OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_var, "1")

__version__ = "0.2.0"  # the one source: pyproject.toml reads it; CONTRIBUTING.md says how a release is made

# name -> module: loaded when first used, so that `import kvinject` (and the command's start) stays light.
_API = {
    "Model": "kvinject.engine.model",
    "Target": "kvinject.engine.target",
    "CacheOptions": "kvinject.engine.options",
    "BackendOptions": "kvinject.engine.options",
    "Configuration": "kvinject.error_models.configuration",
    "configurations": "kvinject.error_models.configuration",
    "parse_error": "kvinject.error_models",
    "make_bench": "kvinject.benchmarks",
    "run": "kvinject.experiments.runner",
    "build_grid": "kvinject.experiments.grid",
    "load_grid": "kvinject.experiments.grid",
    "Store": "kvinject.experiments.store",
    "Sweep": "kvinject.experiments.sweep",
    "aggregate": "kvinject.analysis.aggregate",
    "load_records": "kvinject.analysis.report",
    "summarize": "kvinject.analysis.report",
    "study_table": "kvinject.analysis.report",
}
__all__ = ["__version__", *_API]


def __getattr__(name: str) -> object:
    if name not in _API:
        raise AttributeError(f"module 'kvinject' has no attribute '{name}'")
    return getattr(importlib.import_module(_API[name]), name)


def __dir__() -> list[str]:
    return sorted(__all__)
