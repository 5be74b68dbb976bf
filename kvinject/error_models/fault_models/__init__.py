"""Fault models of a fault campaign (``faults:K,kind=NAME``): what one fault does to the bits
the cache stores, beside the default single-bit flip. Each draws an item's K faults among the
values its tokens write (:class:`Space`) as changes to stored values, bits cleared then bits
flipped (kvinject/engine/rowbits.py), so that the hook lands them, the record says where, and a
replay draws them again. One model a file; registering it is all it takes (docs/faults.md)."""

from __future__ import annotations

from . import burst, double, stuck, value, word  # noqa: F401  (each registers its models)
from .base import FAULT_MODELS, Drawn, FaultModel, Space, fault_model, register

__all__ = ["FAULT_MODELS", "Drawn", "FaultModel", "Space", "fault_model", "register"]
