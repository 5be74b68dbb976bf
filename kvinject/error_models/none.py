"""The control: no error, and no hook installed (the engine's default, registered as ``none``)."""

from ..engine.perturbation import NoError
from .registry import register

register(NoError)
