"""Exceptions that kvinject raises for problems a user can fix."""


class KvinjectError(Exception):
    """Base class: the CLI prints these as one clean message, without a traceback."""


class SpecError(KvinjectError, ValueError):
    """A malformed error-model spec, target, layer list or option value."""


class DataError(KvinjectError, ValueError):
    """A benchmark data file that cannot be read; the message names the file and line."""


class ModelError(KvinjectError):
    """A model that cannot be found, loaded, or whose graph the hook does not understand."""


class InjectionError(KvinjectError):
    """The hook failed inside llama.cpp or did not inject what was asked."""


class HookError(InjectionError):
    """An exception raised inside the K/V hook while it changed a decode's values: a fault
    campaign counts it against the item being decoded (DUE, "raised")."""
