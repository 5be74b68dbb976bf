"""Fault-campaign outcomes: each item of a run classified against the golden (control) run, as
fault-injection studies report them (PyTorchFI, TensorFI and LLM fault studies).

- ``due``: detected or unrecoverable: the item's logits held NaN or Inf at some step
  (``due_nonfinite``), an error was raised inside the hook while it decoded the item
  (``due_raised``), or the item was still generating at the campaign's time limit
  (``due_timeout``): the first of these, the cause, is recorded as its own 0/1 value;
- ``masked``: the output is token for token the control's;
- ``sdc``: silent data corruption, another output with a worse score on the bench's headline;
- ``benign``: another output, no worse a score.

Each is a per-item 0/1 value, so its rate comes with an interval over items as any binary
metric's (Wilson's for one run, which does not shrink to a point at 0 of n). The golden run has
no outcomes of its own, so there is no paired test or percent of control.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

# name -> higher is better
METRICS = {"masked": True, "benign": False, "sdc": False, "due": False}
# what made an item DUE (Benchmark.due); records before format 6 knew only nonfinite
CAUSES = ("nonfinite", "raised", "timeout", "ecc_detected")


def classify(
    control_tokens: Sequence[Sequence[int]],
    control_scores: Sequence[float],
    tokens: Sequence[Sequence[int]],
    scores: Sequence[float],
    due: Sequence[str],
    higher_is_better: bool,
) -> dict[str, list[float]]:
    """Per outcome, and per cause of DUE (``due_<cause>``) where any item is DUE, one 0/1 value
    per item; ``due`` holds each item's cause, "" for none."""
    out: dict[str, list[float]] = {name: [] for name in [*METRICS, *(f"due_{c}" for c in CAUSES)]}
    for golden, golden_score, own, score, cause in zip(control_tokens, control_scores, tokens, scores, due, strict=True):
        if cause:
            outcome = "due"
        elif list(own) == list(golden):
            outcome = "masked"
        elif math.isnan(score) or (score < golden_score if higher_is_better else score > golden_score):
            outcome = "sdc"
        else:
            outcome = "benign"
        for name in METRICS:
            out[name].append(float(name == outcome))
        for c in CAUSES:
            out[f"due_{c}"].append(float(cause == c))
    return out if any(due) else {name: out[name] for name in METRICS}
