"""Eviction: tokens removed from llama.cpp's cache after a decode, as KV-cache compressors do.

Once a prompt has been decoded whole, and after every decode that follows, each sequence keeps
at most a budget of its tokens, ``B(n)`` of the ``n`` it has decoded: a ratio (``budget=0.25``:
``floor(n / 4)``, at least 1) or a number of tokens (``budget=256``); the others are removed
with ``llama_memory_seq_rm``, and the kept tokens keep their positions (as kvpress does). A
prompt decoded in pieces is not cut between them: the references prefill a prompt in one pass
with full attention before they compress, so every prompt token attends to the whole prompt
(and H2O's sums count every prompt query). Every method keeps a sequence's newest token:
llama.cpp requires the next position of a sequence to follow the last one it holds. llama.cpp
holds a token in one cell for every layer and head, so one set is kept per sequence, where the
references choose per layer (and kvpress, SnapKV and H2O per KV head): scores are the mean over
the query heads and the layers. Among equal scores the later token is kept. The methods, as
defined by their papers' code (kvpress: github.com/NVIDIA/kvpress, kvpress/presses/):

- ``window``: the last B tokens.
- ``streaming``: StreamingLLM (``StreamingLLMPress``): the first ``sinks`` tokens (at most B - 1)
  and the last B - sinks.
- ``random``: the newest and B - 1 others at random (``RandomPress``): each token gets a score
  from the item's seeded stream once, when it arrives, and the highest are kept, so a prompt is
  cut to a uniform sample of its tokens and the lowest score goes after each generated token
  (scores drawn anew at each decode would favour recent tokens, the older having survived more
  draws).
- ``tova``: TOVA (``TOVAPress``; schwartz-lab-NLP/TOVA): the decode's last query's attention,
  the lowest evicted.
- ``h2o``: H2O (github.com/FMInference/H2O, h2o_hf/utils_real_drop/modify_llama.py,
  ``H2OKVCache_LayerWise``): each token's attention summed over every query since it arrived;
  the last ``recent`` share of B kept (at least one token), the rest of B the highest sums among
  the older tokens.
- ``snapkv``: SnapKV (``SnapKVPress``): once a prompt ends, the attention of its last ``window``
  queries on the earlier tokens, averaged over those queries and pooled over ``kernel``
  neighbouring tokens (zero-padded mean); the window and the best B - window earlier tokens
  are kept. Generated tokens are never evicted.
"""

from __future__ import annotations

from dataclasses import dataclass
from fractions import Fraction
from typing import TYPE_CHECKING, ClassVar, Sequence

import numpy as np

from ..engine.perturbation import CacheResident
from ..exceptions import SpecError
from .registry import register

if TYPE_CHECKING:
    from ..engine.options import CacheOptions
    from ..engine.resident import ResidentCache
    from ..engine.target import Target

OPTIONS = {"window": (), "streaming": ("sinks",), "random": (), "tova": (), "h2o": ("recent",), "snapkv": ("window", "kernel")}
BY_ATTENTION = ("tova", "h2o", "snapkv")


def top(scores: np.ndarray, k: int) -> np.ndarray:
    """The indices of the ``k`` highest ``scores``, ties to the later index, in order."""
    order = np.lexsort((-np.arange(len(scores)), -scores))
    return np.sort(order[: max(k, 0)])


@register
@dataclass(frozen=True)
class Evict(CacheResident):
    method: str
    budget: str
    sinks: int = 4
    recent: float = 0.5
    window: int = 64
    kernel: int = 5
    name: ClassVar[str] = "evict"
    syntax: ClassVar[str] = "evict:METHOD,BUDGET[,sinks=4|recent=0.5|window=64,kernel=5]"
    summary: ClassVar[str] = (
        "Eviction after each decode to BUDGET tokens per sequence (0.25: a ratio of its tokens; 256: tokens), kept ones at their positions: "
        "window, streaming (sinks + recent), random, tova (last query's attention), h2o (accumulated attention + recent share), "
        "snapkv (prompt's last window, pooled, once per prompt)."
    )
    example: ClassVar[str] = "evict:streaming,1024,sinks=4"

    @classmethod
    def parse(cls, args: list[str], options: dict[str, str]) -> Evict:
        model = super().parse(args, options)
        extra = sorted(set(options) - {"method", "budget", *OPTIONS[model.method]})
        if extra:
            raise SpecError(f"'{model.method}' takes no option '{extra[0]}' (options: {', '.join(OPTIONS[model.method]) or 'none'})")
        return model

    def __post_init__(self) -> None:
        if self.method not in OPTIONS:
            raise SpecError(f"'evict': METHOD must be one of {', '.join(OPTIONS)}, got '{self.method}'")
        try:
            ratio = Fraction(self.budget)
        except ValueError:
            raise SpecError(f"'evict': BUDGET must be a ratio such as 0.25 or a number of tokens such as 256, got '{self.budget}'") from None
        if "." in self.budget and not 0 < ratio <= 1:
            raise SpecError(f"'evict': a ratio BUDGET must be in (0, 1], got {self.budget}")
        if "." not in self.budget and (ratio.denominator != 1 or ratio < 1):
            raise SpecError(f"'evict': a token BUDGET must be an integer >= 1 (a ratio needs a decimal point: 0.5), got {self.budget}")
        if self.sinks < 0 or not 0 <= self.recent <= 1 or self.window < 1 or self.kernel < 1 or self.kernel % 2 == 0:
            raise SpecError(f"'evict': sinks >= 0, recent in [0, 1], window >= 1 and an odd kernel >= 1 needed, got {self.spec}")
        if self.method == "streaming" and "." not in self.budget and self.sinks >= ratio:  # it would keep budget - 1, not what the label says
            raise SpecError(
                f"'evict:streaming,{self.budget}' keeps at most {ratio - 1} sinks beside one recent token, and sinks={self.sinks} asks for more: "
                "lower sinks or raise the budget"
            )

    @property
    def spec(self) -> str:
        """Only the method's own options (the others do not apply)."""
        options = "".join(f",{key}={getattr(self, key)}" for key in OPTIONS[self.method])
        return f"{self.name}:{self.method},{self.budget}{options}"

    def kept(self, n: int) -> int:
        """B(n): how many of a sequence's ``n`` tokens are kept."""
        if "." not in self.budget:
            return min(n, int(self.budget))
        return max(1, int(n * Fraction(self.budget)))

    @property
    def attention(self) -> bool:
        return self.method in BY_ATTENTION

    @property
    def random(self) -> bool:
        return self.method == "random"

    def draw(self, rng: np.random.Generator, n: int) -> np.ndarray:
        return rng.random(n)

    def check_target(self, target: Target, cache: CacheOptions) -> None:
        # Removing a token frees its cell in every layer, K and V alike; values are not edited, so any cache type will do.
        if target.components != "kv" or target.layers is not None:
            raise SpecError(f"'{self.name}' removes whole tokens from every layer's K and V: leave --target and --layers at their defaults")
        if self.attention and cache.flash_attn_type != 0:
            raise SpecError(f"'{self.name}:{self.method}' reads attention weights, which flash attention does not materialize: use --flash-attn off")

    def bits_per_element(self, stored: float, component: str, lengths: Sequence[int] = (), row: int = 0) -> float:
        """The cache's bits; the kept share of the tokens scales them (kvinject.engine.bits). With no
        run's lengths known, a ratio budget's share."""
        return stored if lengths or "." not in self.budget else stored * float(Fraction(self.budget))

    def after_decode(self, cache: ResidentCache, grown: list[tuple[int, int, int]]) -> None:
        for seq, n0, n1 in grown:
            held = cache.held(seq)
            keep = getattr(self, f"_{self.method}")(cache, seq, held, n0, n1)  # scores accumulate at every decode
            if keep is not None and cache.asked(seq):  # not within a prompt
                cache.remove(seq, np.delete(held, keep))

    # Each method returns the indices into ``held`` (the tokens of ``seq`` in the cache, in
    # order) to keep, or None to keep them all.

    def _window(self, cache: ResidentCache, seq: int, held: np.ndarray, n0: int, n1: int) -> np.ndarray | None:
        b = self.kept(n1)
        return np.arange(len(held) - b, len(held)) if len(held) > b else None

    def _streaming(self, cache: ResidentCache, seq: int, held: np.ndarray, n0: int, n1: int) -> np.ndarray | None:
        b = self.kept(n1)
        if len(held) <= b:
            return None
        sinks = min(self.sinks, b - 1)
        return np.concatenate([np.arange(sinks), np.arange(len(held) - (b - sinks), len(held))])

    def _random(self, cache: ResidentCache, seq: int, held: np.ndarray, n0: int, n1: int) -> np.ndarray | None:
        state = cache.state(seq)
        state["scores"] = scores = np.concatenate([state.get("scores", np.zeros(0)), cache.draws(seq).take(n1 - n0)])
        b = self.kept(n1)
        if len(held) <= b:
            return None
        mine = scores[held]
        mine[-1] = np.inf
        return top(mine, b)

    def _tova(self, cache: ResidentCache, seq: int, held: np.ndarray, n0: int, n1: int) -> np.ndarray | None:
        b = self.kept(n1)
        if len(held) <= b:
            return None
        scores = cache.attention(seq)[-1].copy()
        scores[-1] = np.inf
        return top(scores, b)

    def _h2o(self, cache: ResidentCache, seq: int, held: np.ndarray, n0: int, n1: int) -> np.ndarray | None:
        state = cache.state(seq)
        sums = np.zeros(n1)
        sums[: len(state.get("sums", ()))] = state.get("sums", ())
        sums[held] += cache.attention(seq).sum(0)
        state["sums"] = sums
        b = self.kept(n1)
        if len(held) <= b:
            return None
        recent = max(1, int(b * self.recent))
        older = len(held) - recent
        return np.concatenate([top(sums[held[:older]], b - recent), np.arange(older, len(held))])

    def _snapkv(self, cache: ResidentCache, seq: int, held: np.ndarray, n0: int, n1: int) -> np.ndarray | None:
        # The attention of the latest `window` queries on every token, kept across a prompt's pieces.
        state = cache.state(seq)
        rows = np.zeros((n1 - n0, n1))
        rows[:, held] = cache.attention(seq)
        earlier = state.get("window", np.zeros((0, n1)))
        state["window"] = np.concatenate([np.pad(earlier, ((0, 0), (0, n1 - earlier.shape[1]))), rows])[-self.window :]
        b = self.kept(n1)
        if not cache.prompt_ended(seq) or len(held) <= b:
            return None
        w = min(self.window, len(held))
        scores = state["window"][:, held[: len(held) - w]].mean(0)
        half = self.kernel // 2  # zero-padded, as F.avg_pool1d(padding=kernel // 2); "same" would widen fewer than kernel scores
        pooled = np.convolve(scores, np.ones(self.kernel) / self.kernel, "full")[half : half + len(scores)]
        return np.concatenate([top(pooled, b - w), np.arange(len(held) - w, len(held))]) if b > w else np.arange(len(held) - b, len(held))
