"""Eviction: tokens removed from llama.cpp's cache after a decode, as KV-cache compressors do.

Once a prompt has been decoded whole, and after every decode that follows, each sequence keeps
at most a budget of its tokens, ``B(n)`` of the ``n`` it has decoded: a ratio (``budget=0.25``:
``floor(n / 4)``, at least 1) or a number of tokens (``budget=256``); the others are removed
with ``llama_memory_seq_rm``, and the kept tokens keep their positions (as kvpress does). A
prompt decoded in pieces is not cut between them: the references prefill a prompt in one pass
with full attention before they compress, so every prompt token attends to the whole prompt
(and H2O's sums count every prompt query). Which tokens a sequence keeps is the method's, one
file each in kvinject/error_models/eviction/ (window, streaming, random, tova, h2o, snapkv,
knorm, keydiff, lagkv, expected), as their papers' code defines them.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from fractions import Fraction
from typing import TYPE_CHECKING, ClassVar, Sequence

import numpy as np

from ..engine.perturbation import CacheResident
from ..exceptions import SpecError
from .eviction import METHODS, HeadScored, Method
from .eviction.allocation import ALLOCATIONS, ada, per_layer, pyramid
from .registry import register

if TYPE_CHECKING:
    from ..engine.cache.resident_cache import ResidentCache
    from ..engine.options import CacheOptions
    from ..engine.target import Target

# Each method's options (the fields of Evict it takes) and what it reads.
OPTIONS = {name: method.options() for name, method in METHODS.items()}


@register
@dataclass(frozen=True)
class Evict(CacheResident):
    method: str
    budget: str
    sinks: int = 4
    recent: float = 0.5
    window: int = 64
    kernel: int = 5
    lag: int = 128
    future: int = 512
    alloc: str | None = None  # budgets per KV head ("heads"; "ada", with alpha) or per layer ("pyramid", with window and beta); None: one set per sequence
    alpha: float = 0.2
    beta: int = 20
    decode: int | None = None  # compress the prompt, then every DECODE generated tokens (0: never again); None: after every decode
    query: str | None = None  # "agnostic": compress a prompt's context before its question is decoded; None: the whole prompt (aware)
    name: ClassVar[str] = "evict"
    syntax: ClassVar[str] = (
        "evict:METHOD,BUDGET[,sinks=4|recent=0.5|window=64,kernel=5|lag=128|future=512][,alloc=heads|ada[,alpha=0.2]|pyramid[,window=64,beta=20]][,decode=N][,query=agnostic|aware]"
    )
    summary: ClassVar[str] = (
        "Eviction after each decode (decode=N: after the prompt, then every N generated tokens; 0: the prompt only) to BUDGET tokens per "
        "sequence (0.25: a ratio of its tokens; 256: tokens), kept ones at their positions: "
        + ", ".join(f"{name} ({method.summary})" for name, method in METHODS.items())
        + " (kvinject/error_models/eviction/). alloc=heads, ada or pyramid (knorm, keydiff, lagkv, expected; decode=0, flash attention off): B per KV head"
        " (kvpress's presses), budgets per head of a layer (AdaKV) or per layer (PyramidKV), cells hidden from the heads that drop them."
    )
    example: ClassVar[str] = "evict:streaming,1024,sinks=4"

    @classmethod
    def parse(cls, args: list[str], options: dict[str, str]) -> Evict:
        model = super().parse(args, options)
        allocation = ALLOCATIONS[model.alloc].split(",") if model.alloc in ALLOCATIONS else []
        extra = sorted(set(options) - {"method", "budget", "decode", "query", "alloc", *allocation, *OPTIONS[model.method]})
        if extra:
            raise SpecError(f"'{model.method}' takes no option '{extra[0]}' (options: {', '.join(OPTIONS[model.method]) or 'none'})")
        return model

    def __post_init__(self) -> None:
        if self.method not in OPTIONS:
            raise SpecError(f"'evict': METHOD must be one of {', '.join(OPTIONS)}, got '{self.method}'")
        # Plain decimal text, as kvinject/values.py reads every number: 1e10, 1_000 and 0x10 are refused.
        if not re.fullmatch(r"[0-9]+|[0-9]+\.[0-9]*|\.[0-9]+", self.budget):
            raise SpecError(f"'evict': BUDGET must be a ratio such as 0.25 or a number of tokens such as 256, in decimal digits, got '{self.budget}'")
        ratio = Fraction(self.budget)
        if "." in self.budget and not 0 < ratio <= 1:
            raise SpecError(f"'evict': a ratio BUDGET must be in (0, 1], got {self.budget}")
        if "." not in self.budget and ratio < 1:
            raise SpecError(f"'evict': a token BUDGET must be an integer >= 1 (a ratio needs a decimal point: 0.5), got {self.budget}")
        if self.query not in (None, "agnostic", "aware"):
            raise SpecError(f"'evict': query must be agnostic (the context compressed before the question) or aware, got '{self.query}'")
        if self.alloc is not None and self.alloc not in ALLOCATIONS:
            raise SpecError(f"'evict': alloc must be heads (B per KV head), ada (budgets per head of a layer) or pyramid (per layer), got '{self.alloc}'")
        if self.alloc is not None and not issubclass(METHODS[self.method], HeadScored):
            with_heads = ", ".join(name for name, m in METHODS.items() if issubclass(m, HeadScored))
            raise SpecError(f"'evict:{self.method}' scores tokens as a whole: alloc={self.alloc} needs scores per head ({with_heads})")
        if self.alloc is not None and self.decode != 0:
            raise SpecError(f"'evict': alloc={self.alloc} compresses a prompt once, as kvpress's presses: add decode=0")
        if not 0 <= self.alpha <= 1 or self.beta < 1 or self.future < 1:
            raise SpecError(f"'evict': alpha in [0, 1], beta >= 1 and future >= 1 needed, got {self.spec}")
        if self.decode is not None and self.decode < 0:
            raise SpecError(f"'evict': decode=N compresses every N generated tokens (0: the prompt only), got {self.decode}")
        if self.sinks < 0 or not 0 <= self.recent <= 1 or self.window < 1 or self.kernel < 1 or self.kernel % 2 == 0 or self.lag < 2:
            raise SpecError(f"'evict': sinks >= 0, recent in [0, 1], window >= 1, an odd kernel >= 1 and lag >= 2 needed, got {self.spec}")
        if self.method == "streaming" and "." not in self.budget and self.sinks >= ratio:  # it would keep budget - 1, not what the label says
            raise SpecError(
                f"'evict:streaming,{self.budget}' keeps at most {ratio - 1} sinks beside one recent token, and sinks={self.sinks} asks for more: "
                "lower sinks or raise the budget"
            )

    @property
    def spec(self) -> str:
        """Only the method's own options (the others do not apply), and decode= where given."""
        options = "".join(f",{key}={getattr(self, key)}" for key in OPTIONS[self.method])
        allocation = [key for key in ALLOCATIONS.get(self.alloc, "").split(",") if key and key not in OPTIONS[self.method]]
        given = "".join(f",{key}={getattr(self, key)}" for key in ("alloc", *allocation, "decode", "query") if getattr(self, key) is not None)
        return f"{self.name}:{self.method},{self.budget}{options}{given}"

    def kept(self, n: int) -> int:
        """B(n): how many of a sequence's ``n`` tokens are kept."""
        if "." not in self.budget:
            return min(n, int(self.budget))
        return max(1, int(n * Fraction(self.budget)))

    @property
    def way(self) -> Method:
        """The method, with its options."""
        return METHODS[self.method](**{key: getattr(self, key) for key in OPTIONS[self.method]})

    @property
    def attention(self) -> bool:
        return METHODS[self.method].reads == "attention"

    @property
    def breaks_at(self) -> str | None:
        return "context" if self.query == "agnostic" else None

    @property
    def hides(self) -> bool:
        return self.alloc is not None

    @property
    def queries(self) -> bool:
        return METHODS[self.method].reads == "queries"

    @property
    def changes_values(self) -> bool:
        return False  # it removes or hides tokens: stacks on a model that changes their values

    @property
    def shares_prefill(self) -> bool:
        return True  # it cuts at a prompt's (or its context's) end at the earliest: every piece before is asked for no logits

    @property
    def random(self) -> bool:
        return METHODS[self.method].reads == "draws"

    def draw(self, rng: np.random.Generator, n: int) -> np.ndarray:
        return rng.random(n)

    def check_target(self, target: Target, cache: CacheOptions) -> None:
        super().check_target(target, cache)
        # Removing a token frees its cell in every layer, K and V alike; values are not edited, so any cache type will do.
        if target.components != "kv" or target.layers is not None:
            raise SpecError(f"'{self.name}' removes whole tokens from every layer's K and V: leave --target and --layers at their defaults")
        if self.alloc is not None and cache.flash_attn_type != 0:
            raise SpecError(f"'{self.spec}' hides cells from single heads in attention logits, which flash attention never builds: use --flash-attn off")
        if self.attention and cache.flash_attn_type != 0:
            raise SpecError(f"'{self.name}:{self.method}' reads attention weights, which flash attention does not materialize: use --flash-attn off")
        read = {"keys": "K", "keys and values": "KV", "queries": "KV"}.get(METHODS[self.method].reads, "")
        for component, kind in (("K", cache.type_k), ("V", cache.type_v)):
            if component in read and kind not in ("f32", "f16", "bf16"):
                what = f"'{self.name}:{self.method}' reads the cached {'keys' if component == 'K' else 'values'}"
                raise SpecError(f"{what}, which a {kind} cache holds in blocks: use an f32, f16 or bf16 {component} cache")

    def bits_per_element(self, stored: float, component: str, lengths: Sequence[int] = (), row: int = 0) -> float:
        """The cache's bits; the kept share of the tokens scales them (kvinject.engine.cache_bits). With no
        run's lengths known, a ratio budget's share."""
        return stored if lengths or "." not in self.budget else stored * float(Fraction(self.budget))

    def after_decode(self, cache: ResidentCache, grown: list[tuple[int, int, int]]) -> None:
        way = self.way
        for seq, n0, n1 in grown:
            state = cache.state(seq)
            if state.get("cut for good"):  # decode=0 after its one cut: nothing more is scored
                continue
            held = cache.held(seq)
            way.observe(cache, seq, held, n0, n1)  # scores accumulate at every decode
            due = cache.asked(seq) and self._due(cache, seq, n1)  # not within a prompt; every asking decode counts
            state["cut for good"] = due and self.decode == 0
            if due and len(held) > self.kept(n1):
                if self.alloc is not None:
                    self._allocate(cache, seq, held, way.head_scores(cache, seq, held), self.kept(n1))
                    continue
                keep = way.keep(cache, seq, held, self.kept(n1))
                if keep is not None:
                    cache.remove(seq, np.delete(held, keep))

    def _allocate(self, cache: ResidentCache, seq: int, held: np.ndarray, scores: np.ndarray, budget: int) -> None:
        """Budgets per layer or head: a token no head keeps leaves the cache, the others are hidden
        from the heads that drop them."""
        if self.alloc == "heads":
            kept = per_layer(scores, [budget] * len(scores))
        else:
            kept = ada(scores, budget, self.alpha) if self.alloc == "ada" else pyramid(scores, budget, self.window, self.beta)
        anywhere = kept.any(axis=(0, 1))
        cache.remove(seq, held[~anywhere])
        for layer, head in np.ndindex(kept.shape[:2]):
            cache.hide(seq, layer, head, held[anywhere & ~kept[layer, head]])

    def _due(self, cache: ResidentCache, seq: int, n: int) -> bool:
        """Whether this decode compresses: every one, or with decode=N a prompt's end and every
        N-th generated token after it (kvpress's prefill compression and DecodingPress's interval);
        with query=agnostic the context's end stands for the prompt's."""
        if self.decode is None and self.query != "agnostic":
            return True
        state = cache.state(seq)
        if cache.prompt_ended(seq):
            state["decoded since the prompt"] = 0
            # Query-agnostic: the context is compressed where it ends, before the question; the question is not.
            return self.query != "agnostic" or n == cache.span_end(seq, "context")
        state["decoded since the prompt"] = since = state.get("decoded since the prompt", 0) + 1
        return self.decode is None or (self.decode > 0 and since % self.decode == 0)
