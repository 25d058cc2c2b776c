"""One run directory, owned by one run at a time, where nothing is lost.

    config.json      the resolved configuration
    metrics.jsonl    one JSON object per evaluation, appended as they happen
    messages.jsonl   one JSON object per pushed message (samples, wall_s, virtual_s, loss, train_acc)
    staleness.json   tau histogram, mean, max, per-worker figures
    summary.json     final/best accuracy, times, updates, staleness, weights hash
    model.pt         the final model (state_dict plus what rebuilds it)
    checkpoint.pt    the complete state, with --checkpoint-every
    probes.jsonl     one JSON object per probe, with --probe-every (stalegrad/core/prober.py)

The guarantees, in the order a run meets them:

1. ``RunWriter(...)`` only checks (the path, an existing run, ``--overwrite``,
   ``--resume``, that the directory can be written); the caller validates
   every other input before ``open()``.
2. ``open()`` creates the directory and takes an exclusive ``flock`` on
   ``DIR/.lock`` for the life of the run: a second run on the same directory
   fails at once, naming the PID that holds it. The kernel drops the lock when
   its process dies, so a crashed run never blocks the next one. Temporary
   files of a write that a crash interrupted are removed here. A lock that
   cannot be written (a full disk) is one line, and no ``.lock`` is left.
3. Nothing is written or removed before the new run has taken its first step:
   ``start()`` (every check passed, the run about to begin) keeps the
   configuration and the first metrics in memory; ``commit()``, called when
   the first message has been applied (``train``'s ``on_first_step``), removes
   the previous run's files (``--overwrite``; summary.json first) or a resumed
   run's summary.json (the run is unfinished again), then writes them. A run
   stopped before (an interrupt, an error, a hang broken off) leaves the
   directory exactly as it found it.
4. Every file but metrics.jsonl is written whole and renamed into place; a
   metrics line is appended whole or not at all (a failed append is cut back);
   every JSON file is strict JSON. A failed write (a full disk) ends the run
   with one line, and the file keeps its previous content.
5. summary.json is written last: a directory that holds it holds a finished
   run (``results.is_finished``), whatever interrupted the final writes.
6. ``close()`` releases the lock; a run that stopped before ``commit()`` leaves
   no directory or lock file it created behind.
"""
from __future__ import annotations

import contextlib
import errno
import fcntl
import os
import shutil
import tempfile
from pathlib import Path

from ..errors import RunError
from .results import OutputError, append_line, atomic_torch_save, atomic_write, json_text, write_failure, write_json

RUN_FILES = ("config.json", "metrics.jsonl", "messages.jsonl", "staleness.json", "summary.json", "model.pt",
             "checkpoint.pt", "probes.jsonl")
LOCK_FILE = ".lock"


class RunWriter:
    """Owns one run directory for the duration of a run (see the module docstring)."""

    def __init__(self, out: str | os.PathLike, overwrite: bool = False, resume: bool = False):
        self.dir = Path(out)
        self.overwrite, self.resume = overwrite, resume
        self.flag = "--resume" if resume else "--out"
        self.created = False
        self._created_top: Path | None = None
        self.started = False           # committed: the run took its first step and wrote its first file
        self._pending: tuple[dict, list[dict]] | None = None   # start()'s config and metrics, until commit()
        self._lock_created = False
        self._lock_before: tuple | None = None   # the lock file's content and stat before this run
        self._lock_fd: int | None = None
        self.before_summary = None     # called just before summary.json is written (the CLI's train: no interrupt)
        if resume:   # continue the run already there; start() rewrites its metrics
            self._check_resumable()
            return
        if self.dir.exists() and not self.dir.is_dir():
            raise OutputError(f"--out {self.dir}: exists and is not a directory; choose another path")
        self._refuse_existing_run()
        parent = next((p for p in [self.dir, *self.dir.parents] if p.exists()), None)
        if parent is not None and not os.access(parent, os.W_OK | os.X_OK):
            raise OutputError(f"--out {self.dir}: {parent} is not writable; choose another directory")

    def _check_resumable(self) -> None:
        """What a new run's checks find, for a run to continue: a directory holding a run, which
        this process can write (it rewrites config.json and metrics.jsonl, and adds files)."""
        where = f"--resume {self.dir}"
        if not self.dir.is_dir():
            why = "no such directory" if not self.dir.exists() else "not a directory"
            raise OutputError(f"{where}: {why}; give the directory of a run made with --checkpoint-every")
        config = self.dir / "config.json"
        if not config.exists():
            raise OutputError(f"{where}: not a stalegrad run directory (no config.json)")
        for name in RUN_FILES:
            path = self.dir / name
            if (path.exists() or path.is_symlink()) and not path.is_file():
                raise OutputError(f"{where}: {name} is not a regular file; it is not a run this can resume")
        if not os.access(self.dir, os.W_OK | os.X_OK):
            why = "on a read-only file system" if _read_only_fs(self.dir) else "not writable by this user"
            raise OutputError(f"{where}: the directory is {why}, and a resumed run writes into it; make it "
                              "writable, or copy the run to a writable place and resume the copy")

    def _refuse_existing_run(self) -> None:
        existing = [f for f in RUN_FILES if (self.dir / f).exists()]
        if existing and not self.overwrite and not self.resume:
            raise OutputError(f"--out {self.dir}: already holds a run ({existing[0]}); "
                              "pass --overwrite to replace it, or choose another directory")

    # ---- the life of a run --------------------------------------------------------
    def open(self) -> "RunWriter":
        """Create the directory and lock it for this run (OutputError if another run holds it)."""
        try:
            # the topmost directory this run creates (--out a/new/run may create a/new too): a run that never
            # starts removes it, so a refused command leaves nothing behind
            missing = [p for p in (self.dir, *self.dir.parents) if not p.exists()]
            self.created = bool(missing)
            self._created_top = missing[-1] if missing else None
            self.dir.mkdir(parents=True, exist_ok=True)
            self._lock_created = not (self.dir / LOCK_FILE).exists()
            fd = os.open(self.dir / LOCK_FILE, os.O_RDWR | os.O_CREAT, 0o644)
        except OSError as e:
            self._remove_if_created()
            raise OutputError(f"{self.flag} {self.dir}: cannot create the run directory ({e.strerror})") from None
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as e:
            holder = os.pread(fd, 32, 0).decode(errors="replace").strip() or "unknown"
            os.close(fd)
            if e.errno not in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
                raise OutputError(f"{self.flag} {self.dir}: cannot lock the run directory ({e.strerror})") from None
            raise OutputError(f"{self.flag} {self.dir}: another run (PID {holder}) is using this directory; "
                              "wait for it to end, or choose another directory") from None
        self._lock_fd = fd
        try:
            if not self._lock_created:   # put back as it was by a run that never starts (close)
                self._lock_before = (os.pread(fd, 64, 0), os.fstat(fd))
            os.ftruncate(fd, 0)
            os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        except OSError as e:   # a full disk: no page for the PID
            self.close()
            raise OutputError(f"{self.flag} {self.dir}: cannot write the lock file {LOCK_FILE} ({e.strerror}); "
                              "free space on that disk, or choose another directory") from None
        for stale in self.dir.glob(".*.tmp"):   # left by a write that a crash interrupted
            stale.unlink(missing_ok=True)
        try:
            self._refuse_existing_run()   # again, under the lock: a run that started with ours may have finished
        except OutputError:
            self.close()
            raise
        return self

    def start(self, config: dict, metrics: list[dict] = ()) -> None:
        """Every check passed and the run is about to begin: its configuration and the metrics so far
        (a resumed run's), kept until ``commit()`` writes them."""
        self._pending = (config, list(metrics))

    def commit(self) -> None:
        """The run has taken its first step: replace the previous run (``--overwrite``; summary.json
        first, so that no moment shows a finished run of mixed files) or make a resumed run unfinished
        again, then write the configuration and the metrics so far. Once; nothing before ``start()``."""
        if self.started or self._pending is None:
            return
        self.started = True
        if self.overwrite and not self.resume:
            for name in sorted(RUN_FILES, key=lambda n: n != "summary.json"):
                self._guard(lambda p: p.unlink(missing_ok=True), self.dir / name)
        if self.resume:   # unfinished again until finish() writes the new summary.json
            self._guard(lambda p: p.unlink(missing_ok=True), self.dir / "summary.json")
        (config, metrics), self._pending = self._pending, None
        self._guard(write_json, self.dir / "config.json", config)
        self._guard(atomic_write, self.dir / "metrics.jsonl", "".join(json_text(m) + "\n" for m in metrics).encode())

    def metric(self, record: dict) -> None:
        if not self.started and self._pending is not None:   # before the first step: kept for commit()
            self._pending[1].append(record)
            return
        self._guard(append_line, self.dir / "metrics.jsonl", json_text(record))

    def finish(self, result, model_spec: dict | None = None) -> None:
        """The run's results; summary.json last, so that a run holding it is complete (an
        interruption before leaves an unfinished run, which a grid runs again)."""
        self.commit()
        self._guard(write_json, self.dir / "staleness.json", result.staleness)
        self._guard(atomic_write, self.dir / "messages.jsonl",
                    "".join(json_text(m) + "\n" for m in result.messages).encode())
        if getattr(result, "probes", None) is not None:
            self._guard(atomic_write, self.dir / "probes.jsonl",
                        "".join(json_text(r) + "\n" for r in result.probes).encode())
        payload = {"state_dict": result.model.state_dict(), "weights": result.weights.cpu(),
                   "model": model_spec or {}, "summary": result.summary}
        self._guard(atomic_torch_save, self.dir / "model.pt", payload)
        if self.before_summary is not None:
            self.before_summary()
        self._guard(write_json, self.dir / "summary.json", result.summary)

    def close(self) -> None:
        """Release the lock; remove the directory (or the lock file) if this run created it and never
        started."""
        if self._lock_fd is not None:
            if not self.started and self._lock_created and not self.created:
                (self.dir / LOCK_FILE).unlink(missing_ok=True)   # (still held: no other run has it)
            elif not self.started and self._lock_before is not None:   # a refused run leaves the file as it was
                with contextlib.suppress(OSError):
                    content, st = self._lock_before
                    os.ftruncate(self._lock_fd, 0)
                    os.pwrite(self._lock_fd, content, 0)
                    os.utime(self._lock_fd, ns=(st.st_atime_ns, st.st_mtime_ns))
            os.close(self._lock_fd)   # closing the descriptor releases the flock
            self._lock_fd = None
        if not self.started:
            self._remove_if_created()

    def __enter__(self) -> "RunWriter":
        return self.open()

    def __exit__(self, *exc) -> None:
        self.close()

    # ---- helpers ------------------------------------------------------------------
    def _remove_if_created(self) -> None:
        if self.created:
            shutil.rmtree(self._created_top or self.dir, ignore_errors=True)
            self.created = False

    def _guard(self, write, path: Path, *args) -> None:
        """A write of the run; a vanished or full directory ends the run with one line."""
        try:
            write(path, *args)
        except OSError as e:
            raise RunError(write_failure(path, e, self.dir)) from None


def _read_only_fs(path: Path) -> bool:
    try:
        return bool(os.statvfs(path).f_flag & os.ST_RDONLY)
    except OSError:
        return False
