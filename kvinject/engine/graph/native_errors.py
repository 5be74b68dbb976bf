"""The errors the compiled graph callback reports through its header (``gh.ERROR``), as kvinject's."""

from __future__ import annotations

from ...exceptions import InjectionError, ModelError
from ..callback import graph_header as gh

LEARN_CAPACITY = 1 << 17  # graph nodes recorded while learning (llama.cpp's graphs hold a few thousand)


def native_error(code: int, name: str, value: int, rows: int) -> Exception:
    """The error of ``code`` at the graph node ``name`` (``value``: what the callback found; ``rows``: the decode's)."""
    if code == gh.MISMATCH:
        return InjectionError(
            f"graph node '{name}' does not match the graph learned at the first decode; "
            "kvinject does not support models whose graph changes shape between decodes"
        )
    if code == gh.NOT_F32:
        return ModelError(f"'{name}' is not a contiguous f32 tensor; kvinject cannot perturb it")
    if code == gh.BAD_ROWS:
        return InjectionError(f"the cache write '{name}' of {value} values does not split into the {rows} rows of this decode")
    if code == gh.WRITES_OVERFLOW:
        return ModelError(f"this model's graph writes the KV cache more often than kvinject can record ({value} writes)")
    if code == gh.BAD_SOFT_MAX:
        return ModelError("eviction by attention reads contiguous f32 attention weights of one stream in host memory, and this graph's are not (a GPU?)")
    if code in (gh.LAUNCH_FAILED, gh.SYNCHRONIZE_FAILED):
        what = "launch the K/V kernel at" if code == gh.LAUNCH_FAILED else "finish the K/V kernel of"
        return InjectionError(f"the CUDA driver could not {what} '{name}' (CUDA error {value}); KVINJECT_DEVICE_KERNELS=0 copies K/V to the host instead")
    if code == gh.BAD_INDEX:
        return ModelError("this model's graph indexes its KV cache writes with a type other than int64; kvinject cannot follow them")
    return ModelError(f"this model's graph has more than {LEARN_CAPACITY} nodes; kvinject cannot learn it")
