"""Error models: what happens to each K/V component as it enters the cache (or, for
cache-resident models, to cells already in it), by name.

Every module of this package is imported, and every model registered with ``@register``
(kvinject/error_models/base.py) is known to ``--error``, grid files, ``kvinject errors`` and
the hook: a new error model is one file here (docs/extending.md).
"""

from __future__ import annotations

import importlib
import pkgutil

from .base import REGISTRY, CacheResident, Draws, ErrorModel, Multiplicative, parse_error, register
from .none import NoError

for _module in pkgutil.walk_packages(__path__, __name__ + "."):
    importlib.import_module(_module.name)

__all__ = ["REGISTRY", "CacheResident", "Draws", "ErrorModel", "Multiplicative", "NoError", "parse_error", "register"]
