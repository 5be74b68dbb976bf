"""The ``kvinject`` model of lm-evaluation-harness: every request type in process on kvinject's
engine, under one configuration (``error=``, its target and cache types in ``--model_args``).

Log-likelihoods share a context's decode among its continuations (multiple choice) and batch
continuations over the context's sequences (kvinject/engine/generation/likelihood.py); rolling
log-likelihoods cut a document into lm-eval's own windows (``get_rolling_token_windows``,
``make_disjoint_window``) of ``max_length`` tokens; generations run with continuous batching
(kvinject/engine/generation/batching.py) until a stop string, ``max_gen_toks`` or an end-of-generation
token. Each request's noise is seeded by its tokens, so a request gets the same error whatever
is evaluated beside it or before it. Tokenization is the GGUF's: a context starts with BOS
where the model wants one, as llama.cpp does.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Sequence

from lm_eval.api.model import TemplateLM
from lm_eval.api.registry import register_model
from lm_eval.utils import get_rolling_token_windows, make_disjoint_window
from tqdm import tqdm

from ..engine.context import Context
from ..engine.generation.batching import generate_all
from ..engine.generation.likelihood import score_continuations
from ..engine.model import Model
from ..engine.realized_error import Realized
from ..error_models.configuration import Configuration
from ..exceptions import DataError, SpecError
from .settings import Settings

# Generation keywords lm-eval tasks pass that kvinject honors; any other is refused, not ignored.
GEN_KWARGS = frozenset({"until", "max_gen_toks", "do_sample", "temperature"})
MAX_GEN_TOKS = 256  # lm-eval's default


def item_of(*parts: object) -> int:
    """A request's seed: a hash of what it holds, the same in every run and batch."""
    return int.from_bytes(hashlib.blake2b(repr(parts).encode(), digest_size=7).digest(), "little")


@register_model("kvinject")
class KvinjectLM(TemplateLM):
    """``lm_eval --model kvinject --model_args model=smollm2,error="normal:0,0.25"``; in Python,
    ``KvinjectLM(model="smollm2", error="normal:0,0.25")``. :attr:`realized` is the error that
    reached the cache over every request so far."""

    instances: list[KvinjectLM] = []  # made in this process: `kvinject lm-eval` reports their error

    def __init__(self, **model_args: object):
        super().__init__()
        self.settings = Settings.parse(model_args)
        self._bind(Model(self.settings.model, self.settings.backend), self.settings.configuration)
        KvinjectLM.instances.append(self)

    @classmethod
    def on(cls, model: Model, configuration: Configuration, seed: int = 0, run: int = 0, max_length: int = 2048) -> KvinjectLM:
        """The model for a loaded ``model`` under ``configuration``: what kvinject's lmeval bench
        evaluates each configuration and run with."""
        lm = cls.__new__(cls)
        TemplateLM.__init__(lm)
        lm.settings = Settings(seed=seed, run=run, max_length=max_length)
        lm._bind(model, configuration)
        return lm

    def _bind(self, model: Model, configuration: Configuration) -> None:
        self.model, self.configuration = model, configuration
        configuration.check(model.shape)
        self._ctx: Context | None = None

    def close(self) -> None:
        """Free the context (the model stays loaded)."""
        if self._ctx is not None:
            self._ctx.close()

    @property
    def started(self) -> bool:
        """Whether a request has reached it (its context is made with the first)."""
        return self._ctx is not None

    @property
    def context(self) -> Context:
        """One context for every request: ``parallel`` sequences of ``max_length`` tokens."""
        if self._ctx is None:
            c, n_seq = self.configuration, self.model.parallel
            s = self.settings
            self._ctx = Context(self.model, c.cache, c.error, c.target, seed=s.seed, run=s.run, n_ctx=n_seq * s.max_length, n_seq=n_seq)
        return self._ctx

    @property
    def realized(self) -> Realized:
        return self._ctx.realized if self._ctx is not None else Realized.empty()

    def realized_line(self) -> str:
        """What reached the cache, in one line: values changed and their relative error, K and V."""
        parts, realized = [], self.realized  # summed over the hook's sites at each call: once
        for name, stats in (("K", realized.k), ("V", realized.v)):
            if stats.values:
                parts.append(f"{name} {stats.values} values, relative error {stats.rel_err_mean:.4g} ± {stats.rel_err_std:.4g}, SNR {stats.snr_db:.1f} dB")
        return "; ".join(parts) or "no value of K or V was changed"

    @property
    def eot_token_id(self) -> int:
        return self.model.eos

    @property
    def prefix_token_id(self) -> int:
        return self.model.bos if self.model.adds_bos else self.model.eos

    @property
    def max_length(self) -> int:
        return self.settings.max_length

    @property
    def tokenizer_name(self) -> str:
        return self.model.path.name

    def chat_template(self, chat_template: bool | str = False) -> str | None:
        """The GGUF's chat template, which lm-eval records with results that used it."""
        return self.model.chat_template if chat_template else None

    def apply_chat_template(self, chat_history: list[dict[str, str]], add_generation_prompt: bool = True) -> str:
        return self.model.chat_text(chat_history, add_generation_prompt)

    def tok_encode(self, string: str, add_special_tokens: bool | None = None, **kwargs: object) -> list[int]:
        """The GGUF's tokens of ``string``, special tokens written in it parsed (chat templates),
        BOS first where the model wants one unless ``add_special_tokens`` is False."""
        return self.model.tokenize(string, add_special=add_special_tokens is not False, parse_special=True)

    def _loglikelihood_tokens(self, requests: list[tuple[tuple[str, str], list[int], list[int]]], disable_tqdm: bool = False, **kwargs: object):
        pairs = [self._fit(context, continuation) for _, context, continuation in requests]
        with tqdm(total=len(pairs), desc="kvinject loglikelihood", disable=disable_tqdm) as bar:
            scored = score_continuations(self.context, pairs, [item_of(c, k) for c, k in pairs], bar.update)
        out = []
        for (strings, _, _), s in zip(requests, scored):
            answer = (s.logprob, s.greedy)
            self.cache_hook.add_partial("loglikelihood", strings, answer)
            out.append(answer)
        return out

    def _fit(self, context: Sequence[int], continuation: Sequence[int]) -> tuple[list[int], list[int]]:
        """Cut the context's start where the pair is longer than ``max_length`` + 1 tokens (the
        last token is predicted, never read), as lm-eval's own models do."""
        whole = [*context, *continuation][-(self.max_length + 1) :]
        if len(whole) <= len(continuation):
            raise DataError(f"a continuation of {len(continuation)} tokens leaves no context within max_length={self.max_length}")
        return whole[: len(whole) - len(continuation)], list(continuation)

    def loglikelihood_rolling(self, requests, disable_tqdm: bool = False) -> list[float]:
        spans: list[tuple[int, int]] = []  # each document's windows among all pairs
        pairs: list[tuple[list[int], list[int]]] = []
        for (string,) in (r.args for r in requests):
            tokens = self.tok_encode(string, add_special_tokens=False)
            windows = [make_disjoint_window(w) for w in get_rolling_token_windows(tokens, self.prefix_token_id, self.max_length, 1)]
            spans.append((len(pairs), len(pairs) + len(windows)))
            pairs += windows
        with tqdm(total=len(pairs), desc="kvinject loglikelihood_rolling", disable=disable_tqdm) as bar:
            scored = score_continuations(self.context, pairs, [item_of(c, k) for c, k in pairs], bar.update)
        out = []
        for request, (a, b) in zip(requests, spans):
            total = sum(s.logprob for s in scored[a:b])
            self.cache_hook.add_partial("loglikelihood_rolling", request.args, total)
            out.append(total)
        return out

    def generate_until(self, requests, disable_tqdm: bool = False) -> list[str]:
        out: list[str | None] = [None] * len(requests)
        groups: dict[str, list[int]] = {}
        for i, request in enumerate(requests):  # one pass per set of generation keywords
            groups.setdefault(json.dumps(request.args[1], sort_keys=True, default=str), []).append(i)
        with tqdm(total=len(requests), desc="kvinject generate_until", disable=disable_tqdm) as bar:
            for members in groups.values():
                kwargs = dict(requests[members[0]].args[1])
                until, max_tokens, temperature = self._generation(kwargs)
                prompts = [self.tok_encode(requests[i].args[0])[-(self.max_length - max_tokens) :] for i in members]
                tail = max(map(len, until), default=0) + 4  # tokens enough to hold any stop string

                def stop(tokens: list[int]) -> bool:
                    text = self.model.detokenize(tokens[-tail:])
                    return any(u in text for u in until)

                items = [item_of(p, sorted(kwargs.items(), key=str)) for p in prompts]
                for j, generation in generate_all(self.context, prompts, max_tokens, temperature, stop, items):
                    text = generation.text
                    for u in until:
                        text = text.split(u, 1)[0]
                    i = members[j]
                    self.cache_hook.add_partial("generate_until", requests[i].args, text)
                    out[i] = text
                    bar.update(1)
        return out

    def _generation(self, kwargs: dict[str, object]) -> tuple[list[str], int, float]:
        unknown = sorted(set(kwargs) - GEN_KWARGS)
        if unknown:
            raise SpecError(f"generation option '{unknown[0]}' is not supported by kvinject (it takes {', '.join(sorted(GEN_KWARGS))})")
        until = kwargs.get("until") or []
        until = [until] if isinstance(until, str) else list(until)
        max_tokens = int(kwargs.get("max_gen_toks", MAX_GEN_TOKS))
        if max_tokens < 1:
            raise SpecError(f"max_gen_toks must be at least 1, got {max_tokens}")
        if max_tokens >= self.max_length:
            raise SpecError(f"max_gen_toks={max_tokens} leaves no room for a prompt within max_length={self.max_length}")
        temperature = kwargs.get("temperature")
        # Greedy unless sampling is asked for; sampling without a temperature draws from the model's distribution.
        temperature = (1.0 if temperature is None else float(temperature)) if kwargs.get("do_sample") else 0.0
        return until, max_tokens, temperature
