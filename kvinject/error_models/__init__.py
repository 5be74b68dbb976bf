"""Error models: what happens to each K/V component as it enters the cache (or, for
cache-resident models, to cells already in it), by name.

Every module of this package is imported, and every model registered with ``@register``
(kvinject/error_models/registry.py) is known to ``--error``, grid files, ``kvinject errors`` and
the hook: a new error model is one file here, or one module of another package named under the
entry-point group ``kvinject.error_models`` (docs/extending.md). The contract a model
implements is kvinject/engine/perturbation.py; its names are handed on here for plug-ins.
"""

from __future__ import annotations

from ..engine.perturbation import CacheResident, EntryModel, ErrorModel, Multiplicative, NoError
from ..engine.variates import Draws
from ..plugins import import_modules, load_plugins
from . import none  # noqa: F401  (the control registers first: listings and messages name it before the models)
from .registry import REGISTRY, parse_error, register

import_modules(__path__, __name__)
load_plugins("kvinject.error_models", register)

__all__ = ["REGISTRY", "CacheResident", "Draws", "EntryModel", "ErrorModel", "Multiplicative", "NoError", "parse_error", "register"]
