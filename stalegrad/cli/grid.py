"""``stalegrad grid FILE.toml --out DIR``: a grid of ``stalegrad train`` runs, resumable.

The file format, the expansion rules and the names of the cells: ``stalegrad/study/grid.py`` and
``experiments/README.md``. Before anything is created the command validates every cell, reads what
DIR already holds (``plan``) and loads each data set once to check every cell's data and model
(``check_data``); then it locks DIR (one grid at a time) and runs the cells (``grid.GridRun``).
Progress goes to stderr, one line per finished cell; the final line (stdout) says how many cells ran,
were skipped and failed. A failed run does not stop the grid, which exits 0 when the grid itself
worked; a bad file is one line and exit code 2, with nothing created; Ctrl-C stops the running
children and exits 130, and the same command continues the grid later. With ``--address`` the cells
run as Ray tasks on a cluster (``grid_ray.py``), joined and checked before DIR is created.
"""
from __future__ import annotations

import contextlib
import itertools
import json
import os
from collections import Counter
from pathlib import Path

import click

from ..errors import ConfigError, RunError, StalegradError, UsageError
from ..study.grid import Cell, Grid
from ..run.progress import count, eta
from ..study.stages import choose, split
from .grid_dir import check_layout, lock, plan


def _echo_err(line: str) -> None:
    click.echo(line, err=True)


@click.command()
@click.argument("file", type=click.Path(dir_okay=False))
@click.option("--out", type=click.Path(file_okay=False), default=None,
              help="directory of the grid: runs/<cell>/, grid.json, report/  [required, except with --dry-run]")
@click.option("--jobs", "-j", type=click.IntRange(min=1), default=None,
              help="runs at once, each with cores // jobs torch threads  [default: one per core (at most one per "
                   "2 GiB of memory) for the simulator on the CPU; 1 with a cuda device or the local or ray "
                   "runtime; with --address: as many as the cluster's nodes hold]")
@click.option("--dry-run", is_flag=True, help="validate the file and list its cells (with their state in --out); "
                                              "run nothing, read no data")
@click.option("--rerun-changed", is_flag=True,
              help="run again the finished cells whose options the file now changes (else that is an error)")
@click.option("--no-report", is_flag=True, help="do not write DIR/report/ at the end")
@click.option("--tensorboard", type=click.Path(file_okay=False), default=None,
              help="TensorBoard logs of every run in DIR/<cell> (pip install 'tensorboard>=2.14')")
@click.option("--address", default=None,
              help="run the cells as Ray tasks on the cluster at HOST:PORT (or auto): one task per cell, retried "
                   "on another node when its node dies; every node needs this stalegrad and the data set "
                   "(docs/cluster.md, Grids on a cluster)")
@click.option("--cpus-per-cell", type=click.IntRange(min=1), default=None,
              help="with --address: the CPUs each cell's task asks Ray for, and its torch threads  [default: 1]")
@click.option("--connect-timeout", type=click.FloatRange(min=0, min_open=True), default=None,
              help="with --address: seconds to join the cluster before giving up  [default: 30]")
def grid(file, out, jobs, dry_run, rerun_changed, no_report, tensorboard, address, cpus_per_cell, connect_timeout):
    """Run every cell of the grid in FILE.toml into --out DIR; run the same command again to resume.

    FILE has a [fixed] table (options of 'stalegrad train', keys as in --config), an [axes] table
    (lists: algos, workers, window, lr, delay, seeds, any algorithm parameter or train option; the
    grid is their product), a [report] table (target, baseline) and an optional [protocol] table
    (select_seeds, report_seeds, tune, arms, compare, closure: selection on validation accuracy, needs
    val_split; the report's protocol section, whose grid-edge warnings the grid prints). sgd runs with one worker, once;
    an algorithm parameter applies only to the algorithms that have it. Each cell runs as 'stalegrad
    train' in a process of its own, into DIR/runs/<cell>/ (e.g. asgd-M8-lr0.1-gamma2-s0); a cell
    whose run is finished (summary.json, written last, and model.pt) is skipped, an unfinished one is
    run again.

    With --address HOST:PORT the cells run on a Ray cluster instead, as tasks of --cpus-per-cell CPUs,
    as many at once as its nodes hold (at most --jobs): each node runs 'stalegrad train' into a
    temporary directory and sends the run directory back, which is written into DIR/runs/<cell>/
    (no shared file system needed); a cell whose node dies runs again on another node. The nodes
    load the data set from their own disks.
    """
    from ..study.grid import load_grid

    g = load_grid(file, here=not dry_run)
    out_dir = Path(out) if out is not None else None
    if out_dir is None and not dry_run:
        raise UsageError("--out DIR is required: the directory of the grid's runs (or --dry-run)")
    if out_dir is not None and out_dir.exists() and not out_dir.is_dir():
        raise UsageError(f"--out {out_dir}: exists and is not a directory; choose another path")
    if out_dir is not None:
        check_layout(out_dir, report=not no_report)
    check_cluster_options(g, address, cpus_per_cell, tensorboard, connect_timeout)
    notes: list[str] = []
    actions = plan(g, out_dir, rerun_changed, notes) if out_dir is not None else None
    for line in notes:
        _echo_err(f"grid: note: {line}")
    if dry_run:
        return _list(g, actions)
    check_data(g.path, [c for c in g.cells if actions[c.name] != "skip"], here=address is None)
    if tensorboard is not None:
        from ..run.tblog import check_logdir
        check_logdir(tensorboard)
    cluster = None
    if address is not None:   # joined (or refused in one line) before anything is written
        from ..study.grid_ray import connect
        cluster = connect(address, cpus_per_cell or 1, connect_timeout)
        threads = cluster.cpus_per_cell
    else:
        cores = machine_cores()
        jobs = jobs or default_jobs(g.cells, cores)
        threads = max(1, cores // jobs)
    with cluster or contextlib.nullcontext():
        records = _run(g, out_dir, rerun_changed, cluster, jobs, threads, tensorboard)
    st = Counter(r["status"] for r in records.values())
    if not no_report:
        _report(g, out_dir, [out_dir / r["dir"] for r in records.values() if r["status"] in ("done", "skipped")])
    failed = f"{st['failed']} failed (reasons in {out_dir / 'grid.json'})" if st["failed"] else "none failed"
    unselected = f", {st['not selected']} not selected (stage 2)" if st["not selected"] else ""
    click.echo(f"grid: {count(len(g.cells), 'cell')}: {st['done'] + st['failed']} run, {st['skipped']} skipped "
               f"(already done){unselected}, {failed} -> {out_dir}")


def _run(g: Grid, out_dir: Path, rerun_changed: bool, cluster, jobs: int | None, threads: int, tensorboard):
    """Lock DIR and run the grid's stages, here (``GridRun``) or on ``cluster`` (``grid_ray.RayGridRun``)."""
    from ..study.grid import GridRun
    created = not out_dir.exists()
    try:
        out_dir.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise UsageError(f"--out {out_dir}: cannot create it ({e.strerror})") from None
    try:
        fd = lock(out_dir)
    except StalegradError:
        if created:   # (a lock that could not be written: nothing is left of this command)
            with contextlib.suppress(OSError):
                out_dir.rmdir()
        raise
    try:
        actions = plan(g, out_dir, rerun_changed)     # again, under the lock
        spec = g.report.get("protocol")
        first, second = split(g.cells, spec)
        todo = sum(actions[c.name] != "skip" for c in first)
        stage = "stage 1 of 2 (the selection seeds): " if second else ""
        where = cluster.describe(jobs) if cluster is not None else \
            f"{jobs} at once with {threads} thread{'s' * (threads > 1)} each"
        _echo_err(f"grid: {stage}{count(len(first), 'cell')}, {len(first) - todo} already done, {todo} to run, "
                  f"{where} -> {out_dir}")
        if cluster is not None:
            from ..study.grid_ray import RayGridRun
            runner = RayGridRun(g, out_dir, actions, cluster, jobs=jobs, on_cell=_progress)
        else:
            runner = GridRun(g, out_dir, actions, jobs, threads, on_cell=_progress,
                             tensorboard=Path(tensorboard).absolute() if tensorboard is not None else None)
        for c in second:
            runner.records[c.name]["status"] = "stage 2"
        try:
            records = runner.run(first)
            if second:
                records = runner.run(_stage_two(runner, first, second, spec))
        except KeyboardInterrupt:
            st = Counter(r["status"] for r in runner.records.values())
            _echo_err(f"grid: interrupted: {st['done'] + st['skipped']} of {count(len(g.cells), 'cell')} done, "
                      f"{st['failed']} failed; the same command continues the grid")
            raise
    finally:
        os.close(fd)
    return records


def check_cluster_options(g: Grid, address: str | None, cpus_per_cell: int | None, tensorboard,
                          connect_timeout: float | None = None) -> None:
    """The options of a grid on a Ray cluster (``--address``), before anything is joined or written."""
    if address is None:
        for flag, value in (("--cpus-per-cell", cpus_per_cell), ("--connect-timeout", connect_timeout)):
            if value is not None:
                raise UsageError(f"{flag} needs --address (a grid on a Ray cluster); without it the cells run here, "
                                 "--jobs at once")
        return
    from ..run.options import MAX_WAIT_S, WAIT_WHY
    from ..runtimes.ray.connect import split_address
    try:
        split_address(address)
    except ConfigError as e:
        raise UsageError(f"--{e.render('address')}") from None
    if connect_timeout is not None and not connect_timeout <= MAX_WAIT_S:
        raise UsageError(f"--connect-timeout must be at most {MAX_WAIT_S:g} seconds{WAIT_WHY}, got {connect_timeout:g}")
    if tensorboard is not None:
        raise UsageError("--tensorboard is not available with --address (the logs would stay on the nodes); "
                         "leave it out, or run the grid without --address")
    for c in g.cells:
        if c.params["runtime"] == "ray" or str(c.params["device"]).startswith("cuda"):
            what = "runtime = \"ray\"" if c.params["runtime"] == "ray" else f"device = \"{c.params['device']}\""
            raise UsageError(f"{g.path}: cell {c.name} has {what}, but a grid on a Ray cluster (--address) runs "
                             "each cell on the CPUs of one task; use the simulator or the local runtime on the "
                             "CPU, or run the grid without --address")


def _stage_two(runner, first: list[Cell], second: list[Cell], spec: dict) -> list[Cell]:
    """The reporting-seed cells of the settings stage 1 selected (``stages.choose``); the others are
    recorded as not selected, with the setting that was."""
    records = [runner.records[c.name] for c in first]
    results = {r["name"]: {k: r[k] for k in ("final_val_acc", "final_test_acc", "diverged")
                                if k in r} for r in records
               if r["status"] in ("done", "skipped") and "final_test_acc" in r}   # (its summary.json was read)
    chosen, picks = choose(first, second, spec, results)
    names = {c.name for c in chosen}
    for c in second:
        if c.name in names:
            runner.records[c.name]["status"] = "pending"
        else:
            runner.records[c.name].update(status="not selected", reason="a reporting seed of a setting that stage 1 "
                                          "did not select (its validation accuracy was not the best of its cell)")
    none = [p for p in picks if p["chosen"] is None]
    todo = sum(runner.actions[c.name] != "skip" for c in chosen)
    _echo_err(f"grid: stage 2 of 2 (the reporting seeds of the {len(picks) - len(none)} selected settings): "
              f"{count(len(chosen), 'cell')}, {len(chosen) - todo} already done, {todo} to run"
              + (f"; {len(none)} cell(s) selected nothing (a selection seed missing or failed)" if none else ""))
    runner.write()
    return chosen


def _progress(run, rec: dict) -> None:
    """After each finished cell: ``grid: 7/24 done, 1 failed, 16 left, about 12 min left`` (the cells of
    the current stage and those before it; stage 2's cells count once selected)."""
    if rec["status"] == "failed":
        code = f" (exit code {rec['exit_code']})" if rec["exit_code"] is not None else ""
        _echo_err(f"grid: {rec['name']} failed{code}: {rec['reason']}")
    st = [r["status"] for r in run.records.values() if r["status"] not in ("stage 2", "not selected")]
    done, failed = st.count("done") + st.count("skipped"), st.count("failed")
    left = len(st) - done - failed
    line = f"grid: {done}/{len(st)} done, {failed} failed, {left} left"
    if left and run.times:     # the mean time of the cells run so far, `jobs` at once
        line += ", " + eta(sum(run.times) / len(run.times) * left / min(run.jobs, left))
    _echo_err(line)


def _list(g: Grid, actions: dict | None) -> None:
    per_algo = Counter(c.algo for c in g.cells)
    click.echo(f"{g.path}: {count(len(g.cells), 'cell')} ({', '.join(f'{a} {n}' for a, n in per_algo.items())}), "
               "every one valid")
    spec = g.report.get("protocol")
    first, second = split(g.cells, spec)
    width = max(len(c.name) for c in g.cells)
    shown = {"skip": "done: skipped", "rerun": "to run again", "run": "to run"}
    if second:
        click.echo(f"stage 1 of 2, the selection seeds ({count(len(first), 'cell')}):")
    for c in first:
        click.echo(f"  {c.name:<{width}}  {shown[actions[c.name]]}" if actions else f"  {c.name}")
    todo = sum(actions[c.name] != "skip" for c in first) if actions else len(first)
    if second:   # as many settings as stage 1 will select: choose() with every score equal (and no run failed)
        most = len(choose(first, second, spec, {c.name: {"final_val_acc": 1.0, "final_test_acc": 1.0}
                                                 for c in first})[0])
        click.echo(f"stage 2 of 2, the reporting seeds {', '.join(map(str, spec['report_seeds']))}: {most} of the "
                   f"{len(second)} cells, those of the settings stage 1 selects (one per algorithm and cell)")
        todo = f"{todo} + {most}"
    click.echo(f"dry run: nothing was run ({todo} cell{'s' * (todo != 1)} to run)")
    if any(str(c.params["device"]).startswith("cuda") for c in g.cells):
        import torch
        if not torch.cuda.is_available():
            click.echo("note: the cells use a CUDA device, which this machine does not have: run the grid on a "
                       "machine with a GPU, or set device = \"cpu\"")


def _report(g: Grid, out_dir: Path, run_dirs: list[Path]) -> None:
    """DIR/report/ from the finished runs, when this stalegrad has the report module."""
    if not run_dirs:
        return _echo_err("grid: no report: no cell finished")
    try:
        from ..study.report import write_report
    except ImportError as e:
        return _echo_err(f"grid: no report: this stalegrad has no report module ({e}); the runs are in "
                         f"{out_dir / 'runs'}")
    try:
        write_report(run_dirs, out_dir / "report", **g.report, given_in=f"the [report] table of {g.path}",
                     on_skip=lambda d, why: _echo_err(f"grid: report: skipped {d}: {why}"),
                     on_warning=lambda line: _echo_err(f"grid: warning: {line}"))
    except StalegradError as e:
        raise RunError(f"the runs are done, but the report failed: {' '.join(str(e).split())}") from None
    _echo_err(f"grid: report -> {out_dir / 'report'}")
    try:   # the protocol's grid-edge warnings, with the value to add (report_protocol.py)
        edges = json.loads((out_dir / "report" / "report.json").read_text())["protocol"]["edge_warnings"]
    except (OSError, ValueError, KeyError, TypeError):
        edges = []
    for line in edges:
        _echo_err(f"grid: warning: {line}")


def check_data(path, cells: list[Cell], here: bool = True) -> None:
    """Load each data set once and check every cell's data and model as ``train`` does before a run.
    ``here=False`` (a grid on a cluster): a data set missing here is a note, the nodes load their own."""
    import torch

    from ..data import DataError, load_pair
    from ..models import build_model
    from ..run.options import check_options

    def key(c):   # only the synthetic data depends on the seed
        p = c.params
        return p["dataset"], str(p["data_dir"]), p["seed"] if p["dataset"] == "synthetic" else -1
    models = set()
    for (dataset, _, _), group in itertools.groupby(sorted(cells, key=key), key=key):
        group = list(group)
        try:
            train_set, test_set = load_pair(dataset, group[0].params["data_dir"], seed=group[0].params["seed"])
        except DataError as e:
            if here:
                raise UsageError(f"{path}: {' '.join(str(e).split())}") from None
            _echo_err(f"grid: note: {dataset} is not on this machine, so its cells are checked on their nodes "
                      f"(each node needs it): {' '.join(str(e).split())}")
            continue
        except UsageError as e:
            raise UsageError(f"{path}: {' '.join(str(e).split())}") from None
        shape, classes = tuple(train_set.x.shape[1:]), train_set.num_classes
        for cell in group:
            p = cell.params
            try:
                config, _ = check_options(cell.algo, p)
                config.check_data(train_set, test_set)
                if (p["model"], shape, classes, p["hidden"]) not in models:
                    with torch.device("meta"):     # the shape checks, without the memory
                        build_model(p["model"], shape, classes, hidden=p["hidden"])
                    models.add((p["model"], shape, classes, p["hidden"]))
            except UsageError as e:
                raise UsageError(f"{path}: cell {cell.name}: {' '.join(str(e).split())}") from None
        del train_set, test_set


def machine_cores() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def default_jobs(cells: list[Cell], cores: int) -> int:
    """The simulator on the CPU: one run per core, each with one torch thread, at most one per 2 GiB
    of memory. A simulated run is one process whose small tensor operations gain little from a second
    thread, and threads that contend with other processes for the cores can be many times slower (on
    a busy 2-core machine, two runs of 3 epochs of Fashion-MNIST took 11 s side by side with one thread
    each, 475 s one after the other with two). One run at a time on a GPU, or with the local or ray
    runtime (they start processes of their own)."""
    if any(c.params["runtime"] != "sim" or str(c.params["device"]).startswith("cuda") for c in cells):
        return 1
    try:
        memory_gib = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30
    except (ValueError, OSError, AttributeError):
        memory_gib = 2.0 * cores
    return max(1, min(cores, int(memory_gib // 2)))
