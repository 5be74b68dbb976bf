"""Which cached tokens get the error (``--positions``): position ranges and named spans.

A spec is a comma-separated union of terms: a position ``5``, a range ``0-3`` (both ends
included), an open range ``100-`` (from 100 on), the first N ``first:4`` (attention sinks;
the same as ``0-3``), and span names: ``prompt`` and ``generated`` for generation benchmarks,
and the spans a benchmark declares for each item (``needle``, ``haystack``, ``context``,
``question``). Positions are those of the tokens in their sequence, from 0.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Mapping, Sequence

import numpy as np

from ..exceptions import InjectionError, SpecError
from ..values import parse_int, split_list, unique

# The spans generate_all marks on every sequence it decodes.
GENERATION_SPANS = ("prompt", "generated")
MAX_POSITION = 2**31 - 1  # llama.cpp's positions are int32
_NAME = re.compile(r"[a-z][a-z_]*")

# A span: half-open [start, stop) token positions of one item.
Spans = Mapping[str, Sequence[tuple[int, int]]]


@dataclass(frozen=True)
class Positions:
    ranges: tuple[tuple[int, int | None], ...] = ()  # inclusive, sorted, merged; None: no end
    names: frozenset[str] = frozenset()

    @classmethod
    def parse(cls, text: str | None) -> Positions | None:
        """The selection ``text`` names; None, '' or 'all': no selection (every position)."""
        if text is None or text.strip().lower() in ("", "all"):
            return None
        ranges: list[tuple[int, int | None]] = []
        names: set[str] = set()
        for part in unique("--positions", [p.lower() for p in split_list("--positions", text)]):
            if _NAME.fullmatch(part):
                names.add(part)
                continue
            ranges.append(_range(text, part))
        return cls(_merge(ranges), frozenset(names))

    @property
    def spec(self) -> str:
        """The canonical spec: ranges in order, then the span names (generation spans first)."""
        ranges = [str(a) if a == b else f"{a}-" if b is None else f"{a}-{b}" for a, b in self.ranges]
        names = sorted(self.names, key=lambda n: (n not in GENERATION_SPANS, GENERATION_SPANS.index(n) if n in GENERATION_SPANS else 0, n))
        return ",".join(ranges + names)

    def check(self, where: str, declared: Sequence[str]) -> None:
        """Fail, in one line, for a span name that ``where`` (a benchmark) does not declare."""
        missing = sorted(self.names - set(declared))
        if missing:
            spans = f"its spans: {', '.join(declared)}" if declared else "it declares none; use positions such as 0-3 or first:4"
            raise SpecError(f"--positions '{self.spec}': {where} declares no span '{missing[0]}' ({spans})")

    def select(self, positions: np.ndarray, spans: Spans) -> np.ndarray:
        """Which of ``positions`` (of one sequence, whose item declared ``spans``) are selected."""
        keep = np.zeros(len(positions), bool)
        for a, b in self.ranges:
            keep |= (positions >= a) if b is None else (positions >= a) & (positions <= b)
        for name in self.names:
            if name not in spans:
                raise InjectionError(f"--positions names the span '{name}', which the item being decoded did not declare")
            for a, b in spans[name]:
                keep |= (positions >= a) & (positions < b)
        return keep


def _range(text: str, part: str) -> tuple[int, int | None]:
    bad = SpecError(f"bad --positions '{text}': '{part}' is not a position, a range A-B or A-, first:N or a span name")
    try:
        if part.startswith("first:"):
            first, last = 0, parse_int("first", part.removeprefix("first:")) - 1
        else:
            lo, sep, hi = part.partition("-")
            first = parse_int("position", lo)
            last = (parse_int("position", hi) if hi.strip() else None) if sep else first
    except SpecError:
        raise bad from None
    if max(first, last or 0) > MAX_POSITION:
        raise SpecError(f"bad --positions '{text}': '{part}' is beyond any position (at most {MAX_POSITION})")
    if first < 0 or (last is not None and last < first):
        raise SpecError(f"bad --positions '{text}': '{part}' selects no position (positions are >= 0, ranges A-B need A <= B, first:N N >= 1)")
    return first, last


def _merge(ranges: list[tuple[int, int | None]]) -> tuple[tuple[int, int | None], ...]:
    """Sorted, overlapping and adjacent ranges joined: one canonical form per selection."""
    out: list[list] = []
    for a, b in sorted(ranges, key=lambda r: r[0]):
        if out and (out[-1][1] is None or a <= out[-1][1] + 1):
            if out[-1][1] is not None and (b is None or b > out[-1][1]):
                out[-1][1] = b
        else:
            out.append([a, b])
    return tuple((a, b) for a, b in out)
