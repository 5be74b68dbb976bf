"""numba's on-disk cache for compiled code that inlines other modules' functions.

numba stamps a cached function by the file that defines it alone (its
documented cache limitation), and compiled code inlines the functions it calls: the graph
callback's pass would go on running an old kvinject/engine/callback/rounding.py or kvinject/engine/variates.py after
an update that changed only them, without a word, on every later run. :func:`stamp_with`
makes one module's functions stamped by that module and the files it inlines, so that a
change to any of them compiles it anew.
"""

from __future__ import annotations

import functools
import hashlib
import os
from pathlib import Path

from numba.core import caching

# numba's order: NUMBA_CACHE_DIR where it is set, the module's __pycache__, the user's cache
# folder. Older numba versions name these classes with a leading underscore.
_NAMES = ("UserProvidedCacheLocator", "InTreeCacheLocator", "UserWideCacheLocator")
_CACHE_IMPL = getattr(caching, "CacheImpl", None) or caching._CacheImpl
_LOCATORS = [getattr(caching, name, None) or getattr(caching, f"_{name}") for name in _NAMES]


def stamp(files: list[str]) -> tuple[str, ...]:
    """The files' contents, hashed: what a cached function compiled from them depends on."""
    stats = [os.stat(f) for f in files]
    return tuple(_digest(f, st.st_mtime_ns, st.st_size) for f, st in zip(files, stats))


@functools.lru_cache(maxsize=None)
def _digest(path: str, mtime_ns: int, size: int) -> str:
    # Read once a process for each of the ~20 cached functions that ask, and again if the file
    # changes (the time and size are the cache's key, as numba keys its own stamp).
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()


def stamp_with(module: str, inlined: list[str]) -> None:
    """Stamp the cached functions that ``module`` (a file) defines by it and by ``inlined``; call
    it before that module's first ``@njit(cache=True)``, which picks its locator when decorated.
    The cache stays where numba would put it; only the stamp changes."""
    files = [module, *inlined]

    def locator(base: type) -> type:
        class Stamped(base):
            def get_source_stamp(self) -> tuple[str, ...]:
                return stamp(files)

            @classmethod
            def from_function(cls, py_func, py_file):
                return super().from_function(py_func, py_file) if os.path.exists(py_file) and os.path.samefile(py_file, module) else None

        return Stamped

    _CACHE_IMPL._locator_classes[:0] = [locator(base) for base in _LOCATORS]
