"""The device kernel launched by the compiled graph callback at a claim, with no call into Python
(kvinject/engine/gpu/device.py's ClaimTable), tested where there is no GPU: a stand-in for the driver,
compiled here from a few C functions with the signatures of ``cuLaunchKernel`` and
``cuStreamSynchronize``, records every launch (kernel, grid, block, stream, parameter slots and
the values the tensor slot points to) and every synchronization; the CPU backend's buffers are
presented to the callback as the first CUDA device's memory; the tiny model's real decodes then
claim K and V as on a GPU. What the kernel computes is tested value for value in test_device.py."""

from __future__ import annotations

import ctypes
import subprocess
import sys

import numpy as np
import pytest

from kvinject.engine.callback import device_launch
from kvinject.engine.callback import graph_header as gh
from kvinject.engine.context import Context
from kvinject.engine.model import Model
from kvinject.engine.options import BackendOptions, CacheOptions
from kvinject.error_models import parse_error
from kvinject.exceptions import HookError, InjectionError

from .cache_state import read_cache

cuda = pytest.importorskip("numba.cuda", reason="numba's CUDA target (pip install numba-cuda)")
device_kernels = pytest.importorskip("kvinject.engine.gpu.device_kernels")
pytestmark = pytest.mark.filterwarnings("ignore:overflow encountered:RuntimeWarning")

STUB = r"""
#include <stdint.h>
#include <string.h>
enum { MAX_LAUNCHES = 4096, MAX_SLOTS = 128 };
typedef struct {
    uint64_t function, stream;
    uint32_t grid[3], block[3], shared;
    int64_t slots[MAX_SLOTS];
    int64_t values_at;  /* where the tensor's values went in the capture, -1: not captured */
} launch_t;
static launch_t launches[MAX_LAUNCHES];
static int64_t n_launches, n_syncs, n_slots, data_slot = -1, size_slot = -1;
static uint64_t recorded, last_synced;  /* the kernel whose parameters are recorded */
static float *capture;
static int64_t capture_cap, captured;

void configure(uint64_t function, int64_t slots, int64_t data, int64_t size, float *buffer, int64_t cap) {
    recorded = function; n_slots = slots; data_slot = data; size_slot = size; capture = buffer; capture_cap = cap;
    n_launches = n_syncs = captured = 0;
}
int cuLaunchKernel(void *f, unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned by, unsigned bz,
                   unsigned shared, void *stream, void **params, void **extra) {
    if (n_launches >= MAX_LAUNCHES || extra != 0) return 1;
    if ((uint64_t)f == 0xBAD) return 700;  /* CUDA_ERROR_ILLEGAL_ADDRESS */
    launch_t *l = &launches[n_launches++];
    l->function = (uint64_t)f; l->stream = (uint64_t)stream; l->shared = shared;
    l->grid[0] = gx; l->grid[1] = gy; l->grid[2] = gz; l->block[0] = bx; l->block[1] = by; l->block[2] = bz;
    l->values_at = -1;
    if ((uint64_t)f != recorded) return 0;
    for (int64_t i = 0; i < n_slots && i < MAX_SLOTS; i++) l->slots[i] = *(int64_t *)params[i];
    {
        int64_t n = l->slots[size_slot];
        if (captured + n <= capture_cap && l->slots[data_slot] != 0) {
            memcpy(capture + captured, (const float *)l->slots[data_slot], n * sizeof(float));
            l->values_at = captured;
            captured += n;
        }
    }
    return 0;
}
int cuStreamSynchronize(void *stream) { n_syncs++; last_synced = (uint64_t)stream; return 0; }
int64_t count_launches(void) { return n_launches; }
int64_t count_syncs(void) { return n_syncs; }
uint64_t synced_stream(void) { return last_synced; }
const launch_t *launch_at(int64_t i) { return &launches[i]; }
_Bool not_host(void *buffer) { return 0; }
const char *cuda0(void *buffer) { return "CUDA0 (stand-in)"; }
"""


class LaunchRecord(ctypes.Structure):
    _fields_ = [
        ("function", ctypes.c_uint64),
        ("stream", ctypes.c_uint64),
        ("grid", ctypes.c_uint32 * 3),
        ("block", ctypes.c_uint32 * 3),
        ("shared", ctypes.c_uint32),
        ("slots", ctypes.c_int64 * 128),
        ("values_at", ctypes.c_int64),
    ]


CHANGE, FOLD, STREAM = 0xC4A6E, 0xF01D, 0x57EA  # the stand-in handles of the two kernels and the stream


@pytest.fixture(scope="module")
def stub(tmp_path_factory):
    folder = tmp_path_factory.mktemp("driver")
    (folder / "driver.c").write_text(STUB)
    try:
        subprocess.run(["cc", "-shared", "-fPIC", "-O1", "-o", str(folder / "driver.so"), str(folder / "driver.c")], check=True, capture_output=True)
    except (OSError, subprocess.CalledProcessError) as e:
        pytest.skip(f"no C compiler for the stand-in driver: {e}")
    lib = ctypes.CDLL(str(folder / "driver.so"))
    lib.configure.argtypes = [ctypes.c_uint64] + [ctypes.c_int64] * 3 + [ctypes.c_void_p, ctypes.c_int64]
    lib.launch_at.restype = ctypes.POINTER(LaunchRecord)
    lib.count_launches.restype = lib.count_syncs.restype = ctypes.c_int64
    lib.synced_stream.restype = ctypes.c_uint64
    return lib


@pytest.fixture(scope="module")
def tiny_cpu(tiny_path):
    """The tiny model on the CPU, also where llama.cpp has a GPU: the stand-in reads the values it is launched on."""
    with Model(str(tiny_path), BackendOptions(n_gpu_layers=0)) as model:
        yield model


def _address(lib, name: str) -> int:
    return ctypes.cast(getattr(lib, name), ctypes.c_void_p).value


@pytest.fixture
def stand_in(stub, monkeypatch):
    """Launchers that go to the stand-in driver with the stand-in handles, and the CPU's buffers
    shown to the hook as the first CUDA device's."""
    driver = device_launch.Driver(_address(stub, "cuLaunchKernel"), _address(stub, "cuStreamSynchronize"))
    handles = {id(device_kernels.change): CHANGE, id(device_kernels.fold): FOLD}
    monkeypatch.setattr(device_launch, "launcher", lambda kernel, args, stream: device_launch.Launcher(handles[id(kernel)], args, STREAM, driver))
    capture = np.zeros(1 << 22, np.float32)

    def present(ctx):
        head = ctx.hook.header
        head[gh.IS_HOST], head[gh.BUFFER_NAME] = _address(stub, "not_host"), _address(stub, "cuda0")
        slots = device_launch.ARRAY_SLOTS * 10 + 3  # the change kernel's (13 arguments, 10 of them arrays)
        stub.configure(CHANGE, slots, device_launch.DATA, device_launch.SIZE, capture.ctypes.data, capture.size)

    return present, capture


def _launches(stub) -> list[LaunchRecord]:
    return [stub.launch_at(i).contents for i in range(stub.count_launches())]


class PythonFrames:
    """Python functions entered while llama_decode runs (calls from llama.cpp into Python)."""

    def __init__(self, monkeypatch):
        from llama_cpp import llama_cpp as ll

        self.per_decode: list[int] = []
        real = ll.llama_decode

        def counted(*args):
            self._n = 0
            sys.setprofile(self._profile)
            try:
                return real(*args)
            finally:
                sys.setprofile(None)
                self.per_decode.append(self._n)

        monkeypatch.setattr(ll, "llama_decode", counted)

    def _profile(self, frame, event, arg):
        if event == "call":
            self._n += 1


@pytest.mark.parametrize("spec", ["normal:0,0.25", "quant:4", "bitflip:0.01,format=f16"])
def test_each_claim_launches_the_kernel_from_compiled_code_on_what_reaches_the_cache(tiny_cpu, stub, stand_in, monkeypatch, spec):
    present, capture = stand_in
    error = parse_error(spec)
    ctx = Context(tiny_cpu, CacheOptions("f32", "f32", "on"), error)
    present(ctx)
    frames = PythonFrames(monkeypatch)
    prompt = tiny_cpu.tokenize("The quick brown fox jumps over the lazy dog")
    steps = 4
    ctx.begin_item(0, 0, len(prompt), steps)
    ctx.prefill(prompt)
    for i in range(steps):
        ctx.decode([(prompt[-1], len(prompt) + i, 0, True)])
    decodes = 1 + steps
    layers, row = tiny_cpu.n_layer, {"k": tiny_cpu.n_head_kv * tiny_cpu.head_dim_k, "v": tiny_cpu.n_head_kv * tiny_cpu.head_dim_v}

    launches = _launches(stub)
    change = [launch for launch in launches if launch.function == CHANGE]
    assert sum(launch.function == FOLD for launch in launches) == decodes
    assert len(change) == decodes * 2 * layers, "one launch a claimed K or V"
    # The first claim sets the device path up from Python; from then on no Python runs inside a decode.
    assert frames.per_decode[0] > 0, "the counter sees the first decode's call into Python"
    assert frames.per_decode[1:] == [0] * steps
    assert stub.count_syncs() == decodes * layers - 1 and stub.synced_stream() == STREAM, "one wait a claim after the first"

    values = {}
    device = ctx.hook._device
    table, span = device.claims.table, device.span
    x, at_slot = table[gh.D_X], table[gh.D_AT]
    acc = device._launch["k"].offset[-1] + device_launch.DATA  # the sums' array tells the component
    component = {int(device._launch[c].slots[acc]): c for c in "kv"}
    for d in range(decodes):
        rows = len(prompt) if d == 0 else 1
        at, seen = 0, {"k": 0, "v": 0}
        for launch in change[d * 2 * layers : (d + 1) * 2 * layers]:
            c = component[launch.slots[acc]]
            n = rows * row[c]
            assert (launch.stream, launch.shared, tuple(launch.block)) == (STREAM, 0, (device_kernels.THREADS, 1, 1))
            assert tuple(launch.grid) == (max(1, -(-(n // span) // device_kernels.THREADS)), 1, 1)
            assert launch.slots[x + device_launch.SIZE] == launch.slots[x + device_launch.SHAPE] == n
            assert launch.slots[x + device_launch.ARRAY_SLOTS - 1] == 4, "float32 strides"
            assert launch.slots[at_slot] == at, "where this site's noise starts in the decode's rows"
            at += row[c]
            values.setdefault((c, seen[c]), []).append(capture[launch.values_at : launch.values_at + n].reshape(rows, row[c]))
            seen[c] += 1
        assert seen == {"k": layers, "v": layers}
    # The tensor each launch names holds what reaches the cache (the stand-in changes nothing).
    cache = read_cache(ctx)
    for (c, il), launched in values.items():
        np.testing.assert_array_equal(np.concatenate(launched), cache[c, il][: len(prompt) + steps])
    # What the callback counted reaches the realized statistics.
    summary = ctx.realized.summary()
    for c in "kv":
        assert summary[c]["values"] == (len(prompt) + steps) * row[c] * layers
    ctx.close()


def test_a_failed_launch_ends_the_decode_with_the_drivers_error(tiny_cpu, stub, stand_in):
    present, _ = stand_in
    ctx = Context(tiny_cpu, CacheOptions("f32", "f32", "on"), parse_error("normal:0,0.25"))
    present(ctx)
    prompt = tiny_cpu.tokenize("The quick brown fox")
    ctx.begin_item(0, 0, len(prompt), 2)
    ctx.prefill(prompt)
    ctx.hook._device.claims.table[gh.D_FUNCTION] = 0xBAD
    with pytest.raises(InjectionError, match="CUDA error 700") as raised:
        ctx.decode([(prompt[-1], len(prompt), 0, True)])
    assert not isinstance(raised.value, HookError), "the driver's failure is not the item's (fault campaigns count HookError as a DUE)"
    ctx.close()
