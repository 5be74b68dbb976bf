"""RULER-style needle in a haystack: "special magic" numbers or UUIDs filed under word keys,
hidden in long filler text; scored as RULER scores it (the fraction of the expected values
in the output).

Families, as RULER's: ``single`` (one needle), ``multikey`` (the queried needle among
distractor needles with other keys), ``multivalue`` (several values under the queried key,
all expected) and ``multiquery`` (several keys asked for at once). The queried needle (the
first one, where there are several) sits at the cell's depth; the others at random depths.
The prompt is RULER's niah template and answer prefix (scripts/data/synthetic/constants.py),
in the singular where one value is asked for, as its niah.py rewrites it. The ``needles``
haystack is RULER's ``type_haystack: needle``, lines of needles with other keys: with
``single``, RULER's niah_multikey_2, and with UUID keys and values its niah_multikey_3.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from ..exceptions import DataError
from .haystack import (
    ADJECTIVES,
    HAYSTACKS,
    NOUNS,
    HaystackCell,
    HaystackItem,
    LongContextBenchmark,
    LongContextOptions,
    Needle,
    distinct,
    filler_end,
    key_word,
    number,
    random_depths,
    uuid4,
)
from .options import option

FAMILIES = ("single", "multikey", "multivalue", "multiquery")
Draw = Callable[[np.random.Generator], str]


@dataclass(frozen=True)
class NiahOptions(LongContextOptions):
    family: str = option(
        "single", "single, multikey (distractor needles), multivalue (several values per key) or multiquery (several keys asked).", choices=FAMILIES
    )
    haystack: str = option(
        "text",
        "Filler: text (--data, RULER's essays), noise (RULER's repeated sentences) or needles (needles of other keys, RULER's multikey_2/3).",
        choices=(*HAYSTACKS, "needles"),
    )
    key_type: str = option("words", "Keys: adjective-noun words or UUIDs (RULER's multikey_3).", choices=("words", "uuids"))
    value_type: str = option("numbers", "Values: 7-digit numbers or UUIDs.", choices=("numbers", "uuids"))
    needles: int = option(4, "Needles of the multi- families: keys (multikey, multiquery) or values (multivalue).", minimum=2, only=("family", FAMILIES[1:]))
    max_tokens: int = option(128, "Tokens generated per item (RULER's tokens_to_generate).", minimum=1)


class Niah(LongContextBenchmark):
    name = "niah"
    summary = "RULER-style needles in a haystack (single, multikey, multivalue, multiquery), per length and depth."
    Options = NiahOptions
    options: NiahOptions

    @classmethod
    def pass_fail(cls, options: NiahOptions) -> frozenset[str]:
        """With one value asked (single, multikey), an item's accuracy is 0 or 1."""
        return cls.binary | ({"accuracy"} if options.family in ("single", "multikey") else set())

    def load(self) -> None:
        o = self.options
        if o.key_type == "words" and o.family in ("multikey", "multiquery") and o.needles > len(ADJECTIVES) * len(NOUNS):
            raise DataError(f"niah: {o.needles} needles need more keys than the {len(ADJECTIVES) * len(NOUNS)} word keys: use --key-type uuids")
        super().load()

    def needle_words(self) -> int:
        """A needle is 10 words or more (One of the special magic numbers for KEY is: VALUE.)."""
        return 10 * (1 if self.options.family == "single" else self.options.needles)

    def make_item(self, rng: np.random.Generator, cell: HaystackCell) -> HaystackItem:
        o = self.options
        n = 1 if o.family == "single" else o.needles
        n_keys = n if o.family in ("multikey", "multiquery") else 1
        n_values = n if o.family == "multivalue" else 1
        key = key_word if o.key_type == "words" else uuid4
        keys = distinct(key, rng, n_keys)

        def value(r: np.random.Generator) -> str:
            return number(r, 7) if o.value_type == "numbers" else uuid4(r)

        values = distinct(value, rng, n_keys * n_values)
        pairs = [(keys[i // n_values], v) for i, v in enumerate(values)]
        asked = keys if o.family == "multiquery" else keys[:1]
        expected = tuple(v for k, v in pairs if k in asked)
        plural = len(expected) > 1
        kind = o.value_type if plural else o.value_type[:-1]
        depths = [float(cell.depth), *random_depths(rng, len(pairs) - 1)]
        query = asked[0] if len(asked) == 1 else ", ".join(asked[:-1]) + ", and " + asked[-1]
        some, are, all_ = ("Some", "are", "are all") if plural else ("A", "is", "is")
        return HaystackItem(
            needles=tuple(Needle(needle(o.value_type, k, v), d) for (k, v), d in zip(pairs, depths)),
            before=(
                f"{some} special magic {kind} {are} hidden within the following text. Make sure to memorize it. I will quiz you about the {kind} afterwards.\n"
            ),
            after=f"\nWhat {all_} the special magic {kind} for {query} mentioned in the provided text?",
            answer_prefix=f" The special magic {kind} for {query} mentioned in the provided text {are}",
            expected=expected,
            end=filler_end(rng, o.data),
            filler=self.filler(rng, cell, key, value, keys) if o.haystack == "needles" else (),
        )

    def filler(self, rng: np.random.Generator, cell: HaystackCell, key: Draw, value: Draw, keys: list[str]) -> tuple[str, ...]:
        """RULER's haystack of needles: more lines than the length can hold (a needle is over 10
        tokens), each drawn on its own as RULER's are (a key may repeat: there are 2304 word
        keys), none with a key the item asks about or hides."""
        drawn = ((key(rng), value(rng)) for _ in range(cell.length // 10))
        return tuple(needle(self.options.value_type, k, v) for k, v in drawn if k not in keys)


def needle(value_type: str, key: str, value: str) -> str:
    return f"One of the special magic {value_type} for {key} is: {value}."
