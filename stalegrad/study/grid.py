"""Grids of runs: ``stalegrad grid FILE.toml --out DIR``, seeded and resumable.

The file has four tables (experiments/README.md says more; [protocol]: ``report_protocol.py``)::

    [fixed]          # options of `stalegrad train`, keys as in --config (- or _): one value each
    dataset = "fashion-mnist"
    epochs = 4
    [axes]           # lists; the grid is their Cartesian product
    algos = ["sgd", "asgd", "dcasgd-a"]   # or algo
    workers = [4, 8, 16]
    seeds = [0, 1, 2]                     # or seed
    lam0 = [1.0, 2.0]                     # any algorithm parameter or train option
    [report]         # target, baseline, time_model: for the report written at the end (stalegrad.study.report)
    target = 0.85
    [protocol]       # select on validation (--val-split) over seeds 0-2, report test accuracy on 3-9
    select_seeds = [0, 1, 2]
    report_seeds = [3, 4, 5, 6, 7, 8, 9]

The options in ``REFUSED`` are the grid's to decide; a key is fixed or an axis, not both; ``hidden`` and
``lr_milestones`` take a list as one value, so as axes lists of lists (``hidden = [[256, 128], [512]]``).

Expansion: the product in the order the axes are written (the last varies fastest); sgd runs with 1
worker, once, whatever ``workers`` says; an algorithm parameter (``window``, ``lam0``, ...) applies
only to the algorithms that have it, the others running once per value of the other axes; identical
cells are one; a parameter no algorithm has is an error; every cell is checked as ``stalegrad train``
checks it before anything runs.

Names: the algorithm and a part for every axis that applies to the cell, joined by ``-``, e.g.
``asgd-M8-lr0.1-gamma2-s0`` (``grid_names.cell_name`` and experiments/README.md give the rules).

DIR holds ``runs/<cell>/``, ``cells/<cell>.toml`` (its --config), ``logs/<cell>.log`` (its stderr) and
``grid.json`` (every cell's options, ``status``, ``exit_code``, ``run_s``, ``reason``), rewritten atomically
after every cell (a disk too full for it stops the grid with one line, ``RunError``). A rerun skips the cells
whose run is finished: it holds summary.json, which a run writes last, and model.pt (``results.is_finished``),
and its summary.json is one a run writes (``results.read_summary``; ``cli/grid.py``: ``plan``).
"""
from __future__ import annotations

import contextlib
import itertools
import os
import re
import signal
import subprocess
import sys
import tempfile
import time
import tomllib
from dataclasses import dataclass, field
from pathlib import Path

from ..errors import RunError, UsageError
from .grid_names import canonical, cell_name, toml_value
from .report_protocol import grid_protocol
from .report_time import grid_time_model
from ..run.files import JSONL_LIMIT, UnreadableFile, disk_full, loads_json, loads_toml, read_text
from ..run.option_files import config_values, option_defaults, value_problem
from ..run.options import ALGO_FLAGS, TRAIN_OPTIONS, check_options
from ..run.results import DamagedRun, atomic_write, is_finished, last_line, read_summary, write_json

ALIASES = {"algos": "algo", "seeds": "seed"}
REFUSED = {"out": "the grid writes each run into DIR/runs/<cell>", "resume": "rerun the grid to resume it",
           "overwrite": "the grid reruns unfinished cells itself", "quiet": "runs of a grid are quiet",
           "config_file": "the grid is the configuration", "record_trace": "it records one run: use 'stalegrad train'",
           "tensorboard": "give 'stalegrad grid --tensorboard DIR': each run logs into DIR/<cell>"}
REPORT_KEYS = ("target", "baseline", "time_model")
GRID_FILE_LIMIT = 4 * 2**20   # a grid file is written by hand: a few KiB
# `stalegrad train` in a child (the command as `python -m stalegrad` runs it), answering SIGINT (_stop) even when the
# grid runs in the background (nohup, `&`), which ignores SIGINT and would pass that on (preexec_fn could lose a
# Ctrl-C at fork).
CHILD = ("import runpy, signal; signal.signal(signal.SIGINT, signal.default_int_handler); "
         "runpy.run_module('stalegrad', run_name='__main__', alter_sys=True)")


@dataclass
class Cell:
    """One run of a grid: its ``name`` (``grid_names.cell_name``), its algorithm, the values of the axes that apply
    to it, and its ``options`` for ``stalegrad train`` (``toml``: its --config file)."""
    name: str
    algo: str
    axes: dict                 # the axis values that apply to this cell
    options: dict              # everything the run is given (python names, TOML values)
    params: dict = field(default_factory=dict, repr=False)   # as `train` parses them (after validation)

    @property
    def toml(self) -> str:
        return "".join(f"{k} = {toml_value(v)}\n" for k, v in self.options.items())


@dataclass
class Grid:
    """A grid file parsed, expanded and checked (``load_grid``): its [fixed], [axes] and [report] tables, its cells."""
    path: Path
    fixed: dict
    axes: dict
    report: dict
    cells: list


def _train_options() -> tuple[dict, dict]:
    """The options of ``stalegrad train`` by name, and their names by flag (without its dashes)."""
    return {o.name: o for o in TRAIN_OPTIONS}, {f.lstrip("-"): o.name for o in TRAIN_OPTIONS for f in o.flags}


def _takes_list(option) -> bool:   # (hidden, lr_milestones)
    return option.kind in ("ints", "numbers")


def _check_value(where: str, key: str, v, option):
    """A value of ``option`` in the grid file, typed as ``stalegrad train --config`` wants it, as the run records it."""
    if isinstance(v, list) and not _takes_list(option):
        raise UsageError(f"{where} {key} is a list: put it in [axes] to make it an axis" if "[fixed]" in where
                         else f"{where} {key}: each value must be a single value, not {v!r}")
    if (problem := value_problem(option, v)) is not None:
        raise UsageError(f"{where} {key} {problem}")
    return canonical(option.name, v)


def parse(path: str | os.PathLike) -> tuple[dict, dict, dict]:
    """(fixed, axes, report) of a grid file, keys as the option names of ``stalegrad train``."""
    try:
        table = loads_toml(read_text(path, GRID_FILE_LIMIT))
    except FileNotFoundError as e:
        raise UsageError(f"{path}: cannot read it ({e.strerror})") from None
    except UnreadableFile as e:
        raise UsageError(f"{path}: {e.reason}; a grid file is a TOML file") from None
    except tomllib.TOMLDecodeError as e:
        raise UsageError(f"{path}: not valid TOML ({e})") from None
    for key, value in table.items():
        if key not in ("fixed", "axes", "report", "protocol") or not isinstance(value, dict):
            raise UsageError(f"{path}: unknown table or key {key!r}; the tables are [fixed], [axes], [report] and "
                             "[protocol]")
    by_name, flags = _train_options()
    fixed, axes = {}, {}
    for section, out in (("fixed", fixed), ("axes", axes)):
        where = f"{path}: [{section}]"
        for key, value in table.get(section, {}).items():
            k = ALIASES.get(key, key)
            name = flags.get(k.replace("_", "-"), k.replace("-", "_"))
            if name in REFUSED:
                raise UsageError(f"{where} {key}: not an option of a grid ({REFUSED[name]})")
            if name not in by_name:
                known = ", ".join(sorted({*(n for n in by_name if n not in REFUSED), *ALIASES}))
                raise UsageError(f"{where} unknown key {key!r}; keys are {known}")
            if name in fixed or name in out:
                raise UsageError(f"{where} {key}: {name} is given twice (fixed or an axis, not both)")
            if section == "fixed":
                value = _check_value(where, key, value, by_name[name])
            else:
                if not isinstance(value, list):
                    shown = toml_value(value) if isinstance(value, (int, float, str, bool)) else "VALUE, ..."
                    raise UsageError(f"{where} {key} must be a list of values, e.g. {key} = [{shown}]; "
                                     "or put it in [fixed]")
                if not value:
                    raise UsageError(f"{where} {key} is empty: list at least one value")
                for v in value:
                    if _takes_list(by_name[name]) and not isinstance(v, list):
                        raise UsageError(f"{where} {key}: each value is a list, e.g. {key} = [[256, 128], [512]]")
                value = [_check_value(where, key, v, by_name[name]) for v in value]
                dup = next((v for i, v in enumerate(value) if v in value[:i]), None)
                if dup is not None:
                    raise UsageError(f"{where} {key} lists {toml_value(dup)} twice")
            out[name] = value
    report = dict(table.get("report", {}))
    if unknown := [k for k in report if k not in REPORT_KEYS]:
        raise UsageError(f"{path}: [report] unknown key {unknown[0]!r}; keys are {', '.join(REPORT_KEYS)}")
    if not isinstance(baseline := report.get("baseline", ""), str):
        raise UsageError(f"{path}: [report] baseline must be an algorithm's name (a string), not {baseline!r}")
    if isinstance(target := report.get("target", 1), bool) or not isinstance(target, (int, float)) or not 0 < target <= 1:
        raise UsageError(f"{path}: [report] target must be a test accuracy in (0, 1], got {target!r}")
    grid_time_model(path, report)   # [report] time_model: read and checked now, not after the cells ran
    if "protocol" in table:   # report_protocol.py: select_seeds, report_seeds, tune, arms, compare, closure
        algos = axes.get("algo", [fixed.get("algo", by_name["algo"].default)])
        report["protocol"] = grid_protocol(path, table["protocol"], fixed, axes, algos)
    return fixed, axes, report


def expand(path, fixed: dict, axes: dict) -> list[Cell]:
    """The cells of the grid (see the module docstring), in the order of the product."""
    from ..algorithms import ALGORITHMS, renamed
    by_name, _ = _train_options()
    algos = axes.get("algo", [fixed.get("algo", by_name["algo"].default)])
    for a in (a for a in algos if a not in ALGORITHMS):
        raise UsageError(f"{path}: unknown algorithm {a!r}; choose from {', '.join(ALGORITHMS)}")
    owns = {a: {f.name for f in ALGORITHMS[a].hyperparameters()} for a in algos}
    for key in [*fixed, *axes]:
        if key in ALGO_FLAGS and not any(key in own for own in owns.values()):
            takers = [n for n, c in ALGORITHMS.items() if key in {f.name for f in c.hyperparameters()}]
            new = next((renamed(ALGORITHMS[a], key) for a in algos if renamed(ALGORITHMS[a], key)), None)
            hint = f"; for {', '.join(algos)} it is called {new}" if new else ""
            raise UsageError(f"{path}: {key} is a parameter of {', '.join(takers)}, and none of the grid's "
                             f"algorithms ({', '.join(algos)}) has it{hint}")
    cells: dict[str, Cell] = {}
    for combo in itertools.product(*axes.values()):
        values = dict(zip(axes, combo))
        algo = values.get("algo", algos[0])
        keep = lambda k: k not in ALGO_FLAGS or k in owns[algo]   # noqa: E731
        applied = {k: v for k, v in values.items() if keep(k)}
        options = {"algo": algo, **{k: v for k, v in fixed.items() if keep(k) and k != "algo"},
                   **{k: v for k, v in applied.items() if k != "algo"}}
        if ALGORITHMS[algo].sequential:   # one worker, once
            options.update({"workers": 1} if "workers" in options else {})
            applied.update({"workers": 1} if "workers" in applied else {})
        cell = Cell(cell_name(algo, applied), algo, applied, options)
        other = cells.setdefault(cell.name, cell)
        if other.options != cell.options:
            raise UsageError(f"{path}: two cells are both named {cell.name} ({other.axes} and {cell.axes}); "
                             "make the axis values print differently")
    return list(cells.values())


def train_params(cell_toml: Path) -> tuple[str, dict]:
    """(algorithm, params) exactly as ``stalegrad train --config CELL_TOML`` builds them: every option's default,
    and the file's values over them."""
    params = {k: v for k, v in option_defaults(TRAIN_OPTIONS).items() if k not in ("out", "resume", "config_file")}
    params.update(config_values(str(cell_toml), "train", TRAIN_OPTIONS))
    params.pop("out", None)
    return params.pop("algo"), params


def load_grid(path: str | os.PathLike, here: bool = True) -> Grid:
    """Parse, expand and validate a grid file; every mistake is one ``UsageError`` line. ``here=False``
    (a dry run) accepts a CUDA device that this machine lacks (the file is for another machine)."""
    fixed, axes, report = parse(path)
    cells = expand(path, fixed, axes)
    baseline = report.get("baseline")
    if baseline is not None and baseline not in {c.algo for c in cells}:
        raise UsageError(f"{path}: [report] baseline {baseline!r} is not one of the grid's algorithms "
                         f"({', '.join(dict.fromkeys(c.algo for c in cells))})")
    with tempfile.TemporaryDirectory(prefix="stalegrad-grid-") as tmp:
        f = Path(tmp) / "cell.toml"
        for cell in cells:
            # a new file each time: rewriting one in place makes ext4 flush it at every truncation (2-5 ms a
            # cell, a minute of a 6800-cell grid's start)
            f.unlink(missing_ok=True)
            f.write_text(cell.toml)
            try:
                _, cell.params = train_params(f)
                gpu = not here and re.fullmatch(r"cuda(:\d+)?", str(cell.params["device"]))
                check_options(cell.algo, dict(cell.params, device="cpu") if gpu else cell.params)
            except UsageError as e:
                msg = " ".join(str(e).replace(f"{f}: ", "").split())
                raise UsageError(f"{path}: cell {cell.name}: {msg}") from None
    return Grid(Path(path), fixed, axes, report, cells)


class GridRun:
    """Runs the cells of a grid in subprocesses, ``jobs`` at once, recording each in DIR/grid.json."""

    def __init__(self, grid: Grid, out: Path, actions: dict, jobs: int, threads: int, on_cell=None,
                 tensorboard: Path | None = None):
        self.grid, self.out, self.actions, self.jobs, self.threads = grid, out, actions, jobs, threads
        self.tensorboard = tensorboard          # each run's TensorBoard logs in tensorboard/<cell>
        self.on_cell = on_cell or (lambda run, record: None)    # after each finished cell
        self.records = {c.name: {"name": c.name, "dir": f"runs/{c.name}", "algo": c.algo, "axes": c.axes,
                                 "options": c.options, "status": "pending", "exit_code": None, "run_s": None,
                                 "reason": None} for c in grid.cells}
        self.times, self.started = [], time.strftime("%FT%T%z")     # the run times of this invocation's cells

    def write(self) -> None:
        """grid.json, replaced whole (a full disk: ``RunError``, the previous grid.json as it was)."""
        st = [r["status"] for r in self.records.values()]
        with _stops_on_full_disk(self.out / "grid.json"):
            write_json(self.out / "grid.json", {
                "file": str(self.grid.path), "started": self.started, "updated": time.strftime("%FT%T%z"),
                **self.where(), "fixed": self.grid.fixed, "axes": self.grid.axes, "report": self.grid.report,
                "counts": {s: st.count(s) for s in dict.fromkeys(st)}, "cells": list(self.records.values())})

    def write_cell(self, cell: Cell) -> None:
        """cells/<cell>.toml, the --config of its run, replaced whole (a full disk: ``RunError``)."""
        path = self.out / "cells" / f"{cell.name}.toml"
        with _stops_on_full_disk(path):
            atomic_write(path, cell.toml.encode())

    def where(self) -> dict:    # how the cells run, for grid.json (grid_ray.RayGridRun: on which cluster)
        return {"jobs": self.jobs, "threads_per_job": self.threads}

    def _result(self, rec: dict) -> None:     # the run's accuracy, and whether it diverged (what its summary has)
        try:
            s = read_summary(self.out / rec["dir"])
        except DamagedRun:
            return
        rec.update({k: s[k] for k in ("final_test_acc", "best_test_acc", "final_val_acc", "diverged") if k in s})

    def _start(self, cell: Cell) -> subprocess.Popen:
        run_dir, toml_path = self.out / "runs" / cell.name, self.out / "cells" / f"{cell.name}.toml"
        self.write_cell(cell)
        cmd = [sys.executable, "-c", CHILD, "train", "--config", str(toml_path), "--out", str(run_dir),
               "--quiet"] + (["--overwrite"] if run_dir.exists() else [])
        if self.tensorboard is not None:
            cmd += ["--tensorboard", str(self.tensorboard / cell.name)]
        env = dict(os.environ, OMP_NUM_THREADS=str(self.threads), MKL_NUM_THREADS=str(self.threads))
        here = str(Path(__file__).resolve().parent.parent)     # the children run this stalegrad
        env["PYTHONPATH"] = os.pathsep.join(p for p in (here, env.get("PYTHONPATH")) if p)
        with open(self.out / "logs" / f"{cell.name}.log", "wb") as err:
            return subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=err, env=env,
                                    start_new_session=True)   # a terminal's Ctrl-C reaches them through us

    def _finish(self, cell: Cell, proc: subprocess.Popen, t0: float) -> None:
        rec, code = self.records[cell.name], proc.returncode
        rec.update(exit_code=code, run_s=round(time.monotonic() - t0, 2), reason=None)
        self.times.append(rec["run_s"])
        if code == 0 and is_finished(self.out / rec["dir"]):
            rec["status"] = "done"
            return self._result(rec)
        reason = last_line(self.out / "logs" / f"{cell.name}.log")
        if code < 0:
            sig = signal.Signals(-code).name if -code in set(signal.Signals) else f"signal {-code}"
            reason = f"killed by {sig}" + (f" ({reason})" if reason else "")
        elif code == 0:
            reason = "exited 0 but wrote no summary.json"
        rec.update(status="failed", reason=reason or f"exit code {code}")

    def _stop(self, running: dict) -> None:   # Ctrl-C: interrupt every child (it cleans up), kill what is left
        for proc in running:
            _signal(proc, signal.SIGINT)
        deadline = time.monotonic() + 30
        with contextlib.suppress(KeyboardInterrupt):      # a second Ctrl-C: no more waiting
            while any(p.poll() is None for p in running) and time.monotonic() < deadline:
                time.sleep(0.05)
        for proc, (cell, t0) in running.items():
            if proc.poll() is None:
                _signal(proc, signal.SIGKILL)
                proc.wait()
            self.records[cell.name]["exit_code"] = proc.returncode
            if proc.returncode == 0 and is_finished(self.out / self.records[cell.name]["dir"]):
                self._finish(cell, proc, t0)    # it ended before the signal reached it: done, not interrupted
        for rec in self.records.values():
            if rec["status"] == "running":
                rec.update(status="interrupted", reason="interrupted; rerun the grid to run it again")

    def run(self, cells: list | None = None) -> dict:
        """Run every cell of ``cells`` (default: the grid's) that is not done; return the records. Ctrl-C
        (or SIGTERM) stops the running children, records them as interrupted and raises KeyboardInterrupt."""
        cells = self.grid.cells if cells is None else cells
        for sub in ("runs", "cells", "logs"):
            with _stops_on_full_disk(self.out / sub):
                (self.out / sub).mkdir(parents=True, exist_ok=True)
        try:   # (a FIFO is refused, not waited on; at some hundred bytes a cell, the limit is a million cells)
            prev = {r["name"]: r for r in loads_json(read_text(self.out / "grid.json", JSONL_LIMIT))["cells"]}
        except (OSError, UnreadableFile, ValueError, KeyError, TypeError):
            prev = {}
        for rec in (self.records[c.name] for c in cells if self.actions[c.name] == "skip"):
            p = prev.get(rec["name"], {})     # skipped cells keep what the last grid.json said
            rec.update(status="skipped", exit_code=p.get("exit_code"), run_s=p.get("run_s"))
            self._result(rec)
        queue = [c for c in cells if self.actions[c.name] != "skip"]
        running: dict[subprocess.Popen, tuple[Cell, float]] = {}
        self.write()
        old = _on_sigterm()
        try:
            while queue or running:
                while queue and len(running) < self.jobs:
                    cell = queue.pop(0)
                    self.records[cell.name]["status"] = "running"
                    running[self._start(cell)] = (cell, time.monotonic())
                finished = [p for p in running if p.poll() is not None]
                if not finished:
                    time.sleep(0.05)
                for proc in finished:
                    cell, t0 = running.pop(proc)
                    self._finish(cell, proc, t0)
                    self.write()
                    self.on_cell(self, self.records[cell.name])
        except BaseException:       # Ctrl-C, SIGTERM, or the grid's own failure: no child is left running
            self._stop(running)
            with contextlib.suppress(RunError):
                self.write()
            raise
        finally:
            if old is not None:
                signal.signal(signal.SIGTERM, old)
        return self.records


@contextlib.contextmanager
def _stops_on_full_disk(path: Path):
    """An OSError while writing ``path`` (a full disk) as one line: ``RunError``, exit code 1."""
    try:
        yield
    except OSError as e:
        fix = "free space there" if disk_full(e) else "make it writable"
        raise RunError(f"{path}: cannot write it ({e.strerror or e}); the grid stopped (its running cells with it), "
                       f"and the file is as it was; {fix}, then run the same command again to continue") from None


def _signal(proc: subprocess.Popen, sig: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, sig)


def _on_sigterm():
    """SIGTERM stops the grid as Ctrl-C does: the children are stopped, not orphaned (None off the main thread)."""
    with contextlib.suppress(ValueError):
        return signal.signal(signal.SIGTERM, signal.default_int_handler)
