"""RULER's variable tracking: chains of assignments (``VAR B = VAR A``) hidden in long filler
text; the model lists every variable that holds the value the first chain starts with.
Scored as RULER scores it: the fraction of that chain's variables in the output.

The chain's first assignment sits at the cell's depth and its hops at random depths after
it; further chains (distractors, with other values) anywhere. As RULER's
(scripts/data/synthetic/variable_tracking.py): its template and answer prefix, its noise
haystack by default, and a worked example first, a whole smaller task of its noise with
3-letter variables, answered.
"""

from __future__ import annotations

import string
from dataclasses import dataclass
from itertools import pairwise

import numpy as np

from .haystack import (
    HAYSTACKS,
    NOISE,
    HaystackCell,
    HaystackItem,
    LongContextBenchmark,
    LongContextOptions,
    Needle,
    distinct,
    filler_end,
    number,
    random_depths,
)
from .options import option

_LETTERS = np.array(list(string.ascii_uppercase))
TASK = "Memorize and track the chain(s) of variable assignment hidden in the following text.\n\n"
QUESTION = "\nQuestion: Find all variables that are assigned the value {value} in the text above."
ANSWER = " Answer: According to the chain(s) of variable assignment in the text above, {n} variables are assigned the value {value}, they are: "
# RULER fits its worked example to 500 tokens: about this many noise blocks beside the template.
EXAMPLE_NOISE_BLOCKS = 16


@dataclass(frozen=True)
class VTOptions(LongContextOptions):
    haystack: str = option("noise", "Filler: noise (RULER's repeated sentences) or text (--data, RULER's essays).", choices=HAYSTACKS)
    chains: int = option(1, "Chains of assignments; all but the first are distractors.", minimum=1)
    hops: int = option(4, "Assignments after the first in each chain.", minimum=1)
    max_tokens: int = option(30, "Tokens generated per item.", minimum=1)


def variable(rng: np.random.Generator, letters: int = 5) -> str:
    return "".join(rng.choice(_LETTERS, letters))


def chain(names: list[str], value: str, noise: bool) -> list[str]:
    """A chain's statements as RULER writes them: a line each in the noise haystack (the hops
    with the trailing space its code leaves), sentences in text."""
    if noise:
        return [f"VAR {names[0]} = {value}"] + [f"VAR {b} = VAR {a} " for a, b in pairwise(names)]
    return [f"VAR {names[0]} = {value}."] + [f"VAR {b} = VAR {a}." for a, b in pairwise(names)]


def worked_example(rng: np.random.Generator, chains: int, hops: int) -> str:
    """RULER's demonstration: a task over noise blocks with each chain's statements in order at
    random lines, 3-letter variables and at most 10 hops, its answer after the prefix."""
    per_chain = min(10, hops) + 1
    names = distinct(lambda r: variable(r, 3), rng, per_chain * chains)
    values = distinct(lambda r: number(r, 5), rng, chains)
    lines = [NOISE] * EXAMPLE_NOISE_BLOCKS
    for i, value in enumerate(values):
        statements = chain(names[i * per_chain : (i + 1) * per_chain], value, noise=True)
        for j, at in enumerate(sorted(rng.choice(len(lines), len(statements), replace=False))):
            lines.insert(int(at) + j, statements[j])
    task = TASK + "\n".join(lines) + QUESTION.format(value=values[0]) + ANSWER.format(n=per_chain, value=values[0])
    return f"{task} {' '.join(names[:per_chain])}\n"


class VariableTracking(LongContextBenchmark):
    name = "vt"
    summary = "RULER's variable tracking: list the variables a chain of assignments gives a value, per length and depth."
    Options = VTOptions
    options: VTOptions

    def needle_words(self) -> int:
        """Each statement is 4 words or more (VAR A = 12345), the worked example's too."""
        o = self.options
        return 4 * o.chains * (o.hops + 1 + min(10, o.hops) + 1)

    def make_item(self, rng: np.random.Generator, cell: HaystackCell) -> HaystackItem:
        o = self.options
        per_chain, noise = o.hops + 1, o.haystack == "noise"
        names = distinct(variable, rng, per_chain * o.chains)
        values = distinct(lambda r: number(r, 5), rng, o.chains)
        chains = [names[i * per_chain : (i + 1) * per_chain] for i in range(o.chains)]
        needles = [Needle(s, d) for s, d in zip(chain(chains[0], values[0], noise), [float(cell.depth), *random_depths(rng, o.hops, cell.depth, 100)])]
        for names_c, value in zip(chains[1:], values[1:]):
            needles += [Needle(s, d) for s, d in zip(chain(names_c, value, noise), random_depths(rng, per_chain))]
        return HaystackItem(
            needles=tuple(needles),
            before=worked_example(rng, o.chains, o.hops) + "\n" + TASK,
            after=QUESTION.format(value=values[0]),
            answer_prefix=ANSWER.format(n=per_chain, value=values[0]),
            expected=tuple(chains[0]),
            end=filler_end(rng, o.data),
        )
