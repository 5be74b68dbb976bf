"""JSON output that strict parsers (jq, JavaScript) accept."""

from __future__ import annotations

import json
import math


def clean(obj: object) -> object:
    """NaN and ±Inf have no JSON form: write them as null (undefined: no values, or no error)."""
    if isinstance(obj, float):
        return obj if math.isfinite(obj) else None
    if isinstance(obj, dict):
        return {k: clean(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [clean(v) for v in obj]
    return obj


def dumps(obj: object) -> str:
    return json.dumps(clean(obj), indent=2, allow_nan=False)
