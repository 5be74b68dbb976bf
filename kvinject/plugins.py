"""Registries filled by modules: every module of one of kvinject's plug-in packages, then what
installed packages name under its entry-point group (``kvinject.error_models``,
``kvinject.benchmarks``), so that another package adds error models and benchmarks without an
edit here (docs/extending.md)."""

from __future__ import annotations

import importlib
import pkgutil
import sys
from collections.abc import Callable, Iterable
from importlib.metadata import entry_points


def import_modules(path: Iterable[str], package: str) -> None:
    """Import every module of ``package`` (at ``path``), in name order: each registers what it defines."""
    for module in pkgutil.walk_packages(path, package + "."):
        importlib.import_module(module.name)


def load_plugins(group: str, register: Callable[[object], None]) -> None:
    """Load each entry point of ``group``: a module, whose import registers what it defines, or
    an object handed to ``register``. A plug-in that fails to load, or takes a name already
    registered, is left out with a one-line warning: the built-in models and benchmarks still
    work as they were."""
    for point in entry_points(group=group):
        try:
            loaded = point.load()
            if not isinstance(loaded, type(sys)):
                register(loaded)
        except Exception as e:  # whatever a third party's import raises, or a name already taken
            source = point.dist.name if point.dist else "an installed package"
            print(f"kvinject: the plug-in '{point.name}' of {source} ({point.value}) failed to load and is left out: {e}", file=sys.stderr)
