"""The results store of a sweep: one SQLite file, one row per finished (cell, run).

SQLite, because each insert is a transaction that survives SIGKILL (the journal rolls back a
half-written one), the primary key makes a repeated (cell, run) a no-op, and its file lock
lets several sweep processes write to one store safely. WAL mode keeps readers (a report run
while a sweep is going) from blocking the writer.
"""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path
from typing import Any, Iterator

from .jsonutil import clean

SCHEMA = """
CREATE TABLE IF NOT EXISTS runs (
    cell TEXT NOT NULL,
    run INTEGER NOT NULL,
    settings TEXT NOT NULL,
    record TEXT NOT NULL,
    created TEXT NOT NULL DEFAULT (datetime('now')),
    PRIMARY KEY (cell, run)
)
"""


class Store:
    def __init__(self, path: Path):
        self.path = Path(path)
        if str(path) != ":memory:":
            self.path.parent.mkdir(parents=True, exist_ok=True)
        self._db = sqlite3.connect(self.path, timeout=60, isolation_level=None)
        self._db.execute("PRAGMA journal_mode=WAL")
        self._db.execute("PRAGMA synchronous=FULL")  # a finished run is on disk before the next starts
        self._db.execute(SCHEMA)

    def close(self) -> None:
        self._db.close()

    def __enter__(self) -> Store:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def done(self) -> set[tuple[str, int]]:
        return {(cell, run) for cell, run in self._db.execute("SELECT cell, run FROM runs")}

    def add(self, cell: str, run: int, settings: dict[str, Any], record: dict[str, Any]) -> bool:
        """Insert one finished run; False when it was already there (another process, a resume)."""
        cursor = self._db.execute(
            "INSERT OR IGNORE INTO runs (cell, run, settings, record) VALUES (?, ?, ?, ?)",
            (cell, run, json.dumps(clean(settings), sort_keys=True), json.dumps(clean(record))),
        )
        return cursor.rowcount == 1

    def records(self) -> Iterator[dict[str, Any]]:
        for cell, run, settings, record in self._db.execute("SELECT cell, run, settings, record FROM runs ORDER BY rowid"):
            yield {"cell": cell, "run": run, "settings": json.loads(settings), **json.loads(record)}
