"""The current speed figures: perf/measurements.json holds one entry per comparison (its ratio,
spread, n, target, date, commit, machine and the command that measured it); the perf/ scripts
write theirs with ``--record``, and the tables of docs/performance.md and the figures of
README.md are generated from the file between ``<!-- measurements SELECTION -->`` and
``<!-- end -->``. SELECTION is ``cpu`` or ``gpu`` (the whole table) or ``brief KEY ...`` (those
entries, fewer columns, for the README).

    python perf/measurements.py        # writes the generated tables of both files anew

tests/test_performance_page.py checks that the committed files are what this writes.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import re
import shlex
import statistics
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
FILE = ROOT / "perf" / "measurements.json"
PAGES = [ROOT / "docs" / "performance.md", ROOT / "README.md"]
GENERATED = re.compile(r"(<!-- measurements ([^\n]+) -->\n)(.*?)(<!-- end -->)", re.S)
SIGNS = {">=": "≥", "<=": "≤"}


def load() -> list[dict]:
    return json.loads(FILE.read_text())


def met(entry: dict) -> str:
    """Whether the ratio meets its target (``>=0.95``, ``<=1.1``); empty without one."""
    target = entry.get("target")
    if not target:
        return ""
    value, bound = float(entry["value"]), float(target[2:])
    return "met" if (value >= bound if target.startswith(">=") else value <= bound) else "**missed**"


def ratio(entry: dict) -> str:
    spread = entry.get("spread")
    return entry["value"] + (f" ({spread[0]}–{spread[1]})" if spread else "")


def target(entry: dict) -> str:
    t = entry.get("target")
    return SIGNS[t[:2]] + t[2:] if t else ""


def table(entries: list[dict], name: str) -> str:
    """The whole table of ``name`` (cpu, gpu), in the file's order."""
    rows = ["| comparison | ratio (min–max) | n | target | | measured | command |", "| --- | ---: | ---: | ---: | --- | --- | --- |"]
    for e in (e for e in entries if e["table"] == name):
        measured = f"{e['date']}, {e['commit']}, {e['machine']}"
        rows.append(f"| {e['comparison']} | {ratio(e)} | {e['n']} | {target(e)} | {met(e)} | {measured} | `{e['command']}` |")
    return "\n".join(rows)


def brief(entries: list[dict], keys: list[str]) -> str:
    """The entries named by ``keys``, in that order, with their ratio, target and when and where."""
    by_key = {e["key"]: e for e in entries}
    missing = [k for k in keys if k not in by_key]
    if missing:
        sys.exit(f"no measurement {', '.join(missing)} in {FILE.relative_to(ROOT)}")
    rows = ["| comparison | ratio (min–max) | target | | measured |", "| --- | ---: | ---: | --- | --- |"]
    for e in (by_key[k] for k in keys):
        rows.append(f"| {e['comparison']} | {ratio(e)} | {target(e)} | {met(e)} | {e['date']}, {e['machine']} |")
    return "\n".join(rows)


def render(selection: str, entries: list[dict]) -> str:
    name, *keys = shlex.split(selection)
    return brief(entries, keys) if name == "brief" else table(entries, name)


def regenerate(text: str, entries: list[dict]) -> str:
    """``text`` with every generated table written anew from ``entries``."""
    return GENERATED.sub(lambda m: m[1] + render(m[2], entries) + "\n" + m[4], text)


def model_label(model: str | None) -> str:
    """The model in a key: the bundled name, or a file's stem (``None`` is the default model)."""
    if model is None:
        return "smollm2"
    return Path(model).stem if model.endswith(".gguf") else model


def machine(gpu: bool) -> str:
    """The CPU's model and cores, and the GPU's name when the figures are a GPU's."""
    cpuinfo = Path("/proc/cpuinfo")  # Linux's; elsewhere the platform's own name
    names = [line.split(":", 1)[1].strip() for line in (cpuinfo.read_text() if cpuinfo.exists() else "").splitlines() if line.startswith("model name")]
    cpu = names[0] if names else platform.processor()
    text = f"{os.cpu_count()}-core {cpu}"
    if gpu:
        out = subprocess.run(["nvidia-smi", "--query-gpu=name", "--format=csv,noheader"], capture_output=True, text=True)
        text = f"{out.stdout.splitlines()[0].strip() if out.returncode == 0 and out.stdout else 'GPU'}, {text}"
    return text


def commit() -> str:
    out = subprocess.run(["git", "-C", str(ROOT), "describe", "--always", "--dirty", "--abbrev=7", "--match=none"], capture_output=True, text=True)
    return out.stdout.strip() or "unknown"


def add_record_flag(ap: argparse.ArgumentParser) -> None:
    ap.add_argument("--record", action="store_true", help=f"write the figures into {FILE.relative_to(ROOT)}, then run python perf/measurements.py")
    ap.add_argument("--machine", default=None, help="how --record names this machine (default: its CPU and cores, and its GPU)")


def record(args: argparse.Namespace, table: str, key: str, comparison: str, ratios: list[float], gpu: bool = False, n: int | None = None) -> None:
    """Upsert the entry ``table key`` with the median of ``ratios``, their min–max and count (or
    ``n``), today's date, this commit and machine and the command line that ran; an existing entry
    keeps its wording and target. Nothing without ``--record``."""
    if not args.record:
        return
    ordered = sorted(ratios)
    argv = [a for a in sys.argv[1:] if a != "--record"]
    if "--machine" in argv:
        del argv[argv.index("--machine") : argv.index("--machine") + 2]
    fields = {
        "value": f"{statistics.median(ordered):.3f}",
        "spread": [f"{ordered[0]:.3f}", f"{ordered[-1]:.3f}"] if len(ordered) > 1 else None,
        "n": n or len(ordered),
        "date": datetime.datetime.now(datetime.timezone.utc).date().isoformat(),
        "commit": commit(),
        "machine": args.machine or machine(gpu),
        "command": shlex.join(["python", f"perf/{Path(sys.argv[0]).name}", *argv]),
    }
    entries = load()
    full = f"{table} {key}"
    entry = next((e for e in entries if e["key"] == full), None)
    if entry is None:
        entry = {"key": full, "table": table, "comparison": comparison, "target": None}
        entries.append(entry)
    entry.update(fields)
    FILE.write_text(json.dumps(entries, indent=1, ensure_ascii=False) + "\n")
    print(f"recorded {full}: {fields['value']}")


def main() -> None:
    entries = load()
    for page in PAGES:
        page.write_text(regenerate(page.read_text(), entries))
        print(f"tables of {page.relative_to(ROOT)} written")


if __name__ == "__main__":
    main()
