"""`kvinject errors`: the error models, their syntax and meaning."""

from __future__ import annotations

from rich.text import Text

from ..error_models import REGISTRY
from ..error_models.composite import Composite
from .render import console


def errors() -> None:
    """List the error models with their syntax and meaning."""
    from rich.padding import Padding

    from ..error_models import Multiplicative

    console.print("Error models (--error SPEC)", style="bold", highlight=False)
    # The multiplicative noise models first (the study's), then the rest as registered; a syntax
    # line each, whole (a table column folded it mid-token), its meaning and an example below.
    for cls in [*sorted(REGISTRY.values(), key=lambda c: not issubclass(c, Multiplicative)), Composite]:
        console.print(Text(cls.syntax, style="bold cyan"), soft_wrap=True)
        console.print(Padding(Text(cls.summary), (0, 0, 0, 4), expand=False))
        console.print(Padding(Text(f"e.g. {cls.example}", style="green"), (0, 0, 1, 4), expand=False))
    console.print(
        "Apply to K or V only with --target k|v, to some layers with --layers 0-3,10, to some tokens with --positions first:4, "
        "and to some KV heads with --heads 0."
    )
