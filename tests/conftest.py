from __future__ import annotations

import os
import shutil
import signal
from pathlib import Path

# Where no GPU is, numba's CUDA simulator runs the device kernels on the CPU (tests/test_device.py);
# it must be chosen before numba loads. perf/gpu.sh sets 0 on a GPU machine.
if shutil.which("nvidia-smi") is None:
    os.environ.setdefault("NUMBA_ENABLE_CUDASIM", "1")

# A shell starts a background job (`nohup pytest &`, a script's `&`) with Ctrl-C ignored, and the
# commands the tests start would inherit that: the tests that press Ctrl-C need it delivered.
if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)

import pytest

from kvinject.engine.model import Model, resolve_model

from .cli_tree import no_work  # noqa: F401  (a fixture: the tests of outputs and lists)
from .tiny_model import write_tiny_model

SHARED = Path(__file__).resolve().parents[2] / "shared"


@pytest.fixture(scope="session")
def default_model_path() -> Path:
    return resolve_model(None)


@pytest.fixture(scope="session")
def tiny_path(tmp_path_factory: pytest.TempPathFactory, default_model_path: Path) -> Path:
    return write_tiny_model(tmp_path_factory.mktemp("models") / "tiny-llama.gguf", default_model_path)


@pytest.fixture(scope="session")
def tiny(tiny_path: Path) -> Model:
    with Model(str(tiny_path)) as model:
        yield model


@pytest.fixture(scope="session")
def smollm(default_model_path: Path) -> Model:
    with Model(str(default_model_path)) as model:
        yield model
