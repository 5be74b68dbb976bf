"""ctypes access to the ggml library that llama-cpp-python ships (it binds none of it).

Only what the hook, cache-resident models and ``kvinject info`` need: a tensor's header, its
data on host or device, and the list of compute devices.
"""

from __future__ import annotations

import ctypes
import pathlib
from functools import cache

import llama_cpp

from ..exceptions import ModelError

GGML_MAX_DIMS = 4
GGML_MAX_NAME = 64
GGML_TYPE_F32 = 0
GGML_TYPE_I64 = 27
GGML_OP_SET_ROWS = 42  # the op that writes K and V into the cache (checked in check_layout)
GGML_OP_ROPE = 48  # the rotary embedding, before which kvquant claims K (checked in check_layout)

# GGML type ids of the cache types llama.cpp accepts for K and V.
CACHE_TYPES = {
    "f32": 0,
    "f16": 1,
    "q4_0": 2,
    "q4_1": 3,
    "q5_0": 6,
    "q5_1": 7,
    "q8_0": 8,
    "iq4_nl": 20,
    "bf16": 30,
}
BITS_PER_VALUE = {"f32": 32, "f16": 16, "bf16": 16, "q8_0": 8.5, "q5_0": 5.5, "q5_1": 6, "q4_0": 4.5, "q4_1": 5, "iq4_nl": 4.5}


class GgmlTensor(ctypes.Structure):
    """``struct ggml_tensor`` of the ggml that llama-cpp-python 0.3.36 vendors."""

    _fields_ = [
        ("type", ctypes.c_int),
        ("buffer", ctypes.c_void_p),
        ("ne", ctypes.c_int64 * GGML_MAX_DIMS),
        ("nb", ctypes.c_size_t * GGML_MAX_DIMS),
        ("op", ctypes.c_int),
        ("op_params", ctypes.c_int32 * 16),
        ("flags", ctypes.c_int32),
        ("src", ctypes.c_void_p * 10),
        ("view_src", ctypes.c_void_p),
        ("view_offs", ctypes.c_size_t),
        ("data", ctypes.c_void_p),
        ("name", ctypes.c_char * GGML_MAX_NAME),
        ("extra", ctypes.c_void_p),
        ("padding", ctypes.c_char * 8),
    ]


NAME_OFFSET = GgmlTensor.name.offset


def _declare(lib: ctypes.CDLL, name: str, restype, *argtypes) -> None:
    fn = getattr(lib, name)
    fn.restype = restype
    fn.argtypes = list(argtypes)


@cache
def lib() -> ctypes.CDLL:
    """libggml-base, with the signatures kvinject calls declared."""
    libdir = pathlib.Path(llama_cpp.__file__).parent / "lib"
    candidates = sorted(libdir.glob("libggml-base.*")) + sorted(libdir.glob("ggml-base.dll"))
    if not candidates:
        raise ModelError(f"libggml-base not found in {libdir}: is llama-cpp-python installed correctly?")
    base = ctypes.CDLL(str(candidates[0]))
    vp, sz = ctypes.c_void_p, ctypes.c_size_t
    _declare(base, "ggml_nbytes", sz, vp)
    _declare(base, "ggml_is_contiguous", ctypes.c_bool, vp)
    _declare(base, "ggml_get_name", ctypes.c_char_p, vp)
    _declare(base, "ggml_op_desc", ctypes.c_char_p, vp)
    _declare(base, "ggml_op_name", ctypes.c_char_p, ctypes.c_int)
    _declare(base, "ggml_backend_buffer_is_host", ctypes.c_bool, vp)
    _declare(base, "ggml_backend_buffer_name", ctypes.c_char_p, vp)
    _declare(base, "ggml_backend_tensor_get", None, vp, vp, sz, sz)
    _declare(base, "ggml_backend_tensor_set", None, vp, vp, sz, sz)
    _declare(base, "ggml_backend_dev_name", ctypes.c_char_p, vp)
    _declare(base, "ggml_backend_dev_description", ctypes.c_char_p, vp)
    _declare(base, "ggml_backend_dev_type", ctypes.c_int, vp)
    _declare(base, "ggml_backend_dev_memory", None, vp, ctypes.POINTER(sz), ctypes.POINTER(sz))
    return base


@cache
def _registry() -> ctypes.CDLL:
    """libggml, which holds the device registry."""
    libdir = pathlib.Path(llama_cpp.__file__).parent / "lib"
    candidates = sorted(libdir.glob("libggml.*")) + sorted(libdir.glob("ggml.dll"))
    if not candidates:
        raise ModelError(f"libggml not found in {libdir}: is llama-cpp-python installed correctly?")
    reg = ctypes.CDLL(str(candidates[0]))
    _declare(reg, "ggml_backend_dev_count", ctypes.c_size_t)
    _declare(reg, "ggml_backend_dev_get", ctypes.c_void_p, ctypes.c_size_t)
    return reg


def tensor(ptr: int) -> GgmlTensor:
    return GgmlTensor.from_address(ptr)


def check_layout(ptr: int) -> None:
    """Fail clearly if this ggml's tensor struct differs from the one kvinject was written for."""
    t = tensor(ptr)
    nbytes = lib().ggml_nbytes(ptr)
    name = lib().ggml_get_name(ptr)
    wrong_size = t.type == GGML_TYPE_F32 and lib().ggml_is_contiguous(ptr) and nbytes != 4 * numel(t)
    if name != t.name or wrong_size or lib().ggml_op_name(GGML_OP_SET_ROWS) != b"SET_ROWS" or lib().ggml_op_name(GGML_OP_ROPE) != b"ROPE":
        raise ModelError(
            "this llama-cpp-python's ggml tensor layout is not the one kvinject supports "
            f"(llama-cpp-python {llama_cpp.__version__}); install llama-cpp-python==0.3.36"
        )


def numel(t: GgmlTensor) -> int:
    n = 1
    for d in t.ne:
        n *= d
    return n


DEVICE_TYPES = {0: "CPU", 1: "GPU", 2: "IGPU", 3: "ACCEL"}


def devices() -> list[dict[str, object]]:
    """The compute devices ggml has registered (CPU, CUDA GPUs, ...)."""
    reg, base = _registry(), lib()
    out = []
    for i in range(reg.ggml_backend_dev_count()):
        dev = reg.ggml_backend_dev_get(i)
        free, total = ctypes.c_size_t(), ctypes.c_size_t()
        base.ggml_backend_dev_memory(dev, ctypes.byref(free), ctypes.byref(total))
        out.append(
            {
                "name": base.ggml_backend_dev_name(dev).decode(),
                "description": base.ggml_backend_dev_description(dev).decode(),
                "type": DEVICE_TYPES.get(base.ggml_backend_dev_type(dev), "?"),
                "memory_total": total.value,
                "memory_free": free.value,
            }
        )
    return out


# The hook's header holds ggml's functions of a buffer by address (IS_HOST, BUFFER_NAME): callable
# from Python with the signatures of ggml_backend_buffer_is_host and ggml_backend_buffer_name.
_BUFFER_TEST = ctypes.CFUNCTYPE(ctypes.c_bool, ctypes.c_void_p)
_BUFFER_NAME = ctypes.CFUNCTYPE(ctypes.c_char_p, ctypes.c_void_p)


@cache
def buffer_test(address: int):
    """The ``bool f(ggml_backend_buffer_t)`` at ``address``."""
    return _BUFFER_TEST(address)


@cache
def buffer_name(address: int):
    """The ``const char * f(ggml_backend_buffer_t)`` at ``address``."""
    return _BUFFER_NAME(address)
