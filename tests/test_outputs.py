"""Every file a command writes is checked before any work (kvinject/cli/outputs.py: check_writable)
and written by way of a temporary sibling (kvinject/files.py), found by walking the command tree:
an output option added later is tested here without an edit, or the test says what it lacks."""

from __future__ import annotations

import errno
import itertools
import json
import os
import resource
import signal
from pathlib import Path

import pytest

from kvinject import files
from kvinject.cli.outputs import check_writable
from kvinject.exceptions import KvinjectError
from tests.cli_tree import WorkStarted, annotation, commands, empty_store, flag, invoke, is_option

INPUTS = {("score", "--responses")}  # Path options a command reads; every other Path option is written
GRID = "[bench.nexttoken]\nlimit = 1\n"


def base(command: str, output: str, tmp_path: Path, model: Path) -> list[object]:
    """The smallest valid `kvinject COMMAND` that ``output`` applies to, without it."""
    grid = tmp_path / "g.toml"
    grid.write_text(GRID)
    args = {
        "run": ["run", "--bench", "nexttoken", "--model", model],
        "profile": ["profile", "--error", "normal:0,0.5", "--bench", "nexttoken", "--model", model],
        "tune": ["tune", "--bits", "4", "--model", model],
        "divergence": ["divergence", "--error", "normal:0,0.5", "--prompt", "Hi", "--model", model],
        "report": ["report", empty_store(tmp_path)],
        "score": ["score", "ifeval", "--data", "x", "--responses", tmp_path / "r.jsonl"],
        "sweep": ["sweep", grid, *(["--slurm", "--dry-run"] if output == "--run-folder" else [])],
    }
    if command not in args:
        pytest.fail(f"kvinject {command} writes {output}: give its smallest valid command here, so that its outputs are checked")
    return args[command]


def outputs() -> list[tuple[str, str]]:
    return [
        (name, flag(p))
        for name, command in commands().items()
        for p in command.params
        if is_option(p) and annotation(p) is Path and (name, flag(p)) not in INPUTS
    ]


def test_the_walk_finds_the_outputs_of_every_command():
    found = set(outputs())
    assert {("run", "--output"), ("run", "--csv"), ("run", "--store"), ("report", "--plot"), ("sweep", "--run-folder"), ("profile", "--heatmap")} <= found


def bad_paths(tmp_path: Path) -> dict[str, tuple[Path, str]]:
    (tmp_path / "afile").write_text("kept")
    return {
        "a folder": (tmp_path, "is a folder"),
        "/proc": (Path("/proc/version"), "device or system file"),
        "a device": (Path("/dev/full"), "device or system file"),
        "a missing folder": (tmp_path / "missing" / "sub" / "x.out", "does not exist"),
        "under a file": (tmp_path / "afile" / "x.out", "afile is a file, not a folder"),
    }


@pytest.mark.parametrize("command,output", outputs())
@pytest.mark.parametrize("kind", ["a folder", "/proc", "a device", "a missing folder", "under a file"])
def test_every_output_is_checked_before_any_work(command, output, kind, tmp_path, tiny_path, no_work):
    path, message = bad_paths(tmp_path)[kind]
    args = base(command, output, tmp_path, tiny_path)
    if kind == "a missing folder" and (output in ("--store", "--run-folder")):
        return  # stores and run folders are made with the folders above them
    if kind == "a folder" and output == "--run-folder":
        return  # a run folder is one
    try:
        code, said = invoke([*args, output, path])
    except WorkStarted:
        pytest.fail(f"kvinject {command} {output} {path} started its work before checking {output}")
    assert code == 2 and message in said and str(path) in said, said
    assert (tmp_path / "afile").read_text() == "kept"


def pairs() -> list[tuple[str, str, str]]:
    by_command: dict[str, list[str]] = {}
    for command, output in outputs():
        by_command.setdefault(command, []).append(output)
    return [(command, a, b) for command, flags in by_command.items() for a, b in itertools.combinations(flags, 2)]


@pytest.mark.parametrize("command,first,second", pairs())
def test_no_two_outputs_of_a_command_are_one_file(command, first, second, tmp_path, tiny_path, no_work):
    """`run --output X --csv X` wrote the CSV over the JSON; a path spelled two ways is one file."""
    if "--run-folder" in (first, second):
        return  # --slurm takes no --store
    (tmp_path / "sub").mkdir()
    code, said = invoke([*base(command, first, tmp_path, tiny_path), first, tmp_path / "out", second, tmp_path / "sub" / ".." / "out"])
    assert code == 2 and "name the same file" in said, said


@pytest.mark.parametrize("output", ["--plot", "--heatmap", "--frontier", "--outcomes"])
def test_no_output_overwrites_an_input(output, tmp_path, no_work):
    store = empty_store(tmp_path)
    code, said = invoke(["report", store, output, store])
    assert code == 2 and "also read by this command" in said
    code, said = invoke(["score", "ifeval", "--data", "x", "--responses", store, "-o", store])
    assert code == 2 and "also read by this command" in said


def test_lm_eval_output_path_and_its_short_form_are_checked(tmp_path, monkeypatch):
    lm_eval = pytest.importorskip("lm_eval.__main__")
    monkeypatch.setattr(lm_eval, "cli_evaluate", lambda: pytest.fail("lm-eval ran before its output was checked"))
    (tmp_path / "afile").write_text("")
    for given in (["--output_path", "/proc/x"], ["-o", str(tmp_path / "afile")], [f"--output_path={tmp_path / 'afile' / 'r.json'}"]):
        code, said = invoke(["lm-eval", "--tasks", "kvinject_nextword", *given])
        assert code == 2 and "cannot write" in said, said


def test_an_unwritable_folder_is_found_by_trying(tmp_path):
    folder = tmp_path / "ro"
    folder.mkdir()
    folder.chmod(0o500)
    try:
        if os.access(folder, os.W_OK):
            pytest.skip("running as root: permissions do not stop a write")
        with pytest.raises(KvinjectError, match="takes no new file"):
            check_writable({"--output": folder / "x.json"})
        with pytest.raises(KvinjectError, match="takes no new file"):
            check_writable(stores={"--store": folder / "new" / "s.sqlite"})
    finally:
        folder.chmod(0o700)
    assert list(folder.iterdir()) == [], "the probe leaves nothing behind"


def test_standard_output_is_dash_where_a_flag_takes_it():
    check_writable({"--output": "-", "--csv": None}, stdout=["--output", "--csv"])
    with pytest.raises(KvinjectError, match="--plot -: this output cannot go to standard output"):
        check_writable({"--plot": "-"})
    with pytest.raises(KvinjectError, match="--output and --csv name standard output"):
        check_writable({"--output": "-", "--csv": "-"}, stdout=["--output", "--csv"])


def test_a_write_that_fails_leaves_the_file_as_it_was_and_keeps_the_text(tmp_path, monkeypatch):
    """A full disk, as the rename would meet it: the old file is whole, no temporary sibling is
    left, and the message names the file, the reason and where the text went."""
    path = tmp_path / "results.json"
    path.write_text("old")

    def full(src, dst):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(files.os, "replace", full)
    with pytest.raises(KvinjectError) as e:
        files.write_text(path, '{"new": 1}')
    message = str(e.value)
    assert message.startswith(f"cannot write {path}: No space left on device; what it would hold is in ")
    kept = Path(message.rsplit(" ", 1)[1])
    assert json.loads(kept.read_text()) == {"new": 1}
    kept.unlink()
    assert path.read_text() == "old" and sorted(p.name for p in tmp_path.iterdir()) == ["results.json"]


def test_a_file_too_large_for_the_process_fails_in_one_line(tmp_path):
    """A real failed write: RLIMIT_FSIZE makes write() fail with EFBIG past the limit (SIGXFSZ
    ignored), where the text cannot be kept either."""
    path = tmp_path / "big.txt"
    path.write_text("old")
    soft, hard = resource.getrlimit(resource.RLIMIT_FSIZE)
    handler = signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    resource.setrlimit(resource.RLIMIT_FSIZE, (1000, hard))
    try:
        with pytest.raises(KvinjectError, match=rf"cannot write {path}: File too large; nor could it be kept in "):
            files.write_text(path, "x" * 5000)
    finally:
        resource.setrlimit(resource.RLIMIT_FSIZE, (soft, hard))
        signal.signal(signal.SIGXFSZ, handler)
    assert path.read_text() == "old" and sorted(p.name for p in tmp_path.iterdir()) == ["big.txt"]


def test_a_run_whose_output_fails_keeps_its_results(tmp_path, tiny_path, monkeypatch):
    """`run --output` that cannot be written after the compute: one line, and the records are in
    the file it names."""
    output = tmp_path / "out.json"
    replace = os.replace

    def fails_for_the_output(src, dst):
        if Path(dst) == output:
            raise OSError(errno.EIO, os.strerror(errno.EIO))
        replace(src, dst)

    monkeypatch.setattr(files.os, "replace", fails_for_the_output)
    code, said = invoke(["run", "--bench", "nexttoken", "--limit", "2", "--runs", "1", "--model", tiny_path, "--output", output, "--format", "json"])
    assert code == 2 and said.startswith(f"cannot write {output}: Input/output error; what it would hold is in "), said
    kept = Path(said.rsplit(" ", 1)[1])
    assert {r["label"] for r in json.loads(kept.read_text())["records"]} == {"none"}
    kept.unlink()
    assert not output.exists()


@pytest.mark.parametrize("command,output", [(c, o) for c, o in outputs() if o in ("--plot", "--heatmap", "--frontier", "--outcomes")])
def test_a_figure_is_refused_before_any_work_where_its_suffix_names_no_format(command, output, tmp_path, tiny_path, no_work):
    """`report --outcomes kept.txt` drew the figure, then ended in matplotlib's ValueError."""
    try:
        code, said = invoke([*base(command, output, tmp_path, tiny_path), output, tmp_path / "figure.txt"])
    except WorkStarted:
        pytest.fail(f"kvinject {command} {output} figure.txt started its work before checking {output}")
    assert code == 2 and "a figure is written as png" in said, said


def test_a_file_output_never_replaces_a_results_store(tmp_path):
    """`run --csv S.results.sqlite` wrote its CSV over the store's results."""
    import sqlite3

    store = tmp_path / "s.results.sqlite"
    sqlite3.connect(store).execute("CREATE TABLE t (x)").connection.close()
    with pytest.raises(KvinjectError, match="it is a results store"):
        check_writable({"--csv": store})
    check_writable(stores={"--store": store})
