"""Run a grid of cells into a results store: resumable, shardable, safe to kill, and shared
by several workers."""

from __future__ import annotations

import hashlib
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from ..benchmarks import Benchmark, RunResult, make_bench
from ..benchmarks.speed import Speed
from ..engine.model import CPU_PARALLEL, Model, Shape, file_sha256, resolve_model
from ..engine.options import BackendOptions
from ..exceptions import KvinjectError, SpecError
from .campaign import campaign_runs
from .executor import evaluate
from .grid import Cell, Grid, GridError, option_items
from .schemas import row_name, same_items
from .store import Claim, Store, Worker

# progress(name, total) makes a progress bar and returns its advance(n).
SweepProgress = Callable[[str, int], Callable[[int], None]]
# group_progress(bench, model, total): the same for one group of cells (a bench on a model).
GroupProgress = Callable[[Benchmark, str, int], Callable[[int], None]]


def parse_shard(text: str) -> tuple[int, int]:
    """'i/n' with 0 <= i < n (SLURM: --shard $SLURM_ARRAY_TASK_ID/$SLURM_ARRAY_TASK_COUNT)."""
    try:
        i, n = (int(x) for x in text.split("/"))
    except ValueError:
        raise KvinjectError(f"--shard takes i/n, e.g. 0/4, got '{text}'") from None
    if not 0 <= i < n:
        raise KvinjectError(f"--shard {text}: need 0 <= i < n")
    return i, n


def shard_of(cell: Cell, n: int) -> int:
    """Which of n shards holds the cell: its group's (a group shares a model, bench and seed,
    and its control), chosen by a hash of the group so the split does not depend on the file order."""
    return int(hashlib.sha256(repr(cell.group).encode()).hexdigest(), 16) % n


def shard_cells(cells: list[Cell], shard: tuple[int, int] | None) -> list[Cell]:
    """A deterministic 1/n of the cell groups (:func:`shard_of`)."""
    if shard is None:
        return cells
    i, n = shard
    return [c for c in cells if shard_of(c, n) == i]


@dataclass
class Planned:
    cell: Cell
    key: str
    runs: list[int]  # runs still to do


class Sweep:
    """The cells of a grid (or a shard of it) against one store, which other sweeps (processes
    on this machine) may share: see run.

    ``models`` are models already loaded, by the spec their cells name (the caller closes
    them), and ``benches`` benchmarks already made: `kvinject run` sweeps its own."""

    def __init__(
        self,
        grid: Grid,
        store: Store,
        shard: tuple[int, int] | None = None,
        claim_timeout: float = 60.0,
        poll: float = 2.0,
        models: Mapping[str, Model] | None = None,
        benches: Sequence[Benchmark] = (),
    ):
        self.grid = grid
        self.store = store
        self.cells = shard_cells(grid.cells, shard)
        self.worker = Worker()
        self.claim_timeout = claim_timeout  # seconds without a heartbeat after which a claim is taken over
        self.poll = poll  # seconds between looks at the store while everything left is claimed
        self._rows_checked = False
        self._controls = {c.group: c for c in self.cells if c.control}
        self._loaded = dict(models or {})
        self._sha = {spec: m.sha256 for spec, m in self._loaded.items()}
        self._shapes = {spec: m.shape for spec, m in self._loaded.items()}
        self._benches = {(b.name, option_items(b.options.given())): b for b in benches}

    def model_sha(self, spec: str) -> str:
        if spec not in self._sha:
            self._sha[spec] = file_sha256(resolve_model(spec))
        return self._sha[spec]

    def bench(self, cell: Cell) -> Benchmark:
        key = (cell.bench, cell.options)
        if key not in self._benches:
            try:
                self._benches[key] = make_bench(cell.bench, {k: list(v) if isinstance(v, tuple) else v for k, v in cell.options})
            except KvinjectError as e:  # a bad option value or data file: say which section
                raise GridError(f"{self.grid.path}: [bench.{cell.bench}] {e}") from None
        return self._benches[key]

    def shape(self, spec: str) -> Shape:
        """The model's layers, KV heads and their K and V widths, which configurations are checked against."""
        if spec not in self._shapes:
            with Model(spec, BackendOptions(n_gpu_layers=0)) as model:  # mmapped: the shape, not the weights
                self._shapes[spec] = model.shape
        return self._shapes[spec]

    def group_key(self, group: tuple) -> str:
        """What a claim names: the key of the group's control, which holds the model (by
        content), bench, options and seed, so workers with different grids agree on it."""
        control = self._controls[group]
        return control.key(self.model_sha(control.model))

    def plan(self) -> list[Planned]:
        """What is left of every cell; a cell the model cannot run (--layers or --heads beyond its own)
        fails here, before anything runs, as does a damaged run in the store (which a report could not read)."""
        if not self._rows_checked:
            # each row read as a report reads it: refused if damaged
            same_items((row_name(self.store.path, r["cell"], r["run"]), r) for r in self.store.records())
            self._rows_checked = True
        done = self.store.done()
        out = []
        for cell in self.cells:
            try:
                cell.config.check(self.shape(cell.model))
            except SpecError as e:
                raise GridError(f"{self.grid.path}: {cell.model}: {e}") from None
            key = cell.key(self.model_sha(cell.model))
            wanted = range(self.runs_of(cell))
            out.append(Planned(cell, key, [r for r in wanted if (key, r) not in done]))
        return out

    def runs_of(self, cell: Cell) -> int:
        """The runs a cell needs: the grid's, or for a configuration that places faults in a grid
        with a margin, enough for that many injections (items x runs); one where they would repeat."""
        bench = self.bench(cell)
        runs = cell.runs
        if cell.campaign is not None and cell.config.error.placed:
            runs = campaign_runs(*cell.campaign, len(bench))
        return bench.runs_needed(cell.config, runs)

    def injections(self, cell: Cell) -> int | None:
        """A configuration placing faults: its injections (items x runs); None for others."""
        return len(self.bench(cell)) * self.runs_of(cell) if cell.config.error.placed else None

    def claimed(self) -> dict[tuple, Claim]:
        """The claims on this sweep's groups, by group."""
        claims = self.store.claims()
        return {group: claims[key] for group in self._controls if (key := self.group_key(group)) in claims}

    def estimate_seconds(self, planned: list[Planned]) -> float:
        """Rough seconds on 2 CPU cores; generation at the grid's --parallel, else the CPU default.
        An eviction configuration after the first of its group that reads what it reads (with
        one sequence per context), or a fault campaign's after the first of its cache that places
        faults after the prompts, restores the prompts that one decoded (kvinject/engine/cache/prefills.py)."""
        parallel = self.grid.parallel or CPU_PARALLEL
        decoded: set[tuple] = set()
        total = 0.0
        for p in planned:
            error, cache = p.cell.config.error, p.cell.config.cache
            resident = error.resident
            if error.spares_prompt:
                key: tuple | None = (p.cell.group, cache, "spared")
            elif parallel == 1 and resident is not None and resident.shares_prefill:
                key = (p.cell.group, cache, resident.attention, resident.queries, resident.breaks_at)
            else:
                key = None
            total += self.bench(p.cell).estimate_seconds(len(p.runs), Speed(parallel, prompts=key is None or key not in decoded))
            decoded.add(key)
        return total

    def run(self, progress: SweepProgress | None = None, notice: Callable[[str], None] | None = None, stored: Callable[[str], None] | None = None) -> int:
        """Evaluate what is missing (:meth:`results`), with a bar for all cells and one per group;
        returns the number of runs written."""
        group = (lambda bench, model, total: progress(f"{bench.name} {Path(model).stem}", total)) if progress else None  # a path would crowd out the bar
        overall = (lambda total: progress("all cells (runs)", total)) if progress else None
        return sum(added for _, _, added in self.results(group, overall, notice, stored))

    def results(
        self,
        progress: GroupProgress | None = None,
        overall: Callable[[int], Callable[[int], None]] | None = None,
        notice: Callable[[str], None] | None = None,
        stored: Callable[[str], None] | None = None,
    ) -> Iterator[tuple[Cell, RunResult, bool]]:
        """Evaluate what is missing, group by group, in the grid's order; every finished run is
        stored at once, and yielded with its cell and whether it was stored now (a control
        evaluated again for the runs left of its group was stored before).

        A group is claimed in the store before it is computed, so that workers sharing the store
        split the work: each takes the first group with runs left that no live worker holds (a
        claim is taken over when its worker's process on this host is gone, or when its
        heartbeat, refreshed every claim_timeout/4 s, is older than claim_timeout). While
        everything left is claimed by others the worker waits, looking every ``poll`` seconds,
        since a claim may still be given up or expire; it returns when nothing is left.
        ``notice`` hears what it waits for and takes over, ``stored`` a line for each run stored
        with the runs left (for logs, where no progress bar shows); ``overall(total)`` makes the bar
        of all the runs left, which advances as they are stored, by this worker or by others."""
        notice = notice or (lambda message: None)
        total = sum(len(p.runs) for p in self.plan())  # hashes the models and reads the data before any lock
        bar = overall(total) if overall else (lambda n: None)
        shown = 0
        waiting: set[str] = set()

        def advance(n: int) -> None:
            nonlocal shown
            shown += n
            bar(n)

        def logged(line: str) -> None:
            if stored:
                left = total - shown
                stored(f"{line}; {left} run{'' if left == 1 else 's'} left")

        backend = BackendOptions(n_gpu_layers=self.grid.n_gpu_layers, threads=self.grid.threads, parallel=self.grid.parallel)
        models = dict(self._loaded)
        try:
            with self.store.heartbeat(self.worker, self.claim_timeout / 4):
                while True:
                    with self.store.transaction():
                        left, members, busy = self._claim(notice)
                    advance(total - left - shown)  # what others wrote meanwhile
                    if not left:
                        return
                    if not members:
                        if set(busy) != waiting:
                            notice(f"waiting: what is left is being computed by other workers ({'; '.join(busy)}); looking again every {self.poll:g} s")
                            waiting = set(busy)
                        time.sleep(self.poll)
                        continue
                    waiting = set()
                    yield from self._evaluate(members, models, backend, progress, advance, logged)
                    self.store.release(self.worker, self.group_key(members[0].cell.group))
        finally:
            self.store.release(self.worker)  # on Ctrl-C or an error: the others take over at once
            for spec, model in models.items():
                if spec not in self._loaded:
                    model.close()

    def _claim(self, notice: Callable[[str], None]) -> tuple[int, list[Planned], list[str]]:
        """Inside a transaction: the runs left, the members of the first group with runs left
        that this worker may take (now claimed by it, or none), and the other workers' live
        claims on the groups it skipped, described. Dead workers' claims are dropped on the
        way, also those on finished groups (a worker killed after its group's last run)."""
        planned = [p for p in self.plan() if p.runs]
        left = sum(len(p.runs) for p in planned)
        claims = self.store.claims()
        others = {key: c for key, c in claims.items() if c.worker != self.worker}
        dead = {key for key, c in others.items() if not c.alive(self.claim_timeout)}
        for key in dead:
            self.store.release(others[key].worker, key)
        busy = []
        groups: dict[tuple, list[Planned]] = {}
        for p in planned:
            groups.setdefault(p.cell.group, []).append(p)
        for group, members in groups.items():
            key, what = self.group_key(group), f"{group[1]} on {group[0]}, seed {group[3]}"
            if key in others:
                who = f"{others[key].worker.host}:{others[key].worker.pid}"
                if key not in dead:
                    busy.append(f"{what}: {who}")
                    continue
                notice(f"taking over {what} from {who}, which is gone or silent")
            self.store.claim(key, self.worker)
            return left, members, busy
        return left, [], busy

    def _evaluate(
        self,
        members: list[Planned],
        models: dict[str, Model],
        backend: BackendOptions,
        progress: GroupProgress | None,
        overall: Callable[[int], None],
        stored: Callable[[str], None],
    ) -> Iterator[tuple[Cell, RunResult, bool]]:
        """One group's missing runs, its control first, each yielded as it is stored."""
        cell0 = members[0].cell
        control = self._controls[cell0.group]
        model = models.get(cell0.model) or models.setdefault(cell0.model, Model(cell0.model, backend))
        bench = self.bench(cell0)
        bench.prepare(model)
        # The control comes first: divergence and KL divergence are measured against it. Where
        # its stored run holds what the comparisons need (a generation bench's tokens), it
        # stands for the control, which is not evaluated again.
        control_key = control.key(self.model_sha(control.model))
        stored_control = self.store.record(control_key, 0)
        golden = bench.golden(stored_control) if stored_control is not None else None
        # A control with randomness (a random error, sampling) has runs of its own to do too.
        own = next((p.runs for p in members if p.cell.control), [])
        plan = [(control.config, sorted({*own, *([0] if golden is None else [])}))] + [(p.cell.config, p.runs) for p in members if not p.cell.control]
        by_config = {p.cell.config: p for p in members}
        advance = progress(bench, cell0.model, bench.work(plan)) if progress else (lambda n: None)
        for result in evaluate(bench, model, plan, cell0.seed, advance, golden):
            p = by_config.get(result.config)
            key, cell = (p.key, p.cell) if p else (control_key, control)
            settings = cell.settings(self.model_sha(cell.model)) | {"model": cell.model, "control": cell.control, "label": cell.config.label}
            added = self.store.add(key, result.run, settings, result.to_dict(), self.worker)
            if not added and p is None and result.outputs is not None:  # a control stored without its tokens: they are now
                self.store.add_outputs(key, result.run, result.outputs)
            if p is not None and result.run in p.runs:  # not the control's run 0 evaluated again for its outputs
                overall(1)
            if added:  # not a control evaluated again for the runs left
                value = result.metrics.get(bench.primary, float("nan"))
                stored(
                    f"stored {bench.name} {Path(cell.model).name} {cell.config.label} run {result.run}: {bench.primary} {value:.4g} ({result.seconds:.0f} s)"
                )
            yield cell, result, added


def grid_summary(sweep: Sweep) -> list[dict[str, object]]:
    return [
        {
            "model": p.cell.model,
            "bench": p.cell.bench,
            "configuration": p.cell.config.label,
            "seed": p.cell.seed,
            "control": p.cell.control,
            "runs_left": len(p.runs),
            "key": p.key,
        }
        for p in sweep.plan()
    ]


def default_store(grid_path: Path, shard: tuple[int, int] | None) -> Path:
    suffix = f".shard{shard[0]}of{shard[1]}" if shard else ""
    return grid_path.with_suffix(f"{suffix}.results.sqlite")
