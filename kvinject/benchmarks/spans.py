"""Token spans from character spans: which tokens of a prompt hold which part of its text.

Benchmarks build prompts from pieces (filler, needles, a question) and know where each piece
lies in the prompt's text; ``--positions`` selects tokens. The tokens' pieces (special tokens
written out) are laid end to end over the text, and a token belongs to every span its bytes
overlap. The tokenizer may put text before the prompt's (a BOS, a leading space); anything else
it changes (a normalizer) makes the prompt one that cannot be aligned, refused.
"""

from __future__ import annotations

from typing import Mapping, Sequence

import numpy as np

from ..engine.model import Model
from ..exceptions import DataError


def token_spans(model: Model, text: str, tokens: Sequence[int], chars: Mapping[str, Sequence[tuple[int, int]]]) -> dict[str, list[tuple[int, int]]]:
    """``chars``' spans of character offsets ``[start, stop)`` in ``text`` as spans of
    ``tokens`` (the tokens of ``text``), by name."""
    pieces = [model.piece(t, special=True) for t in tokens]
    data = text.encode()
    joined = b"".join(pieces)
    if not joined.endswith(data):
        raise DataError(f"the tokens of a prompt do not spell its text, so its spans cannot be found in them ({model.path.name}'s tokenizer changes the text)")
    ends = np.cumsum([len(p) for p in pieces]) - (len(joined) - len(data))  # byte offsets in text
    starts = ends - [len(p) for p in pieces]
    out: dict[str, list[tuple[int, int]]] = {}
    for name, spans in chars.items():
        out[name] = []
        for a, b in (s for s in spans if s[0] < s[1]):
            a, b = len(text[:a].encode()), len(text[:b].encode())
            lo, hi = int(np.searchsorted(ends, a, "right")), int(np.searchsorted(starts, b, "left"))
            if lo < hi:
                out[name].append((lo, hi))
    return out
