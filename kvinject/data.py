"""Benchmark data: the project's own sets in bench_data/, local files, and Hugging Face datasets.

``--data`` takes a local path or ``hf:PATH[:CONFIG][@SPLIT]`` (``hf:google/IFEval``,
``hf:wikitext:wikitext-2-raw-v1@test``), loaded with the ``datasets`` library and cached by it.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any, Iterator

from .exceptions import DataError


def bench_data(name: str) -> Path:
    """A file or folder of the data that ships with kvinject: inside the installed package, or
    at the top of a source checkout (where an editable install leaves it)."""
    here = Path(__file__).resolve().parent
    for root in (here / "bench_data", here.parent / "bench_data"):
        if (root / name).exists():
            return root / name
    raise DataError(f"bundled data '{name}' is missing: reinstall kvinject")


def load_hf(spec: str) -> list[dict[str, Any]]:
    """Rows of ``hf:PATH[:CONFIG][@SPLIT]`` (default split: the only one, else 'test')."""
    match = re.fullmatch(r"hf:([^:@]+)(?::([^@]+))?(?:@(.+))?", spec)
    if not match:
        raise DataError(f"bad dataset '{spec}': use hf:PATH[:CONFIG][@SPLIT], e.g. hf:wikitext:wikitext-2-raw-v1@test")
    path, config, split = match.groups()
    try:
        import datasets
    except ImportError:
        raise DataError("hf: datasets need the datasets library: pip install datasets") from None
    try:
        loaded = datasets.load_dataset(path, config, split=split)
    except Exception as e:  # missing dataset, config, split or network: all end here for the user
        raise DataError(f"could not load {spec}: {e}") from e
    if isinstance(loaded, datasets.DatasetDict):
        if len(loaded) != 1 and "test" not in loaded:
            raise DataError(f"{spec} has splits {', '.join(loaded)}: name one with @SPLIT")
        loaded = loaded["test"] if "test" in loaded else next(iter(loaded.values()))
    return [dict(row) for row in loaded]


def read_jsonl(path: Path) -> Iterator[tuple[int, dict[str, Any]]]:
    """(line number, object) for each non-blank line; a bad line is a DataError naming it."""
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as e:
        raise DataError(f"cannot read {path}: {e.strerror}") from None
    except UnicodeDecodeError as e:
        line = path.read_bytes()[: e.start].count(b"\n") + 1
        raise DataError(f"{path}:{line}: not valid UTF-8") from None
    for number, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        try:
            obj = json.loads(line)
        except json.JSONDecodeError as e:
            raise DataError(f"{path}:{number}: bad JSON: {e.msg} at column {e.colno}") from None
        if not isinstance(obj, dict):
            raise DataError(f"{path}:{number}: expected a JSON object, got {type(obj).__name__}")
        yield number, obj


def read_text(source: str | None, default: str) -> str:
    """Plain text from a file, a folder of .txt files, an hf: dataset (its 'text' column) or the
    bundled ``default`` folder."""
    if source is not None and source.startswith("hf:"):
        rows = load_hf(source)
        if rows and "text" not in rows[0]:
            raise DataError(f"{source} has no 'text' column (columns: {', '.join(rows[0])})")
        return "".join(row["text"] for row in rows)
    path = Path(source) if source is not None else bench_data(default)
    if path.is_dir():
        parts = sorted(path.glob("*.txt"))
        if not parts:
            raise DataError(f"{path} holds no .txt files")
        return "\n\n".join(p.read_text(encoding="utf-8") for p in parts)
    try:
        return path.read_text(encoding="utf-8")
    except OSError as e:
        raise DataError(f"cannot read {path}: {e.strerror}") from None
    except UnicodeDecodeError as e:
        raise DataError(f"{path} is not UTF-8 text (byte {e.start})") from None
