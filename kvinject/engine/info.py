"""What a user checks first: versions, backend, the model's attention shape, cache sizes."""

from __future__ import annotations

from .. import __version__
from ..exceptions import ModelError
from . import ggml
from .context import Context
from .model import Model, versions
from .options import CacheOptions

MIB = 1024 * 1024


def kv_cache_estimate(model: Model, n_ctx: int, bits_per_value: float) -> float:
    """The study's 2·L·H·D·N·b estimate in bytes (K and V, every layer, b bytes per value)."""
    return model.n_layer * model.n_head_kv * (model.head_dim_k + model.head_dim_v) * n_ctx * bits_per_value / 8


def gather(model: Model, n_ctx: int) -> dict[str, object]:
    devices = ggml.devices()
    gpus = [f"{d['description']} ({d['memory_total'] / 2**30:.0f} GiB)" for d in devices if d["type"] != "CPU"]
    report: dict[str, object] = {
        "kvinject": __version__,
        **versions(),
        "backend": ", ".join(gpus) if gpus else "CPU",
        "devices": devices,
        "model": str(model.path),
        "sha256": model.sha256,
        "description": model.description,
        "architecture": model.arch,
        "n_layer": model.n_layer,
        "n_head": model.n_head,
        "n_head_kv": model.n_head_kv,
        "head_dim_k": model.head_dim_k,
        "head_dim_v": model.head_dim_v,
        "n_ctx_train": model.n_ctx_train,
        "threads": model.backend.n_threads,
        "n_gpu_layers": model.n_gpu_layers,
    }
    rows = []
    for name, bits in ggml.BITS_PER_VALUE.items():
        estimate = kv_cache_estimate(model, n_ctx, bits)
        try:
            with Context(model, CacheOptions(name, name, "on"), n_ctx=n_ctx) as ctx:
                allocated = ctx.kv_cache_bytes
        except ModelError:
            allocated = None  # this cache type does not fit the model's head size
        total = allocated and allocated["k"] + allocated["v"]
        rows.append(
            {
                "type": name,
                "bits_per_value": bits,
                "estimate_mib": estimate / MIB,
                "allocated_mib": total / MIB if total else None,
                "ratio": total / estimate if total else None,
            }
        )
    report["cache_sizes"] = rows
    return report
