"""Passkey retrieval: a 5-digit key stated once in long filler text; exact match."""

from __future__ import annotations

import re
from dataclasses import dataclass

import numpy as np

from .haystack import HaystackCell, HaystackItem, LongContextBenchmark, LongContextOptions, Needle, filler_end, number
from .options import option

_NUMBER = re.compile(r"\d+")


@dataclass(frozen=True)
class PasskeyOptions(LongContextOptions):
    max_tokens: int = option(16, "Tokens generated per item.", minimum=1)


class Passkey(LongContextBenchmark):
    name = "passkey"
    summary = "Find a 5-digit pass key hidden at a depth of long filler text (exact match), per length and depth."
    Options = PasskeyOptions
    options: PasskeyOptions
    binary = frozenset({"accuracy"})

    def make_item(self, rng: np.random.Generator, cell: HaystackCell) -> HaystackItem:
        key = number(rng, 5)
        return HaystackItem(
            needles=(Needle(f"The pass key is {key}. Remember it. {key} is the pass key.", cell.depth),),
            before="A pass key is hidden in the text below. Find it and remember it: you will be asked for it afterwards.\n\n",
            # No answer prefix: SmolLM2-135M went on "The pass key is" with a definition more often
            # than with the key (5 items at 1K tokens: 3 of 5 found with it, 4 without).
            after="\n\nWhat is the pass key? Answer with the number only.",
            answer_prefix="",
            expected=(key,),
            end=filler_end(rng, self.options.data),
        )

    def score_text(self, index: int, text: str) -> float:
        """1 when the first number in the output is the key, else 0."""
        first = _NUMBER.search(text)
        return float(first is not None and first.group() == self.items[index].expected[0])
