"""Greedy completions of one prompt under the control and each error configuration."""

from __future__ import annotations

from contextlib import ExitStack
from dataclasses import dataclass

from ..engine.context import Context
from ..engine.generation.decoding import generator
from ..engine.model import Model
from ..engine.perturbation import changed_nothing
from ..engine.positions import GENERATION_SPANS
from ..engine.realized_error import Realized
from ..error_models.configuration import Configuration
from ..exceptions import DataError, SpecError


@dataclass
class Completion:
    config: Configuration
    text: str
    tokens: list[int]
    realized: Realized
    nonfinite_steps: int

    @property
    def changed_nothing(self) -> bool:
        """An error model that changed no value of the cache (a selection past the prompt); not
        said where the statistics cannot tell (eviction removes tokens rather than change them)."""
        return changed_nothing(self.config.error, self.realized) is True

    def to_dict(self) -> dict[str, object]:
        return {
            **self.config.to_dict(),
            "label": self.config.label,
            "text": self.text,
            "n_tokens": len(self.tokens),
            "nonfinite_steps": self.nonfinite_steps,
            "changed_nothing": self.changed_nothing,
            "realized": self.realized.summary(),
        }


def generate(
    model: Model,
    prompt: str,
    configs: list[Configuration],
    max_tokens: int = 32,
    chat: bool = False,
    seed: int = 0,
    n_ctx: int = 2048,
    temperature: float = 0.0,
) -> list[Completion]:
    """One completion per configuration, each in a fresh context seeded by ``seed``."""
    if not prompt.strip():
        raise DataError("the prompt is empty: give the text to complete")
    if max_tokens < 1:
        raise SpecError(f"--max-tokens must be at least 1, got {max_tokens}")
    text = model.chat_prompt(prompt) if chat else prompt
    tokens = model.tokenize(text, add_special=True, parse_special=chat)
    if len(tokens) + max_tokens > n_ctx:
        raise DataError(f"the prompt ({len(tokens)} tokens) and {max_tokens} generated tokens do not fit --ctx {n_ctx}: raise --ctx or lower --max-tokens")
    for config in configs:  # every configuration, before the first one decodes
        config.check(model.shape)
        if config.target.positions is not None:
            config.target.positions.check("generate", GENERATION_SPANS)
    if temperature > 0 and any(c.cache_free for c in configs):
        raise SpecError("recompute generates greedily: use temperature 0 with it")
    out = []
    for config in configs:
        with ExitStack() as stack:
            ctx = stack.enter_context(Context(model, config.cache, config.error, config.target, seed=seed, n_ctx=n_ctx))
            ((_, gen),) = generator(stack, ctx, config.cache_free)([tokens], max_tokens, temperature)
            out.append(Completion(config, gen.text, gen.tokens, ctx.realized, gen.nonfinite_steps))
    return out
