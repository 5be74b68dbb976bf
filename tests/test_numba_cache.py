"""numba's cache of a function that inlines another module's: numba alone keeps running the old
inlined code after that module changes; stamped with it (kvinject/engine/callback/numba_cache.py), the function
compiles anew. Each run is a new process, as each kvinject command is."""

import subprocess
import sys

from kvinject.engine import laws
from kvinject.engine.callback import counter_rng, device_claims, device_launch, graph_callback, graph_header, graph_memory, numba_cache, rounding

HELPER = "from numba import njit\n\n\n@njit(cache=True)\ndef value():\n    return {}\n"
CALLER = """import sys

import helper
from kvinject.engine.callback import numba_cache

if {stamped}:
    numba_cache.stamp_with(__file__, [helper.__file__])

from numba import njit


@njit(cache=True)
def outer():
    return helper.value()


print(outer())
"""


def test_a_change_to_an_inlined_module_recompiles_only_a_stamped_function(tmp_path):
    (tmp_path / "helper.py").write_text(HELPER.format(1))
    for name, stamped in (("plain", False), ("stamped", True)):
        (tmp_path / f"{name}.py").write_text(CALLER.format(stamped=stamped))

    def outputs() -> list[str]:
        runs = [subprocess.run([sys.executable, tmp_path / f"{name}.py"], capture_output=True, text=True, cwd=tmp_path) for name in ("plain", "stamped")]
        assert all(r.returncode == 0 for r in runs), [r.stderr for r in runs]
        return [r.stdout.strip() for r in runs]

    assert outputs() == ["1", "1"]
    cached = {p.name.split(".")[0] for p in (tmp_path / "__pycache__").glob("*.nbi")}
    assert {"plain", "stamped"} <= cached, "both callers were cached, so the next runs load them"
    (tmp_path / "helper.py").write_text(HELPER.format(2))
    assert outputs() == ["1", "2"], "numba alone runs the stale inlined code; the stamped caller compiles anew"


def test_the_graph_callback_is_stamped_by_the_modules_it_inlines():
    stamped = graph_callback.callback._cache._impl.locator.get_source_stamp()
    inlined = [graph_header, graph_memory, rounding, counter_rng, laws, device_claims, device_launch]
    assert stamped == numba_cache.stamp([graph_callback.__file__, *(m.__file__ for m in inlined)])
