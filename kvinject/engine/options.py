"""Backend and cache settings shared by every command, validated before anything loads."""

from __future__ import annotations

import os
from dataclasses import asdict, dataclass

import psutil

from ..exceptions import SpecError
from .ggml import CACHE_TYPES

MAX_THREADS = 512  # ggml's GGML_MAX_N_THREADS; more ended in libgomp's "Thread creation failed"
FLASH_ATTN = {"auto": -1, "off": 0, "on": 1}  # llama_flash_attn_type


def physical_cores() -> int:
    """Physical cores, at most the CPUs this process may run on: a SLURM task (task/affinity,
    cgroups), taskset or a container's cpuset gets its share of a large node, not a thread per
    core of the node. llama.cpp's default of 4 threads (or Llama()'s cpu_count()//2) is far slower
    on small machines."""
    cores = psutil.cpu_count(logical=False) or psutil.cpu_count() or 1
    return min(cores, len(os.sched_getaffinity(0))) if hasattr(os, "sched_getaffinity") else cores


@dataclass(frozen=True)
class BackendOptions:
    """How the model is loaded: fixed for the whole process."""

    n_gpu_layers: int | None = None  # None: every layer when llama.cpp has a GPU backend, else 0
    threads: int | None = None  # None: physical cores
    parallel: int | None = None  # sequences per decode; None: chosen per bench and device (Model.parallel)

    def __post_init__(self) -> None:
        if self.threads is not None and not 1 <= self.threads <= MAX_THREADS:
            raise SpecError(f"--threads must be between 1 and {MAX_THREADS}, got {self.threads}")
        if self.n_gpu_layers is not None and self.n_gpu_layers < -1:
            raise SpecError(f"--n-gpu-layers must be >= -1 (-1: all), got {self.n_gpu_layers}")
        if self.parallel is not None and not 1 <= self.parallel <= 256:
            raise SpecError(f"--parallel must be between 1 and 256, got {self.parallel}")

    @property
    def n_threads(self) -> int:
        return self.threads or physical_cores()


@dataclass(frozen=True)
class CacheOptions:
    """How one llama context stores K and V; may differ between configurations."""

    type_k: str = "f16"
    type_v: str = "f16"
    flash_attn: str = "auto"
    kv_rotation: bool = True  # llama.cpp's Hadamard rotation of quantized caches

    def __post_init__(self) -> None:
        for which, name in (("--cache-type-k", self.type_k), ("--cache-type-v", self.type_v)):
            if name not in CACHE_TYPES:
                raise SpecError(f"{which} '{name}' is not a cache type; choose one of {', '.join(CACHE_TYPES)}")
        if self.flash_attn not in FLASH_ATTN:
            raise SpecError(f"--flash-attn must be auto, on or off, got '{self.flash_attn}'")
        if self.v_quantized and self.flash_attn == "off":
            raise SpecError(
                f"a quantized V cache ({self.type_v}) needs flash attention: use --flash-attn on (or auto), or an unquantized --cache-type-v (f16, bf16, f32)"
            )

    @property
    def v_quantized(self) -> bool:
        return self.type_v not in ("f32", "f16", "bf16")

    @property
    def flash_attn_type(self) -> int:
        if self.flash_attn == "auto":
            # llama.cpp cannot store a quantized V without flash attention, so 'auto' must not pick
            # off; and its flash attention casts an f32 K or V to f16 (build_attn_mha), so an f32
            # cache under it computes as an f16 one: 'auto' keeps f32 exact.
            if self.v_quantized:
                return FLASH_ATTN["on"]
            if "f32" in (self.type_k, self.type_v):
                return FLASH_ATTN["off"]
        return FLASH_ATTN[self.flash_attn]

    @property
    def label(self) -> str:
        rot = "" if self.kv_rotation else ",norot"
        return f"K:{self.type_k}/V:{self.type_v},fa={self.flash_attn}{rot}"

    def to_dict(self) -> dict[str, object]:
        return asdict(self)
