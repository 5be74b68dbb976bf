"""The device path (kvinject/engine/gpu/device.py): its kernel against the host's computation, value for
value, under numba's CUDA simulator where no GPU is (conftest.py sets NUMBA_ENABLE_CUDASIM), on
the GPU where one is; and, with a CUDA build of llama.cpp, the hook on offloaded layers against
the copy it replaces."""

from __future__ import annotations

import numpy as np
import pytest
from numba import config as numba_config
from numba import njit

from kvinject.engine import laws
from kvinject.engine.callback import graph_callback
from kvinject.engine.gpu import float_encodings
from kvinject.engine.realized_error import RealizedStats
from kvinject.error_models import parse_error
from kvinject.error_models.bitflip import FORMATS

cuda = pytest.importorskip("numba.cuda", reason="numba's CUDA target (pip install numba-cuda)")
device_kernels = pytest.importorskip("kvinject.engine.gpu.device_kernels")
device_launch = pytest.importorskip("kvinject.engine.callback.device_launch")

# The simulator runs each thread as Python, where numpy warns of the uint64 hashes' wrapping.
pytestmark = pytest.mark.filterwarnings("ignore:overflow encountered:RuntimeWarning")
ROW = 64
SUM_FIELDS = 10


@njit
def _map(fn_id, u):
    out = np.empty(u.size, np.uint32)
    for i in range(u.size):
        if fn_id == 0:
            out[i] = float_encodings.to_f16(u[i])
        elif fn_id == 1:
            out[i] = float_encodings.from_f16(u[i])
        else:
            out[i] = float_encodings.to_bf16(u[i])
    return out


def _float32_patterns(n: int) -> np.ndarray:
    """Random float32 bits, every exponent alike, and the edges of fp16's ranges with their neighbours."""
    rng = np.random.default_rng(0)
    edges = np.array([0x33000000, 0x33800000, 0x38800000, 0x387FE000, 0x477FE000, 0x477FF000, 0x47800000, 0x7F800000, 0x7FC00001, 0x7F802000])
    near = (edges[:, None] + np.arange(-4100, 4100)[None, :]).ravel() & 0x7FFFFFFF
    u = np.concatenate([rng.integers(0, 2**32, n, dtype=np.uint64), near, near | 0x80000000]).astype(np.uint32)
    return u


def test_fp16_and_bf16_encodings_are_numpys_and_ggmls_bit_for_bit():
    u = _float32_patterns(2_000_000)
    x = u.view(np.float32)
    with np.errstate(over="ignore"):
        expected = x.astype(np.float16).view(np.uint16)
    np.testing.assert_array_equal(_map(0, u), expected)
    halves = np.arange(2**16, dtype=np.uint32)
    np.testing.assert_array_equal(_map(1, halves), halves.astype(np.uint16).view(np.float16).astype(np.float32).view(np.uint32))
    np.testing.assert_array_equal(_map(2, u), FORMATS["bf16"].encode(x))


def _rows(n_rows: int, seed: int = 1) -> np.ndarray:
    rng = np.random.default_rng(seed)
    x = (rng.standard_normal((n_rows, ROW)) * rng.choice([1e-3, 1, 30], (n_rows, 1))).astype(np.float32)
    x[0, :3] = [0.0, -0.0, 1e-8]
    return x


def _launch(x: np.ndarray, law: tuple, segments=((0, 0, None),), at=0, flips=None, mask=None, columns=None, span=1, via=None) -> np.ndarray:
    """Run the kernel on a copy of ``x`` (through the launcher ``via`` gives for the arguments, or
    as the hook launches it); its values and its sums in the host's layout."""
    rows = x.shape[0]
    segs = [(key, start, rows if n is None else n) for key, start, n in segments]
    first = np.cumsum([0] + [n for _, _, n in segs[:-1]]).astype(np.int64)
    d = cuda.to_device(x.ravel().copy())
    acc = cuda.to_device(np.zeros(device_kernels.N_ACC))
    args = [
        d,
        span,
        ROW,
        at,
        cuda.to_device(np.array([*law, *[0.0] * (laws.SLOTS - len(law))], np.float64)),
        cuda.to_device(first),
        cuda.to_device(np.array([k for k, _, _ in segs], np.uint64)),
        cuda.to_device(np.array([s for _, s, _ in segs], np.int64)),
        cuda.to_device(np.array([n for _, _, n in segs], np.int64)),
        cuda.to_device(np.zeros(0, np.uint32) if flips is None else flips.astype(np.uint32)),
        cuda.to_device(np.zeros(0, np.uint8) if mask is None else mask.astype(np.uint8)),
        cuda.to_device(np.zeros(0, np.uint8) if columns is None else columns.astype(np.uint8)),
        acc,
    ]
    blocks = -(-x.size // span // device_kernels.THREADS)
    stream = cuda.default_stream()
    args = tuple(args)
    (via(args) if via else device_launch.launcher(device_kernels.change, args, stream))(blocks, device_kernels.THREADS)
    stream.synchronize()
    return d.copy_to_host().reshape(x.shape), acc.copy_to_host()


def _host_native(x: np.ndarray, law: tuple, segments, at=0, mask=None, columns=None):
    """The compiled callback's pass over host memory (graph_callback._change)."""
    y = x.copy()
    sums, outside = np.zeros(SUM_FIELDS), np.zeros(SUM_FIELDS)
    rows = x.shape[0]
    segs = [(key, start, rows if n is None else n) for key, start, n in segments]
    graph_callback._change(
        y.ravel(),
        ROW,
        at,
        np.array([k for k, _, _ in segs], np.uint64),
        np.array([s for _, s, _ in segs], np.int64),
        np.array([n for _, _, n in segs], np.int64),
        np.array([*law, *[0.0] * (laws.SLOTS - len(law))], np.float64),
        np.zeros(0, np.uint8) if mask is None else mask.astype(np.uint8),
        np.zeros(0, np.uint8) if columns is None else columns.astype(np.uint8),
        sums,
        outside,
    )
    return y, sums, outside


def _as_host_sums(acc: np.ndarray, x: np.ndarray) -> np.ndarray:
    sums = np.zeros(SUM_FIELDS)
    sums[0], sums[1], sums[2:] = x.size, 1, acc[:8]
    return sums


# Float sums in another order (a tree per block, atomic adds between blocks): equal to about the
# float64 rounding of a few hundred terms; counts are exact.
SUM_RTOL = 1e-12


@pytest.mark.parametrize("spec", ["normal:0,0.25", "uniform:-0.1,0.1", "signflip:0.3", "float:e4m3", "float:e2m1,block=32"])
def test_native_laws_give_the_hosts_values_bit_for_bit_and_its_sums(spec):
    law = parse_error(spec).law
    x = _rows(6)
    segments = [(0x0123456789ABCDEF, 17, 2), (0xFEDCBA9876543210, 5, 4)]
    mask = np.array([1, 0, 1, 1, 0, 1])
    columns = (np.arange(ROW) % 3 != 0).astype(np.uint8)
    span = int(law[4]) if law[0] == laws.ROUND and law[4] > 0 else 1
    for kwargs in ({}, {"mask": mask, "columns": columns}):
        host, sums, outside = _host_native(x, law, segments, at=3 * ROW, **kwargs)
        dev, acc = _launch(x, law, segments, at=3 * ROW, span=span, **kwargs)
        np.testing.assert_array_equal(dev.view(np.uint32), host.view(np.uint32))
        np.testing.assert_allclose(_as_host_sums(acc, x), sums, rtol=SUM_RTOL)
        if kwargs:
            np.testing.assert_allclose(acc[8:], outside[[0, 3, 4, 8]], rtol=SUM_RTOL)
            assert acc[8] == (~np.outer(mask, columns).astype(bool)).sum()


@pytest.mark.parametrize("spec", ["quant:4", "quant:8,group=16", "mantissa:3", "bitflip:0.05", "bitflip:0.05,format=bf16", "bitflip:0.05,format=f32"])
def test_the_device_kinds_give_the_models_values_bit_for_bit(spec):
    model = parse_error(spec)
    law = model.device_law
    x = _rows(5, seed=2)
    flips = model.draw(np.random.default_rng(3), x.size) if model.random else None
    host = x.copy()
    model.apply(host, type("Given", (), {"take": lambda self, n: flips})() if flips is not None else None)
    span = int(law[2]) if law[0] == laws.QUANT else 1
    dev, acc = _launch(x, law, flips=flips, span=span)
    np.testing.assert_array_equal(dev.view(np.uint32), host.view(np.uint32))
    # The hook's host path sums in float32 differences (RealizedStats.add); the device in float64:
    # equal to float32's precision.
    stats = RealizedStats()
    stats.add(model.unchanged(x), host)
    np.testing.assert_allclose(acc[[0, 1, 2, 5]], [stats.changed, stats.nonfinite, stats.rel_n, stats.sign_flips])
    np.testing.assert_allclose(acc[[6, 7]], [stats.signal, stats.noise], rtol=1e-6)
    assert stats.changed > 0


@pytest.mark.skipif(numba_config.ENABLE_CUDASIM, reason="the driver's launch needs a GPU")
def test_launches_through_the_driver_change_what_numbas_change():
    """One launcher for every launch, as the hook keeps it: the arguments that change between
    launches (the tensor, where its noise starts, the flips) must reach the kernel each time."""
    stream = cuda.default_stream()
    model = parse_error("bitflip:0.05,format=bf16")
    launches = []
    for seed, at in ((4, 0), (5, 3 * ROW), (6, 3 * ROW)):
        x = _rows(7, seed)
        launches.append((x, model.draw(np.random.default_rng(seed), 11 + (at + ROW) * 7), at))  # the stream's values to the last read
    for law, flipping in ((parse_error("normal:0,0.25").law, False), (model.device_law, True)):
        kept = []

        def driver(args):
            if not kept:
                kept.append(device_launch.launcher(device_kernels.change, args, stream))
                assert isinstance(kept[0], device_launch.Launcher)
            for i, a in enumerate(args):
                kept[0].put(i, a)
            return kept[0]

        for x, flips, at in launches:
            kwargs = {"flips": flips if flipping else None, "at": at, "segments": [(0x0123456789ABCDEF, 11, 7)]}
            dev, acc = _launch(x, law, via=lambda args: device_launch.NumbaLaunch(device_kernels.change, args, stream), **kwargs)
            dev_driver, acc_driver = _launch(x, law, via=driver, **kwargs)
            np.testing.assert_array_equal(dev_driver.view(np.uint32), dev.view(np.uint32))
            np.testing.assert_allclose(acc_driver, acc, rtol=SUM_RTOL)  # atomic adds: their order varies


def _device_memory(x: np.ndarray):
    """An address of a copy of ``x`` where the kernels run, and a way to read it back."""
    if numba_config.ENABLE_CUDASIM:
        y = x.copy()
        return y.ctypes.data, lambda: y
    d = cuda.to_device(x)
    return d.device_ctypes_pointer.value, d.copy_to_host


def test_the_hooks_device_side_keeps_a_decodes_sums_only_when_it_finishes():
    """DeviceChange as the hook drives it: layout, a site, fold; a failed decode's sums dropped."""
    from kvinject.engine.gpu.device import DeviceChange

    law = parse_error("normal:0,0.25").law
    x = _rows(5)
    segments = [(0x0123456789ABCDEF, 11, 5)]
    host, sums, _ = _host_native(x, law, segments, at=ROW)
    change = DeviceChange(law, {"k": None, "v": None}, {"k": ROW, "v": ROW})
    results = []
    for keep in (True, False):
        address, read = _device_memory(x)
        change.layout(segments, None)
        change.change(address, 5, ROW, "k", ROW)
        change.wait()
        change.fold(keep)
        results.append(read())
    np.testing.assert_array_equal(results[0].view(np.uint32), host.view(np.uint32))
    totals, _ = change.totals(selective=False)
    np.testing.assert_allclose(totals[0], sums, rtol=SUM_RTOL)
    assert not totals[1].any()


def _llama_on_gpu() -> bool:
    from kvinject.engine import ggml

    return not numba_config.ENABLE_CUDASIM and any(d["type"] == "GPU" for d in ggml.devices())


@pytest.mark.skipif(not _llama_on_gpu(), reason="needs a GPU and llama.cpp built with CUDA (perf/gpu.sh)")
@pytest.mark.parametrize("spec", ["normal:0,0.25", "signflip:0.1", "float:e4m3,block=32", "quant:4", "mantissa:5", "bitflip:0.01,format=f32"])
def test_offloaded_kv_changed_on_the_device_is_what_the_copy_gave(tiny, spec, monkeypatch):
    """Same graph, same GPU kernels before the hook: the cache, every logit and the realized
    error must come out as when the hook copies K/V to the host and back."""
    from kvinject.engine.gpu import device

    from .cache_state import read_cache
    from .test_hook import F32, run

    assert tiny.n_gpu_layers != 0
    kernels, ctx_kernels = run(tiny, spec, F32)
    assert ctx_kernels.hook._device is not None and ctx_kernels.hook._device.totals(False)[0][:, 1].all(), "K and V sites went through the kernels"
    monkeypatch.setattr(device, "usable", lambda: False)
    copied, ctx_copied = run(tiny, spec, F32)
    assert ctx_copied.hook._device is None
    np.testing.assert_array_equal(kernels, copied)
    a, b = read_cache(ctx_kernels), read_cache(ctx_copied)
    for site in a:
        np.testing.assert_array_equal(a[site].view(np.uint32), b[site].view(np.uint32))
    for c in "kv":
        got, want = getattr(ctx_kernels.realized, c), getattr(ctx_copied.realized, c)
        assert (got.values, got.sites, got.changed, got.nonfinite, got.rel_n) == (want.values, want.sites, want.changed, want.nonfinite, want.rel_n)
        np.testing.assert_allclose([got.signal, got.noise], [want.signal, want.noise], rtol=1e-6)  # float32 vs float64 differences (test above)
    ctx_kernels.close()
    ctx_copied.close()


def test_bit_flips_of_several_items_go_to_the_device_once_a_decode_laid_out_as_their_streams():
    """FLIP's masks are uploaded at the decode's layout, each item's from its first value on: every
    site's rows take the masks that DecodeNoise.take gives them on the host."""
    from kvinject.engine.gpu.device import DeviceChange
    from kvinject.engine.variates import DecodeNoise

    model = parse_error("bitflip:0.05,format=bf16")
    rows, width = (2, 3), 2 * ROW  # two items in one decode; K and V of one layer
    rng = np.random.default_rng(7)
    blocks = [(model.draw(rng, r * width), r) for r in rows]
    noise = DecodeNoise(blocks)
    starts = np.cumsum([0, *(len(b) for b, _ in blocks[:-1])])
    change = DeviceChange(model.device_law, {"k": None, "v": None}, {"k": ROW, "v": ROW})
    change.layout([(0, int(s), r) for s, (_, r) in zip(starts, blocks)], None, np.concatenate([b for b, _ in blocks]))
    for component, at, seed in (("k", 0, 8), ("v", ROW, 9)):
        x = _rows(sum(rows), seed)
        address, read = _device_memory(x)
        change.change(address, sum(rows), ROW, component, at)
        change.wait()
        noise.at = at
        host = x.copy()
        model.apply(host, type("Given", (), {"take": lambda self, n: noise.take(n)})())
        np.testing.assert_array_equal(read().reshape(x.shape).view(np.uint32), host.view(np.uint32))
        assert (host != x).any()
