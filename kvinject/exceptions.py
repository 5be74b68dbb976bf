"""Exceptions that kvinject raises for problems a user can fix."""

from collections.abc import Iterable


class KvinjectError(Exception):
    """Base class: the CLI prints these as one clean message, without a traceback."""


class SpecError(KvinjectError, ValueError):
    """A malformed error-model spec, target, layer list or option value."""

    def keyed(self, keys: Iterable[str], where: str) -> "SpecError":
        """The same mistake where options are keys (a grid's [sweep], lm-eval's --model_args): the
        flag of each key (``--flash-attn`` of ``flash_attn``) named as the key, after ``where``."""
        message = str(self)
        for key in sorted(keys, key=len, reverse=True):
            message = message.replace("--" + key.replace("_", "-"), key)
        return SpecError(f"{where}: {message}")


class DataError(KvinjectError, ValueError):
    """A benchmark data file that cannot be read; the message names the file and line."""


class ModelError(KvinjectError):
    """A model that cannot be found, loaded, or whose graph the hook does not understand."""


class InjectionError(KvinjectError):
    """The hook failed inside llama.cpp or did not inject what was asked."""


class HookError(InjectionError):
    """An exception raised inside the K/V hook while it changed a decode's values: a fault
    campaign counts it against the item being decoded (DUE, "raised")."""
