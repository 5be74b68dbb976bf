"""Long-context prompts for the retrieval benchmarks (passkey, niah, vt): needle sentences
placed at chosen depths in filler text (the bundled encyclopedia by default), the whole
prompt (chat template included) cut to a token budget of the model's own tokenizer.

What every such benchmark shares is here too: its options (lengths, depths, samples, data_seed),
the grid of (length, depth, sample) items, the check against the model's training context,
RULER's string-match scoring and the per-cell metrics (``accuracy@LENGTH/DEPTH``).
"""

from __future__ import annotations

import re
import uuid
from abc import abstractmethod
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import lru_cache

import numpy as np

from ..data import read_text
from ..engine.generation.batching import Generation
from ..engine.model import Model
from ..engine.positions import Spans
from ..exceptions import DataError
from .base import GenerationBenchmark
from .options import Options, option
from .spans import token_spans
from .speed import Speed

_SENTENCE_END = re.compile(r"(?<=[.!?])\s+(?=[A-Z0-9\"(])")
# RULER's "noise" haystack (niah_single_1, vt) and Landmark Attention's passkey filler: this
# block repeated, one per line.
NOISE = "The grass is green. The sky is blue. The sun is yellow. Here we go. There and back again."
HAYSTACKS = ("text", "noise")
# Keys are adjective-noun pairs, as RULER's are; these lists are this project's own.
ADJECTIVES = (
    "amber",
    "ancient",
    "bitter",
    "bold",
    "brave",
    "brisk",
    "calm",
    "clever",
    "crimson",
    "curious",
    "distant",
    "dusty",
    "eager",
    "faint",
    "fierce",
    "frozen",
    "gentle",
    "golden",
    "hollow",
    "humble",
    "icy",
    "jolly",
    "lively",
    "lonely",
    "lucky",
    "misty",
    "narrow",
    "noble",
    "olive",
    "pale",
    "patient",
    "proud",
    "quiet",
    "rapid",
    "restless",
    "rough",
    "rustic",
    "silent",
    "silver",
    "sleepy",
    "smooth",
    "sturdy",
    "swift",
    "tender",
    "velvet",
    "vivid",
    "wild",
    "wooden",
)
NOUNS = (
    "anchor",
    "badger",
    "banner",
    "basket",
    "beacon",
    "boulder",
    "candle",
    "canyon",
    "castle",
    "comet",
    "compass",
    "cricket",
    "dagger",
    "falcon",
    "feather",
    "fountain",
    "garden",
    "glacier",
    "harbor",
    "helmet",
    "island",
    "jackal",
    "kettle",
    "ladder",
    "lantern",
    "meadow",
    "mirror",
    "needle",
    "orchard",
    "otter",
    "parrot",
    "pebble",
    "pillar",
    "quarry",
    "raven",
    "ribbon",
    "saddle",
    "spider",
    "spoon",
    "tiger",
    "tower",
    "trumpet",
    "tunnel",
    "valley",
    "violin",
    "walrus",
    "whistle",
    "willow",
)


@lru_cache(maxsize=4)
def filler_sentences(data: str | None = None, haystack: str = "text") -> tuple[str, ...]:
    """The prose of ``data`` (default: the bundled encyclopedia) as sentences, headings
    (lines in = signs) left out; for the ``noise`` haystack, its one block."""
    if haystack == "noise":
        return (NOISE,)
    paragraphs = re.split(r"\n\s*\n", read_text(data, "encyclopedia"))
    prose = (" ".join(p.split()) for p in paragraphs if p.strip() and not p.strip().startswith("="))
    sentences = tuple(s for p in prose for s in _SENTENCE_END.split(p) if s)
    if not sentences:
        raise DataError(f"{data} holds no text to fill a haystack with")
    return sentences


@dataclass(frozen=True)
class Needle:
    text: str
    depth: float  # percent of the filler that comes before it


@dataclass(frozen=True)
class HaystackItem:
    """One generated item: the user turn is ``before + context + after``, the model's answer
    starts with ``answer_prefix``, and the output is scored against ``expected``."""

    needles: tuple[Needle, ...]
    before: str
    after: str
    answer_prefix: str
    expected: tuple[str, ...]
    end: int  # the filler's last sentence
    filler: tuple[str, ...] = ()  # the item's own filler lines (RULER's haystack of needles), if any


@dataclass(frozen=True)
class Prompt:
    text: str
    tokens: list[int]
    filler_words: int
    chars: dict[str, list[tuple[int, int]]]  # where the needles, the context and the question lie in text


SPANS = ("needle", "haystack", "context", "question")


def build_prompt(model: Model, item: HaystackItem, words: int, data: str | None = None, haystack: str = "text") -> Prompt:
    """The prompt of ``item`` with ``words`` words of filler: the model's chat template around
    the user turn (plain text for a model without one), then the answer prefix, as RULER
    appends it. The filler is the last ``words`` words of the text of ``data`` up to sentence
    ``item.end`` (going round when the text runs out), or of the noise block repeated, or the
    item's own filler lines, and the needles stand between its sentences (the noise's blocks
    and filler lines, one per line) at their depths. Text may start inside a sentence, like an
    excerpt; the others are whole blocks and lines, as RULER fits them."""
    sentences = item.filler or filler_sentences(data, haystack)
    picked: list[str] = []
    total = 0
    while total < words:  # backwards from the end, so that a word more is a token or so more
        picked.insert(0, sentences[(item.end - len(picked)) % len(sentences)])
        total += len(picked[0].split())
    if total > words and haystack == "text":
        picked[0] = " ".join(picked[0].split()[total - words :])
    # A needle goes at the sentence boundary nearest its depth in words; ties keep their order.
    bounds = np.cumsum([0] + [len(p.split()) for p in picked])
    places = sorted((int(np.abs(bounds - n.depth / 100 * words).argmin()), i) for i, n in enumerate(item.needles))
    pieces, needles, done = [], [], 0
    for at, i in places:
        pieces += picked[done:at]
        needles.append(len(pieces))
        pieces.append(item.needles[i].text)
        done = at
    context = (" " if haystack == "text" else "\n").join(pieces + picked[done:])
    task = item.before + context + item.after
    # A model without a chat template (a base model) reads the task as plain text, as RULER's base template does.
    text = (model.chat_prompt(task) if model.has_chat_template else task) + item.answer_prefix
    start = text.index(task) + len(item.before)  # the template holds the task as it is
    offsets = np.cumsum([start] + [len(p) + 1 for p in pieces])  # each piece and the space or newline after it
    chars = {
        "needle": [(int(offsets[i]), int(offsets[i]) + len(pieces[i])) for i in needles],
        "context": [(start, start + len(context))],
        "question": [(start + len(context), start + len(context) + len(item.after))],
    }
    return Prompt(text, model.tokenize(text, parse_special=True), words, chars)


def fit_prompt(model: Model, budget: int, item: HaystackItem, data: str | None = None, haystack: str = "text") -> Prompt:
    """The prompt of ``item`` with as much filler as ``budget`` tokens hold: whole words of
    text, so it falls short of the budget by a few tokens at most (whole blocks or lines of the
    other haystacks: by less than one)."""
    best = build_prompt(model, item, 0, data, haystack)
    if len(best.tokens) > budget:
        raise DataError(f"{budget} tokens cannot hold even the instructions and needles ({len(best.tokens)} tokens)")
    low, high = 0, budget  # every word is at least one token
    while low < high:
        mid = (low + high + 1) // 2
        prompt = build_prompt(model, item, mid, data, haystack)
        if len(prompt.tokens) <= budget:
            low, best = mid, prompt
        else:
            high = mid - 1
    return best


def key_word(rng: np.random.Generator) -> str:
    return f"{ADJECTIVES[rng.integers(len(ADJECTIVES))]}-{NOUNS[rng.integers(len(NOUNS))]}"


def distinct(make: Callable[[np.random.Generator], str], rng: np.random.Generator, n: int) -> list[str]:
    """``n`` different values drawn with ``make``, in the order drawn."""
    out: dict[str, None] = {}
    while len(out) < n:
        out[make(rng)] = None
    return list(out)


def number(rng: np.random.Generator, digits: int) -> str:
    return str(rng.integers(10 ** (digits - 1), 10**digits))


def uuid4(rng: np.random.Generator) -> str:
    return str(uuid.UUID(bytes=rng.bytes(16), version=4))


def random_depths(rng: np.random.Generator, n: int, low: float = 0, high: float = 100) -> list[float]:
    return sorted(float(d) for d in rng.uniform(low, high, n))


def string_match_all(output: str, expected: Sequence[str]) -> float:
    """RULER's score: the fraction of the expected strings found in the output, ignoring case."""
    found = output.lower()
    return sum(e.lower() in found for e in expected) / len(expected)


@dataclass(frozen=True)
class HaystackCell:
    length: int
    depth: int
    sample: int


@dataclass(frozen=True)
class LongContextOptions(Options):
    data: str | None = option(
        None, "Filler text (with --haystack text): a file, a folder of .txt files or hf:NAME. Default: the bundled encyclopedia.", only=("haystack", ("text",))
    )
    haystack: str = option("text", "Filler: text (--data, RULER's essays) or noise (RULER's repeated sentences).", choices=HAYSTACKS)
    limit: int | None = option(None, "Items to evaluate, spread over the grid (default: all).", minimum=1)
    lengths: tuple[int, ...] = option((1024, 2048, 4096), "Lengths in the model's tokens: prompt (chat template included) and answer.", minimum=64)
    depths: tuple[int, ...] = option((0, 25, 50, 75, 100), "Needle depths: percent of the filler before the needle.", minimum=0)
    samples: int = option(2, "Items per (length, depth) cell.", minimum=1, maximum=10_000)  # each cell's items are made before --limit
    data_seed: int = option(0, "Seed of the generated items (keys, values, filler), apart from the noise's --seed.", minimum=0)


class LongContextBenchmark(GenerationBenchmark):
    """A retrieval benchmark over a grid of (length, depth, sample) items. A subclass makes each
    item (``make_item``) and may score outputs its own way (``score_text``); prompts are fitted
    to their lengths once the model is known."""

    Options = LongContextOptions
    options: LongContextOptions
    spans = (*GenerationBenchmark.spans, *SPANS)
    primary = "accuracy"
    secondary = ("diverged",)
    higher_is_better = {"accuracy": True}
    # Each sequence holds a whole item's cells (about 23 KB each for SmolLM2) and, in the one
    # pool of cells that KIVI and eviction keep (kvinject/experiments/executor.py), every decode
    # attends over all occupied cells whichever sequence owns them; yet prompts are decoded one
    # at a time and only the few answer tokens share decodes. So past this many cells in all,
    # the default --parallel is lowered.
    cell_budget = 8192

    @abstractmethod
    def make_item(self, rng: np.random.Generator, cell: HaystackCell) -> HaystackItem:
        """The item of ``cell``, drawn from ``rng``."""

    @property
    def max_tokens(self) -> int:
        return self.options.max_tokens  # every subclass's options have it

    def needle_words(self) -> int:
        """The fewest words an item's needles and worked example take, from the options alone:
        each word is a token or more, so a length that cannot hold them is refused before any
        item is made (100,000 chains of variables took minutes to make, then did not fit)."""
        return 0

    def load(self) -> None:
        o = self.options
        if any(d > 100 for d in o.depths):
            raise DataError(f"{self.name}: depths are percentages from 0 to 100, got {max(o.depths)}")
        least, room = self.needle_words(), min(o.lengths) - self.max_tokens
        if room <= 0:
            raise DataError(f"{self.name}: length {min(o.lengths)} is too short with max_tokens {self.max_tokens}: give longer --lengths or fewer --max-tokens")
        if least > room:
            raise DataError(
                f"{self.name}: an item's needles take at least {least} tokens, more than length {min(o.lengths)} holds beside "
                f"{self.max_tokens} to generate: give fewer needles or longer --lengths"
            )
        grid = [HaystackCell(n, d, s) for n in o.lengths for d in o.depths for s in range(o.samples)]
        if o.limit is not None and o.limit < len(grid):
            grid = [grid[i] for i in np.unique(np.linspace(0, len(grid) - 1, o.limit).round().astype(int))]
        self.cells = grid
        # Seeded per cell and sample: an item is the same whatever else the grid holds.
        self.items = [self.make_item(np.random.default_rng([o.data_seed, c.length, c.depth, c.sample]), c) for c in grid]

    def __len__(self) -> int:
        return len(self.cells)

    @property
    def settings(self) -> dict[str, object]:
        o = self.options
        return {
            "data": o.data or "bundled:encyclopedia",
            "haystack": o.haystack,
            "items": len(self),
            "lengths": list(o.lengths),
            "depths": list(o.depths),
            "samples": o.samples,
            "data_seed": o.data_seed,
            "max_tokens": self.max_tokens,
        }

    def estimate_seconds(self, runs: int, speed: Speed) -> float:
        return runs * sum(speed.generation(1, c.length, self.max_tokens) for c in self.cells)

    def prepare(self, model: Model) -> None:
        too_long = max(self.options.lengths)
        if too_long > model.n_ctx_train:
            raise DataError(f"{self.name}: length {too_long} exceeds the training context of {model.path.name} ({model.n_ctx_train} tokens)")

    def prompts(self, model: Model) -> list[list[int]]:
        # The length counts the answer too, as RULER's max_seq_length does.
        self.fitted = []
        for cell, item in zip(self.cells, self.items):
            try:
                self.fitted.append(fit_prompt(model, cell.length - self.max_tokens, item, self.options.data, self.options.haystack))
            except DataError as e:
                raise DataError(f"{self.name}: length {cell.length} is too short with max_tokens {self.max_tokens}: {e}") from None
        return [p.tokens for p in self.fitted]

    def limits(self, prompts: list[list[int]]) -> tuple[int, int]:
        return self.max_tokens, max(map(len, prompts)) + self.max_tokens + 1

    def item_spans(self, model: Model) -> list[Spans]:
        return [with_haystack(token_spans(model, p.text, p.tokens, p.chars)) for p in self.fitted]

    def sequences(self, model: Model, per_seq: int) -> int:
        if model.backend.parallel is not None:
            return model.parallel
        return max(1, min(model.parallel, self.cell_budget // per_seq))

    def score(self, index: int, generation: Generation) -> float:
        return self.score_text(index, generation.text)

    def score_text(self, index: int, text: str) -> float:
        return string_match_all(text, self.items[index].expected)

    def summarize(self, scores: list[float]) -> tuple[dict[str, float], dict[str, list[float]]]:
        by_cell: dict[str, list[float]] = {}
        for cell, score in zip(self.cells, scores):
            by_cell.setdefault(cell_metric("accuracy", cell), []).append(score)
        return {"accuracy": float(np.mean(scores))} | {k: float(np.mean(v)) for k, v in by_cell.items()}, {"accuracy": scores}


def with_haystack(spans: dict[str, list[tuple[int, int]]]) -> dict[str, list[tuple[int, int]]]:
    """The haystack is the context's tokens that hold no needle."""
    ((at, stop),) = spans["context"]
    haystack = []
    for a, b in spans["needle"]:
        if a > at:
            haystack.append((at, a))
        at = max(at, b)
    if at < stop:
        haystack.append((at, stop))
    return {**spans, "haystack": haystack}


def cell_metric(metric: str, cell: HaystackCell) -> str:
    """Per-cell metrics are named METRIC@LENGTH/DEPTH (`kvinject report --heatmap` reads them)."""
    return f"{metric}@{cell.length}/{cell.depth}"


def filler_end(rng: np.random.Generator, data: str | None) -> int:
    """Where an item's text filler ends; drawn for the noise haystack too, so that an item's
    keys and values do not depend on its filler."""
    return int(rng.integers(len(filler_sentences(data))))
