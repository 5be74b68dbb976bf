"""What ``--model_args`` of the ``kvinject`` lm-eval model may hold, parsed into kvinject's own
configuration by kvinject's own parsers, before any model loads."""

from __future__ import annotations

import typing
from dataclasses import dataclass, fields

from ..engine.options import BackendOptions, CacheOptions
from ..engine.target import Target
from ..error_models.configuration import Configuration
from ..exceptions import SpecError
from ..values import optional, parse_scalar

# lm-eval passes these to every model (its --batch_size, --max_batch_size, --device): kvinject
# decodes `parallel` sequences together and runs where llama.cpp's backend does.
LM_EVAL_OWN = frozenset({"batch_size", "max_batch_size", "device"})


@dataclass(frozen=True)
class Settings:
    """``--model_args key=value,...``: a spec with a comma is quoted, ``error="normal:0,0.25"``."""

    model: str | None = None  # a bundled name, a GGUF path or hf:OWNER/REPO/FILE.gguf (default smollm2)
    error: str = "none"  # ERROR[@K[/V]], as --error
    target: str = "kv"
    layers: str | None = None
    positions: str | None = None
    heads: str | None = None
    cache_type_k: str = "f16"
    cache_type_v: str = "f16"
    flash_attn: str = "auto"
    kv_rotation: bool = True
    seed: int = 0
    run: int = 0
    threads: int | None = None
    parallel: int | None = None
    n_gpu_layers: int | None = None
    max_length: int = 2048  # tokens of one sequence: rolling windows, and where long requests are cut

    @classmethod
    def parse(cls, values: dict[str, object]) -> Settings:
        names = {f.name: f for f in fields(cls)}
        unknown = sorted(set(values) - set(names) - LM_EVAL_OWN)
        if unknown:
            raise SpecError(f"--model_args: kvinject takes no '{unknown[0]}'; it takes {', '.join(names)}")
        hints = typing.get_type_hints(cls)
        given = {}
        for key, value in values.items():
            if key in LM_EVAL_OWN or value is None:
                continue
            kind = optional(hints[key])[0]
            if kind is str and isinstance(value, (int, float)) and not isinstance(value, bool):
                value = str(value)  # lm-eval reads layers=5 as a number
            given[key] = parse_scalar(f"--model_args: {key}", kind, value)
        settings = cls(**given)
        if settings.max_length < 2:
            raise SpecError(f"--model_args: max_length must be at least 2 tokens, got {settings.max_length}")
        try:
            configuration = settings.configuration  # every spec checked here, before a model loads
            if configuration.target.positions is not None:  # lm-eval's requests declare no spans
                configuration.target.positions.check("the kvinject lm-eval model", ())
            _ = settings.backend
        except SpecError as e:
            raise e.keyed(names, "--model_args") from None
        return settings

    @property
    def configuration(self) -> Configuration:
        cache = CacheOptions(self.cache_type_k, self.cache_type_v, self.flash_attn, self.kv_rotation)
        return Configuration.parse(self.error, Target.parse(self.target, self.layers, self.positions, self.heads), cache)

    @property
    def backend(self) -> BackendOptions:
        return BackendOptions(n_gpu_layers=self.n_gpu_layers, threads=self.threads, parallel=self.parallel)
