"""The results store: its identity (foreign, damaged and newer files are refused and left
untouched), adopting unstamped stores, and claims (liveness, takeover, waiting)."""

from __future__ import annotations

import hashlib
import json
import os
import signal
import socket
import sqlite3
import subprocess
import sys
import threading
import time

import pytest

from kvinject.cli import app as cli
from kvinject.experiments.grid import load_grid
from kvinject.experiments.store import APPLICATION_ID, RUNS, SCHEMA_VERSION, UPGRADE, Claim, Store, StoreError, Worker
from kvinject.experiments.sweep import Sweep
from tests.stored import RECORD, SETTINGS

GRID = """
[sweep]
models = ["{model}"]
runs = 1
seeds = [0, 1]

[bench.perplexity]
ctx = 64
chunks = 1
"""


def sha(path):
    return hashlib.sha256(path.read_bytes()).hexdigest()


def make_store(path, records=8):
    with Store(path) as store:
        for i in range(records):
            store.add(f"cell{i}", 0, {**SETTINGS, "i": i}, {**RECORD, "items": {"accuracy": [n % 2 for n in range(300)]}})
    return path


def sqlite_file(path, *statements):
    with sqlite3.connect(path) as db:
        for statement in statements:
            db.execute(statement)
    db.close()
    return path


def truncated(path):
    data = make_store(path).read_bytes()
    path.write_bytes(data[: len(data) // 2])
    return path


def overwritten(path):
    data = bytearray(make_store(path).read_bytes())
    data[4096 * 2 : 4096 * 3] = b"\xa5" * 4096  # a page of garbage in the middle
    path.write_bytes(bytes(data))
    return path


def newer(path):
    make_store(path)
    return sqlite_file(path, f"PRAGMA user_version = {SCHEMA_VERSION + 1}")


def written(data):
    def make(path):
        path.write_bytes(data)
        return path

    return make


BAD = {
    "text": (written(b"model,score\nsmollm2,0.5\n"), "not an SQLite file"),
    "empty": (written(b""), "not an SQLite file"),
    "truncated": (truncated, "damaged"),
    "overwritten": (overwritten, "damaged"),
    "other tables": (lambda p: sqlite_file(p, "CREATE TABLE results (x)"), "an SQLite file with tables results"),
    "no tables": (lambda p: sqlite_file(p, "PRAGMA user_version = 3"), "an SQLite file with no tables"),
    "other application": (lambda p: sqlite_file(p, "PRAGMA application_id = 42", "CREATE TABLE runs (x)"), "another application, id 0x0000002a"),
    "newer schema": (newer, f"newer kvinject (schema {SCHEMA_VERSION + 1}"),
}


def names(folder):
    """The files in folder but SQLite's side files, which any reader of a WAL-mode file makes."""
    return {p.name for p in folder.iterdir() if not p.name.endswith(("-wal", "-shm"))}


def run_cli(monkeypatch, capsys, *args):
    monkeypatch.setattr(sys, "argv", ["kvinject", *map(str, args)])
    handlers = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        with pytest.raises(SystemExit) as exit:
            cli.main()
    finally:  # the entry point ignores both as it ends, for the rest of its process: here, the tests'
        for s, handler in handlers.items():
            signal.signal(s, handler)
    out = capsys.readouterr()
    return exit.value.code, out.out, out.err


@pytest.mark.parametrize(
    "command,kind",
    # an empty file given to sweep becomes a store (test_an_empty_file_becomes_a_store)
    [(c, k) for c in ("report", "sweep", "sweep --dry-run") for k in BAD if (c, k) != ("sweep", "empty")],
)
def test_a_foreign_or_damaged_file_is_refused_in_one_line_and_left_unchanged(tmp_path, tiny_path, monkeypatch, capsys, command, kind):
    make, message = BAD[kind]
    path = make(tmp_path / "store.sqlite")
    before, files = sha(path), names(tmp_path)
    grid = tmp_path / "grid.toml"
    grid.write_text(GRID.format(model=tiny_path))
    args = ["report", path] if command == "report" else ["sweep", grid, "--store", path, *command.split()[1:]]
    code, _, err = run_cli(monkeypatch, capsys, *args)
    assert code == 2
    assert err.startswith(f"error: {path}: ") and message in err and err.count("\n") == 1, err
    assert sha(path) == before
    assert names(tmp_path) == files | {"grid.toml"}  # and nothing made beside it


def test_the_cli_process_prints_no_traceback(tmp_path):
    path = sqlite_file(tmp_path / "other.db", "CREATE TABLE t (x)")
    out = subprocess.run([sys.executable, "-m", "kvinject", "report", str(path)], check=False, capture_output=True, text=True, timeout=300)
    assert out.returncode == 2 and "Traceback" not in out.stderr
    assert out.stderr == f"error: {path}: not a kvinject results store (an SQLite file with tables t)\n"


def test_a_missing_store_is_named(tmp_path):
    with pytest.raises(StoreError, match="no results store at .*nothing.sqlite"):
        Store(tmp_path / "nothing.sqlite", readonly=True)
    assert not (tmp_path / "nothing.sqlite").exists()


def test_a_new_store_is_stamped(tmp_path):
    make_store(tmp_path / "s.sqlite")
    with sqlite3.connect(tmp_path / "s.sqlite") as db:
        assert db.execute("PRAGMA application_id").fetchone()[0] == APPLICATION_ID == int.from_bytes(b"kvij", "big")
        assert db.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION
        assert {n for (n,) in db.execute("SELECT name FROM sqlite_master WHERE type = 'table'")} == {"runs", "claims"}
    with Store(tmp_path / "s.sqlite", readonly=True) as store:
        assert len(list(store.records())) == 8


def test_a_store_without_its_claims_table_is_refused_in_one_line(tmp_path):
    """`sweep --store S --dry-run` on a store whose claims table was dropped ended in a traceback."""
    with Store(tmp_path / "s.sqlite"):
        pass
    with sqlite3.connect(tmp_path / "s.sqlite") as db:
        db.execute("DROP TABLE claims")
    db.close()
    with Store(tmp_path / "s.sqlite", readonly=True) as store, pytest.raises(StoreError, match=r"unreadable results store \(no such table: claims\)"):
        store.claims()


def test_an_empty_file_becomes_a_store(tmp_path):
    (tmp_path / "s.sqlite").touch()
    with Store(tmp_path / "s.sqlite") as store:
        assert store.add("cell", 0, {}, {})


def test_an_unstamped_store_is_read_as_it_is_and_adopted_by_a_sweep(tmp_path):
    """Stores written before stores were stamped: application id 0 and only the runs table."""
    path = tmp_path / "old.sqlite"
    insert = "INSERT INTO runs (cell, run, settings, record) VALUES ('c', 0, ?, ?)"
    with sqlite3.connect(path) as db:
        for statement in ("PRAGMA journal_mode=WAL", RUNS):
            db.execute(statement)
        db.execute(insert, (json.dumps(SETTINGS), json.dumps({**RECORD, "x": 1})))
    db.close()
    before = sha(path)
    with Store(path, readonly=True) as store:
        assert list(store.records()) == [{"cell": "c", "run": 0, "settings": SETTINGS, **RECORD, "x": 1}]
        assert store.claims() == {}
    assert sha(path) == before
    with Store(path) as store:
        assert store.add("c", 1, SETTINGS, {**RECORD, "x": 2}, Worker()) and not store.add("c", 0, {}, {})
    with sqlite3.connect(path) as db:
        assert db.execute("PRAGMA application_id").fetchone()[0] == APPLICATION_ID
        assert [w is None for (w,) in db.execute("SELECT worker FROM runs ORDER BY run")] == [True, False]
    with Store(path, readonly=True) as store:
        assert [r["x"] for r in store.records()] == [1, 2]


def test_a_claim_is_alive_while_its_heartbeat_is_fresh_and_its_process_exists(tmp_path):
    here, now = socket.gethostname(), time.time()
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    assert Claim("g", Worker(), now).alive(60)
    assert not Claim("g", Worker(), now - 61).alive(60)
    assert not Claim("g", Worker(here, dead.pid), now).alive(60)
    assert Claim("g", Worker("elsewhere", dead.pid), now).alive(60)  # another host's pids are not ours to check
    assert not Claim("g", Worker("elsewhere", os.getpid()), now - 61).alive(60)


def test_the_heartbeat_keeps_a_claim_fresh_while_the_worker_computes(tmp_path):
    me, other = Worker(), Worker("elsewhere", 1)
    with Store(tmp_path / "s.sqlite") as store:
        with store.transaction():
            store.claim("mine", me)
            store.claim("theirs", other)
        store._db.execute("UPDATE claims SET heartbeat = heartbeat - 120")
        with store.heartbeat(me, every=0.05):
            time.sleep(0.5)
        claims = store.claims()
    assert claims["mine"].alive(60) and not claims["theirs"].alive(60)


def test_a_sweep_takes_over_expired_claims_and_waits_for_live_ones(tmp_path, tiny_path):
    """Two groups (seeds 0 and 1), claimed by workers elsewhere: one silent for two minutes, one
    alive. The sweep takes the first at once and waits for the second until it goes silent."""
    grid = tmp_path / "grid.toml"
    grid.write_text(GRID.format(model=tiny_path))
    path = tmp_path / "s.sqlite"
    with Store(path) as store:
        sweep = Sweep(load_grid(grid), store, poll=0.05)
        silent, alive = (sweep.group_key(c.group) for c in sorted((c for c in sweep.cells if c.control), key=lambda c: c.seed))
        with store.transaction():
            store.claim(silent, Worker("elsewhere", 1, "a"))
            store.claim(alive, Worker("elsewhere", 2, "b"))
        store._db.execute("UPDATE claims SET heartbeat = heartbeat - 120 WHERE grp = ?", (silent,))
        notices = []

        def notice(message):
            notices.append(message)
            if message.startswith("waiting"):  # the live worker dies; its claim has to expire
                store._db.execute("UPDATE claims SET heartbeat = heartbeat - 120 WHERE grp = ?", (alive,))

        assert sweep.run(notice=notice) == 2
        taken, waited, taken_later = notices
        assert taken.startswith("taking over perplexity on") and "seed 0 from elsewhere:1," in taken
        assert waited.startswith("waiting") and "seed 1: elsewhere:2)" in waited
        assert taken_later.startswith("taking over") and "seed 1 from elsewhere:2," in taken_later
        assert store.claims() == {}
        workers = {w for (w,) in store._db.execute("SELECT worker FROM runs")}
        assert workers == {str(sweep.worker)}


def test_dry_run_shows_what_other_workers_compute(tmp_path, tiny_path, monkeypatch, capsys):
    grid = tmp_path / "grid.toml"
    grid.write_text(GRID.format(model=tiny_path))
    path = tmp_path / "s.sqlite"
    with Store(path) as store:
        sweep = Sweep(load_grid(grid), store)
        keys = [sweep.group_key(c.group) for c in sorted((c for c in sweep.cells if c.control), key=lambda c: c.seed)]
        with store.transaction():
            store.claim(keys[0], Worker())  # this process: alive
            store.claim(keys[1], Worker(socket.gethostname(), 2**22 + 1))  # beyond pid_max: gone
    before = sha(path)
    code, out, err = run_cli(monkeypatch, capsys, "sweep", grid, "--store", path, "--dry-run")
    assert code in (0, None), err
    assert f"{socket.gethostname()}:{os.getpid()}" in out and f"{socket.gethostname()}:{2**22 + 1} (expired)" in out
    assert "2 runs left, 1 of them being computed by workers now" in out
    assert sha(path) == before


def test_a_store_stamped_while_it_is_being_identified_opens(tmp_path, monkeypatch):
    """Two workers on a new store: one stamps it (identity, tables) between the other's reads of
    the identity and of the tables. The reader must see one state, not "application id 0 with
    the tables claims and runs", which it refused as a foreign file (seen in the kill test)."""
    path = tmp_path / "new.sqlite"
    connect = sqlite3.connect

    def stamp_midway(*args, **kwargs):
        db = connect(*args, **kwargs)
        stamped = []

        def trace(statement: str) -> None:
            if statement.startswith("PRAGMA user_version") and not stamped:  # the identity was read: now the other worker
                stamped.append(True)
                other = connect(path, timeout=0.2, isolation_level=None)
                try:
                    other.execute("BEGIN IMMEDIATE")
                    for sql in [f"PRAGMA application_id = {APPLICATION_ID}", f"PRAGMA user_version = {SCHEMA_VERSION}", RUNS, *UPGRADE]:
                        other.execute(sql)
                    other.execute("COMMIT")
                except sqlite3.OperationalError:  # the reader's snapshot holds it off: it stamps the store itself
                    other.execute("ROLLBACK")
                finally:
                    other.close()

        db.set_trace_callback(trace)
        return db

    monkeypatch.setattr("kvinject.experiments.store.sqlite3.connect", stamp_midway)
    with Store(path) as store:
        assert store.done() == set()
    assert stamped_store(path)


def stamped_store(path) -> bool:
    with sqlite3.connect(path) as db:
        return db.execute("PRAGMA application_id").fetchone()[0] == APPLICATION_ID and db.execute("PRAGMA quick_check").fetchone()[0] == "ok"


def test_a_new_store_locked_by_another_process_as_it_is_made_goes_on_in_wal_mode(tmp_path, monkeypatch):
    """SQLite refuses to change the journal mode while another connection holds the write lock, at
    once, without the busy wait it gives other statements: a worker that had just stamped a new
    store, as another worker (or the tests' poll) began a transaction on it, ended with "database
    is locked", reported as damage. It now waits for the lock."""
    path = tmp_path / "new.sqlite"
    connect = sqlite3.connect
    reader = connect(path, isolation_level=None, check_same_thread=False)
    timers = []

    class ReadBeforeWal(sqlite3.Connection):
        def execute(self, sql, *args):
            if sql == "PRAGMA journal_mode=WAL" and not timers:  # stamped, not yet in WAL mode: the other takes the write lock
                reader.execute("BEGIN IMMEDIATE")
                reader.execute("SELECT count(*) FROM runs").fetchone()
                timers.append(threading.Timer(0.3, reader.execute, ["COMMIT"]))
                timers[0].start()
            return super().execute(sql, *args)

    def read_before_wal(*args, **kwargs):
        return connect(*args, **kwargs, factory=ReadBeforeWal)

    monkeypatch.setattr("kvinject.experiments.store.sqlite3.connect", read_before_wal)
    try:
        with Store(path) as store:
            assert store._db.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
            assert store.done() == set()
    finally:
        timers[0].join()
        reader.close()
    assert stamped_store(path)


@pytest.mark.parametrize("step", ["open", "claim", "add"])
def test_a_lock_held_past_the_wait_is_named_as_a_lock(tmp_path, monkeypatch, step):
    """Another process holding the write lock longer than LOCK_SECONDS (an open sqlite3 shell, a
    worker stopped with Ctrl-Z): one line that says so, not "damaged" and not a traceback."""
    monkeypatch.setattr("kvinject.experiments.store.LOCK_SECONDS", 0.2)
    path = tmp_path / "s.sqlite"
    Store(path).close()
    if step == "open":
        path.unlink()
        path.touch()
    store = None if step == "open" else Store(path)
    holder = sqlite3.connect(path, isolation_level=None)
    holder.execute("BEGIN EXCLUSIVE")
    try:
        with pytest.raises(StoreError, match=r"another process has held the store's lock for over 0.2 s \(database is locked\): end it"):
            if step == "open":
                Store(path)
            elif step == "claim":
                with store.transaction():
                    store.claim("g", Worker())
            else:
                store.add("c", 0, SETTINGS, RECORD)
    finally:
        holder.execute("ROLLBACK")
        holder.close()
        if store:
            store.close()
