"""What a grid's directory holds, for ``stalegrad grid`` (``cli/grid.py``): entries of the right kind
(``check_layout``), what each cell needs (``plan``: done, to run again, to run), and the lock that keeps
one grid at a time in it (``lock``)."""
from __future__ import annotations

import fcntl
import os
import tomllib
from pathlib import Path

from ..errors import RunError, UsageError
from ..study.grid import GRID_FILE_LIMIT, Grid, toml_value
from ..run.files import UnreadableFile, loads_toml, read_text
from ..run.results import DamagedRun, is_finished, read_summary


def check_layout(out: Path, report: bool = True) -> None:
    """Refuse a DIR whose entries the grid writes are of the wrong kind (``cells`` a file, ...), before
    anything is created."""
    dirs = ("runs", "cells", "logs") + (("report",) if report else ())
    for name in dirs + ("grid.json", ".grid.lock"):
        path = out / name
        wrong = (not path.is_dir()) if name in dirs else path.is_dir()
        if path.exists() and wrong:
            kind = "directory" if name in dirs else "file"
            raise UsageError(f"--out {out}: {path} is not a {kind}, and the grid writes a {kind} there; "
                             "move it away, or choose another --out")


def changed_key(old: dict, new: dict) -> str | None:
    """The first option that differs between two cells' options, as ``key = old -> new``."""
    for k in dict.fromkeys([*new, *old]):
        if old.get(k) != new.get(k):
            show = lambda d: toml_value(d[k]) if k in d else "(not set)"   # noqa: E731
            return f"{k} = {show(old)} -> {show(new)}"
    return None


def plan(g: Grid, out: Path, rerun_changed: bool = False, notes: list | None = None) -> dict[str, str]:
    """What each cell needs in ``out``: ``skip`` (its run is finished: ``results.is_finished``, with a
    summary.json that a run writes: ``results.read_summary``), ``rerun`` (an unfinished run, a damaged
    summary.json, or changed options with ``rerun_changed``) or ``run``. A finished cell whose options the
    file now changes (a [fixed] value) is an error: its results would be mixed up with the new ones.
    ``notes``: a list that gets one line for each cell run again for its damaged summary.json."""
    actions, changed = {}, []
    for cell in g.cells:
        run_dir = out / "runs" / cell.name
        damage = None
        if os.path.lexists(run_dir / "summary.json"):
            try:
                read_summary(run_dir)
            except DamagedRun as e:
                damage = e.reason
        if not is_finished(run_dir) or damage is not None:
            actions[cell.name] = "rerun" if run_dir.exists() else "run"
            if damage is not None and notes is not None:
                notes.append(f"cell {cell.name} is not done: its {damage}; it runs again")
            continue
        actions[cell.name] = "skip"
        try:
            old = loads_toml(read_text(out / "cells" / f"{cell.name}.toml", GRID_FILE_LIMIT))
        except (OSError, UnreadableFile, tomllib.TOMLDecodeError):
            continue     # no record of its options: trust the finished run
        diff = changed_key(old, tomllib.loads(cell.toml))
        if diff:
            changed.append((cell.name, diff))
            actions[cell.name] = "rerun"
    if changed and not rerun_changed:
        more = f" (and {len(changed) - 1} more)" if len(changed) > 1 else ""
        raise UsageError(f"{g.path}: cell {changed[0][0]} already ran in {out} with other options "
                         f"({changed[0][1]}){more}; pass --rerun-changed to run such cells again, or choose "
                         "another --out")
    return actions


def lock(out: Path) -> int:
    """An exclusive lock on ``out``: one grid at a time (the kernel drops it when the process ends)."""
    path = out / ".grid.lock"
    existed = path.exists()
    try:
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    except OSError as e:
        raise UsageError(f"--out {out}: cannot write there ({e.strerror})") from None
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        holder = os.pread(fd, 32, 0).decode(errors="replace").strip() or "unknown"
        os.close(fd)
        raise UsageError(f"--out {out}: another grid (PID {holder}) is running there; wait for it to end") from None
    try:
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
    except OSError as e:   # a full disk
        os.close(fd)
        if not existed:
            path.unlink(missing_ok=True)
        raise RunError(f"--out {out}: cannot write the grid's lock {path} ({e.strerror or e}); nothing ran: free "
                       "space there, then run it again") from None
    return fd
