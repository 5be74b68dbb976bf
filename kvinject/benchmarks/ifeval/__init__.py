"""IFEval (Zhou et al. 2023): instruction checkers and strict/loose scoring, standalone."""

from .instructions import INSTRUCTIONS, Instruction, build_instruction
from .scoring import IFEvalItem, PromptVerdict, exclude, loose_variants, metrics, read_items, read_responses, score, score_responses

__all__ = [
    "INSTRUCTIONS",
    "IFEvalItem",
    "Instruction",
    "PromptVerdict",
    "build_instruction",
    "exclude",
    "loose_variants",
    "metrics",
    "read_items",
    "read_responses",
    "score_responses",
    "score",
]
