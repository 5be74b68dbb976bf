"""The results store of a sweep: one SQLite file, one row per finished (cell, run).

SQLite, because each insert is a transaction that survives SIGKILL (the journal rolls back a
half-written one), the primary key makes a repeated (cell, run) a no-op, and its file lock
lets several sweep processes write to one store safely. WAL mode keeps readers (a report run
while a sweep is going) from blocking the writer.

A store carries kvinject's application id and its schema version in the SQLite header, so a
foreign or damaged file is refused before anything is written to it. Workers sharing a store
claim a group of cells in the claims table before computing it (see Sweep.run).
"""

from __future__ import annotations

import json
import os
import secrets
import socket
import sqlite3
import tempfile
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Self

from ..exceptions import KvinjectError
from ..jsonutil import clean
from ..record_format import stamp
from .schemas import store_row

APPLICATION_ID = int.from_bytes(b"kvij", "big")
SCHEMA_VERSION = 1  # runs.worker and the claims table; the unstamped stores of earlier versions have neither
SQLITE_MAGIC = b"SQLite format 3\x00"
LOCK_SECONDS = 60.0  # how long a worker waits for another's lock on the store before it gives up
UNSTAMPED_COLUMNS = ["cell", "run", "settings", "record", "created"]  # runs of an unstamped store

# The runs table as earlier versions made it, then what schema 1 adds: a new store is made the
# way an unstamped one is adopted.
RUNS = """
CREATE TABLE runs (
    cell TEXT NOT NULL,
    run INTEGER NOT NULL,
    settings TEXT NOT NULL,
    record TEXT NOT NULL,
    created TEXT NOT NULL DEFAULT (datetime('now')),
    PRIMARY KEY (cell, run)
)
"""
UPGRADE = [
    "ALTER TABLE runs ADD COLUMN worker TEXT",  # who computed the run: host:pid:token
    "CREATE TABLE claims (grp TEXT PRIMARY KEY, host TEXT NOT NULL, pid INTEGER NOT NULL, token TEXT NOT NULL, heartbeat REAL NOT NULL)",
]


class StoreError(KvinjectError):
    """A file that is not a results store kvinject can use; the message names the path."""


@dataclass(frozen=True)
class Worker:
    """One sweep process; the token tells apart processes that reuse a pid."""

    host: str = field(default_factory=socket.gethostname)
    pid: int = field(default_factory=os.getpid)
    token: str = field(default_factory=lambda: secrets.token_hex(4))

    def __str__(self) -> str:
        return f"{self.host}:{self.pid}:{self.token}"


@dataclass(frozen=True)
class Claim:
    group: str
    worker: Worker
    heartbeat: float

    def alive(self, timeout: float) -> bool:
        """Heard from within the timeout and, on this host, its process still exists (a worker
        killed here is taken over at once; one on another host only when its heartbeat stops)."""
        if time.time() - self.heartbeat > timeout:
            return False
        if self.worker.host != socket.gethostname():
            return True
        try:
            os.kill(self.worker.pid, 0)
        except ProcessLookupError:
            return False
        except PermissionError:  # another user's process
            pass
        return True


class Store:
    """A results store. ``readonly`` opens an existing one with SQLite's ``mode=ro`` and never
    writes; otherwise the file is created and stamped if new, and adopted (stamped and given
    the claims table) if an earlier version wrote it unstamped."""

    def __init__(self, path: Path, readonly: bool = False):
        self.path = Path(path)
        memory = str(path) == ":memory:"
        if self.path.is_dir():
            raise StoreError(f"{path} is a folder, not a results store: give a file, such as {self.path / 'results.sqlite'}")
        if readonly and not self.path.is_file():
            raise StoreError(f"no results store at {path}")
        if not memory and self.path.is_file():
            with open(self.path, "rb") as f:
                head = f.read(len(SQLITE_MAGIC))
            if head != SQLITE_MAGIC and (readonly or head):  # an empty file becomes a new store
                raise StoreError(f"{path}: not a kvinject results store (not an SQLite file)")
        if not memory and not readonly:
            self.path.parent.mkdir(parents=True, exist_ok=True)
        target = f"{self.path.resolve().as_uri()}?mode=ro" if readonly else str(path)
        with self._errors():
            self._db = sqlite3.connect(target, uri=readonly, timeout=LOCK_SECONDS, isolation_level=None)
            try:
                self.unstamped = self._open(readonly)
            except BaseException:
                self._db.close()
                raise

    def _open(self, readonly: bool) -> bool:
        """Check the file is a store this version can use, before anything is written to it;
        returns whether it is (still) unstamped."""
        # One read transaction, one snapshot: read statement by statement, a worker stamping the
        # new store in between showed the identity of before and the tables of after, a foreign file.
        self._db.execute("BEGIN")
        try:
            kind = self._identify(readonly)
        finally:
            self._db.execute("COMMIT")
        problem = self._db.execute("PRAGMA quick_check").fetchone()[0]
        if problem != "ok":
            raise StoreError(f"{self.path}: damaged results store ({' '.join(problem.split())})")
        if readonly:
            return kind == "unstamped"
        if kind != "store":
            with self.transaction():  # another worker may be stamping it at the same moment
                kind = self._identify(readonly)
                if kind != "store":
                    self._db.execute(f"PRAGMA application_id = {APPLICATION_ID}")
                    self._db.execute(f"PRAGMA user_version = {SCHEMA_VERSION}")
                    for statement in ([RUNS] if kind == "empty" else []) + UPGRADE:
                        self._db.execute(statement)
        self._wal()
        self._db.execute("PRAGMA synchronous=FULL")  # a finished run is on disk before the next starts
        return False

    def _wal(self) -> None:
        """WAL mode, so that readers and workers do not block each other. SQLite refuses to change
        the journal mode while another connection holds the write lock, at once, without the busy
        wait it gives other statements: a worker that made a new store as another began a
        transaction on it tries again."""
        deadline = time.monotonic() + LOCK_SECONDS
        while True:
            try:
                self._db.execute("PRAGMA journal_mode=WAL")
                return
            except sqlite3.OperationalError as e:
                if e.sqlite_errorcode != sqlite3.SQLITE_BUSY or time.monotonic() > deadline:
                    raise
                time.sleep(0.01)

    def _identify(self, readonly: bool) -> str:
        """'store', 'unstamped' (an earlier version's store) or 'empty'; a StoreError for anything else."""
        app_id = self._db.execute("PRAGMA application_id").fetchone()[0]
        version = self._db.execute("PRAGMA user_version").fetchone()[0]
        tables = sorted(name for (name,) in self._db.execute("SELECT name FROM sqlite_master WHERE type = 'table'"))
        if app_id == APPLICATION_ID:
            if version > SCHEMA_VERSION:
                raise StoreError(
                    f"{self.path}: a results store of a newer kvinject (schema {version}; this one knows up to {SCHEMA_VERSION}): upgrade kvinject"
                )
            return "store"
        if app_id:
            raise StoreError(f"{self.path}: not a kvinject results store (an SQLite file of another application, id {app_id:#010x})")
        if tables == ["runs"] and [row[1] for row in self._db.execute("PRAGMA table_info(runs)")] == UNSTAMPED_COLUMNS:
            return "unstamped"
        if not tables and not version and not readonly:
            return "empty"
        raise StoreError(f"{self.path}: not a kvinject results store (an SQLite file with {'tables ' + ', '.join(tables) if tables else 'no tables'})")

    @contextmanager
    def _errors(self) -> Iterator[None]:
        """SQLite's errors as one line naming the file: a lock another process held too long, or a damaged file."""
        try:
            yield
        except sqlite3.DatabaseError as e:
            if e.sqlite_errorcode in (sqlite3.SQLITE_BUSY, sqlite3.SQLITE_LOCKED):
                raise StoreError(
                    f"{self.path}: another process has held the store's lock for over {LOCK_SECONDS:g} s ({e}): "
                    "end it (an open sqlite3 shell, a kvinject stopped with Ctrl-Z) and run again"
                ) from None
            raise StoreError(f"{self.path}: damaged or unreadable results store ({e})") from None

    def close(self) -> None:
        self._db.close()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    @contextmanager
    def transaction(self) -> Iterator[None]:
        """BEGIN IMMEDIATE: holds the write lock from the first read, so what is read (the done
        runs, the claims) is still true when the claim is written."""
        with self._errors():
            self._db.execute("BEGIN IMMEDIATE")
            try:
                yield
            except BaseException:
                if self._db.in_transaction:  # SQLite rolls back some failures itself
                    self._db.execute("ROLLBACK")
                raise
            self._db.execute("COMMIT")

    def done(self) -> set[tuple[str, int]]:
        with self._errors():
            return {(cell, run) for cell, run in self._db.execute("SELECT cell, run FROM runs")}

    def add(self, cell: str, run: int, settings: dict[str, Any], record: dict[str, Any], worker: Worker | None = None) -> bool:
        """Insert one finished run, stamped with its record format; False when it was already
        there (another process, a resume)."""
        with self._errors():
            cursor = self._db.execute(
                "INSERT OR IGNORE INTO runs (cell, run, settings, record, worker) VALUES (?, ?, ?, ?, ?)",
                (cell, run, json.dumps(clean(settings), sort_keys=True), json.dumps(clean(stamp(record))), worker and str(worker)),
            )
        return cursor.rowcount == 1

    def record(self, cell: str, run: int) -> dict[str, Any] | None:
        """One stored run's record, or None."""
        with self._errors():
            row = self._db.execute("SELECT record FROM runs WHERE cell = ? AND run = ?", (cell, run)).fetchone()
        return json.loads(row[0]) if row else None

    def add_outputs(self, cell: str, run: int, outputs: list[list[int]]) -> None:
        """Give a run stored without its generated tokens (record format 1) those of the same
        run evaluated again."""
        with self._errors():
            self._db.execute(
                "UPDATE runs SET record = json_set(record, '$.outputs', json(?)) WHERE cell = ? AND run = ? AND json_extract(record, '$.outputs') IS NULL",
                (json.dumps(outputs), cell, run),
            )

    def records(self) -> Iterator[dict[str, Any]]:
        with self._errors():
            for cell, run, settings, record in self._db.execute("SELECT cell, run, settings, record FROM runs ORDER BY rowid"):
                yield store_row(self.path, cell, run, settings, record)

    def dates(self) -> tuple[str, str]:
        """When its first and last run were written (UTC, as SQLite's datetime); empty where it holds none."""
        with self._errors():
            first, last = self._db.execute("SELECT min(created), max(created) FROM runs").fetchone()
        return first or "", last or ""

    def claims(self) -> dict[str, Claim]:
        if self.unstamped:  # opened read-only before any sweep adopted it: no claims table
            return {}
        with self._errors():  # a claims table dropped or damaged
            rows = self._db.execute("SELECT grp, host, pid, token, heartbeat FROM claims").fetchall()
        return {grp: Claim(grp, Worker(host, pid, token), heartbeat) for grp, host, pid, token, heartbeat in rows}

    def claim(self, group: str, worker: Worker) -> None:
        """Take the group, replacing a dead worker's claim; call inside transaction()."""
        self._db.execute("INSERT OR REPLACE INTO claims VALUES (?, ?, ?, ?, ?)", (group, worker.host, worker.pid, worker.token, time.time()))

    def release(self, worker: Worker, group: str | None = None) -> None:
        """Drop the worker's claim on the group, or all its claims."""
        with self._errors():
            self._db.execute(
                "DELETE FROM claims WHERE host = ? AND pid = ? AND token = ? AND (? IS NULL OR grp = ?)", (worker.host, worker.pid, worker.token, group, group)
            )

    @contextmanager
    def heartbeat(self, worker: Worker, every: float) -> Iterator[None]:
        """Refresh the worker's claims every ``every`` seconds from a thread (with its own
        connection), so that a long evaluation between two results keeps its claim."""
        stop = threading.Event()

        def beat() -> None:
            db = sqlite3.connect(self.path, timeout=LOCK_SECONDS, isolation_level=None)
            try:
                while not stop.wait(every):
                    try:
                        db.execute(
                            "UPDATE claims SET heartbeat = ? WHERE host = ? AND pid = ? AND token = ?", (time.time(), worker.host, worker.pid, worker.token)
                        )
                    except sqlite3.OperationalError:  # locked for a minute: try again at the next beat
                        pass
            finally:
                db.close()

        thread = threading.Thread(target=beat, name="kvinject-heartbeat", daemon=True)
        thread.start()
        try:
            yield
        finally:
            stop.set()
            thread.join()


@contextmanager
def temporary_store() -> Iterator[Store]:
    """A store in a folder of its own that is removed with it (`kvinject run` without --store)."""
    with tempfile.TemporaryDirectory(prefix="kvinject-run-") as folder, Store(Path(folder) / "run.results.sqlite") as store:
        yield store
