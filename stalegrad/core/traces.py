"""Trace files: the order of a real run's pushes (``--record-trace``), which ``--delay trace:FILE`` replays.

A CSV with a header and at least a ``worker`` column; the real runtimes also write ``pulled`` (the version the
worker pulled for that push), ``applied`` and ``wall_s``. A file of bare worker ids, one per line, also works.
``delays.read_trace`` makes a file a delay model.
"""
from __future__ import annotations

import csv
import math
import os
import stat
from pathlib import Path

from ..errors import StalegradError


TRACE_COLUMNS = ("worker", "pulled", "applied", "wall_s")


def write_trace(path: str | Path, rows) -> None:
    """Write pushes ``(worker, pulled version, applied version, wall seconds)`` as a trace CSV,
    atomically (a temporary file renamed into place; none is left behind on an OSError)."""
    path = Path(path)
    tmp = path.with_name(f".{path.name}.tmp")
    try:
        with open(tmp, "w", newline="") as f:
            out = csv.writer(f)
            out.writerow(TRACE_COLUMNS)
            for m, pulled, applied, t in rows:
                out.writerow([m, pulled, applied, f"{t:.6f}"])
        os.replace(tmp, path)
    except OSError:
        tmp.unlink(missing_ok=True)
        raise


# A push is one short CSV line (~30 bytes): this is millions of pushes, and what a run can hold in memory.
MAX_TRACE_BYTES = 256 * 2**20


def read(path: str | Path, bad) -> tuple[list[int], list[int] | None, list[float] | None]:
    """The pushes of a trace file: workers, pulled versions and wall seconds (None where the file has no such
    column). ``bad(problem)`` makes the error raised for a file that is not a readable trace."""
    path = Path(path)
    try:
        info = path.stat()
        if not stat.S_ISREG(info.st_mode):   # /dev/zero, a FIFO, a directory: nothing a recording writes
            raise bad("not a regular file; a trace is a CSV written by --record-trace")
        if info.st_size > MAX_TRACE_BYTES:
            raise bad(f"the trace is {info.st_size / 2**20:.0f} MiB, more than the {MAX_TRACE_BYTES >> 20} "
                      "MiB a trace may have; keep the pushes you need")
        with open(path, "rb") as f:   # read no more than the limit, should the file grow meanwhile
            text = f.read(MAX_TRACE_BYTES + 1).decode()
        if len(text) > MAX_TRACE_BYTES:
            raise bad(f"the trace grew past the {MAX_TRACE_BYTES >> 20} MiB a trace may have")
    except OSError as e:
        raise bad(f"cannot read the trace ({e.strerror}); record one with "
                  "'stalegrad train --runtime local --record-trace FILE'") from None
    except UnicodeDecodeError:
        raise bad("not a text file; a trace is a CSV written by --record-trace") from None
    lines = [ln for ln in text.splitlines() if ln.strip()]
    if not lines:
        raise bad("the trace is empty")
    try:
        if lines[0].strip().lstrip("-").isdigit():   # bare worker ids, one a line: checked as the CSV's are
            workers, pulled, wall = [int(ln) for ln in lines], None, None
        else:
            rows = list(csv.DictReader(lines))
            header = next(csv.reader(lines[:1]))
            if "worker" not in header:
                raise ValueError(f"its header {','.join(header)!r} has no 'worker' column")
            if not rows:
                raise bad("the trace has a header but no pushes; record a run with --record-trace")
            workers = [int(r["worker"]) for r in rows]
            pulled = [int(r["pulled"]) for r in rows] if "pulled" in header else None
            wall = [float(r["wall_s"]) for r in rows] if "wall_s" in header else None
    except StalegradError:
        raise
    except (ValueError, TypeError, KeyError, csv.Error) as e:
        raise bad(f"malformed trace ({e}); expected a CSV with columns "
                  "worker[,pulled,applied,wall_s] or one worker id per line") from None
    negative = next((i for i, w in enumerate(workers) if w < 0), None)
    if negative is not None:   # (-1 would index the last worker, -5 past the first: refused in either form)
        raise bad(f"push {negative + 1} names worker {workers[negative]}; worker ids count from 0")
    if wall is not None and not all(math.isfinite(t) for t in wall):
        raise bad("a wall_s value is not a finite number")
    return workers, pulled, wall
