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


def load_plugins(path: Iterable[str], package: str, group: str, register: Callable[[object], None]) -> None:
    """Import every module of ``package`` (at ``path``), then load each entry point of
    ``group``: a module, whose import registers what it defines, or an object handed to
    ``register``. A plug-in that fails to load is left out with a one-line warning: the
    built-in models and benchmarks still work, and a name it would have given is then unknown."""
    for module in pkgutil.walk_packages(path, package + "."):
        importlib.import_module(module.name)
    for point in entry_points(group=group):
        try:
            loaded = point.load()
        except Exception as e:  # whatever a third party's import raises
            source = point.dist.name if point.dist else "an installed package"
            print(f"kvinject: the plug-in '{point.name}' of {source} ({point.value}) failed to load and is left out: {e}", file=sys.stderr)
            continue
        if not isinstance(loaded, type(sys)):
            register(loaded)
