"""Run directories: what ``--out DIR`` holds, written so a crash loses nothing.

    config.json      the resolved configuration
    metrics.jsonl    one JSON object per evaluation, appended as they happen
    staleness.json   tau histogram, mean, max, per-worker figures
    summary.json     final/best accuracy, times, updates, staleness, weights hash
    model.pt         the final model (state_dict plus what rebuilds it)

JSON files are strict JSON (NaN and infinities become null), written to a
temporary file and renamed, so a reader never sees half a file; a line is
appended whole or not at all. summary.json is a run's last file: a run that
holds it is finished (``is_finished``). ``rundir.py`` owns a run directory for
the life of a run.
"""
from __future__ import annotations

import errno
import json
import math
import os
import tempfile
from contextlib import contextmanager
from pathlib import Path

from .errors import UsageError

class OutputError(UsageError):
    """A run directory or output path that cannot be used (one-line message)."""


@contextmanager
def atomic_open(path: str | os.PathLike):
    """A binary file that replaces ``path`` only once it is completely written."""
    path = Path(path)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    os.fchmod(fd, 0o666 & ~_umask())   # mkstemp makes it 0600; a result is as readable as any new file
    try:
        with os.fdopen(fd, "wb") as f:
            yield f
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def atomic_write(path: Path, data: bytes) -> None:
    with atomic_open(path) as f:
        f.write(data)


class _Recording:
    """A file that remembers the exception its ``write`` raised: torch.save turns an OSError
    (a full disk) into a RuntimeError ("enforce fail at inline_container.cc"), losing its cause."""

    def __init__(self, f):
        self.f, self.error = f, None

    def write(self, data) -> int:
        try:
            return self.f.write(data)
        except BaseException as e:   # (an OSError, or a Ctrl-C that must stay one)
            self.error = e
            raise

    def flush(self) -> None:
        self.f.flush()


def atomic_torch_save(path: str | os.PathLike, obj) -> None:
    """``torch.save(obj)`` into ``path``, replacing it only once completely written; a failed write
    raises its own OSError (or KeyboardInterrupt), and the previous file stays as it was."""
    import torch
    with atomic_open(path) as f:
        out = _Recording(f)
        try:
            torch.save(obj, out)
        except RuntimeError:
            if out.error is not None:
                raise out.error from None
            raise


def append_line(path: str | os.PathLike, text: str) -> None:
    """Append ``text`` and a newline to ``path`` whole, or nothing: a write that fails part-way
    (a full disk, Ctrl-C) is cut back to the previous length, so the file stays valid JSON Lines."""
    data = memoryview((text + "\n").encode())
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o666)
    try:
        size = os.fstat(fd).st_size
        try:
            while data:
                data = data[os.write(fd, data):]
        except BaseException:
            os.ftruncate(fd, size)
            raise
    finally:
        os.close(fd)


def write_failure(path: str | os.PathLike, error: OSError, run_dir: str | os.PathLike) -> str:
    """One line for a run's write that failed: the file, the reason, what the run left, the fix."""
    if not Path(run_dir).is_dir():
        return f"{path}: cannot write it (the run directory was removed); the run stopped"
    why = error.strerror or str(error) or type(error).__name__
    if error.errno in (errno.ENOSPC, errno.EDQUOT):
        return (f"{path}: cannot write it ({why}); the run stopped, and every file of it is as it was before "
                f"this write (no summary.json: the run is unfinished); free space on that disk, then resume it "
                f"with --resume {run_dir} (if it writes checkpoints) or run it again with --overwrite")
    return f"{path}: cannot write it ({why}); the run stopped"


def is_finished(run_dir: str | os.PathLike) -> bool:
    """Whether ``run_dir`` holds a finished run: its summary.json, written last, is there (and its
    model.pt, the last file of runs made before summary.json came last)."""
    d = Path(run_dir)
    return (d / "summary.json").is_file() and (d / "model.pt").is_file()


def strict(obj):
    """``obj`` with every NaN or infinite float replaced by None: strict JSON, which jq and most
    parsers require (Python's json would write the non-standard tokens NaN and Infinity)."""
    if isinstance(obj, float):
        return obj if math.isfinite(obj) else None
    if isinstance(obj, dict):
        return {k: strict(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [strict(v) for v in obj]
    return obj


def json_text(obj, indent: int | None = None) -> str:
    """Strict JSON of ``obj`` (non-finite floats as null)."""
    return json.dumps(strict(obj), indent=indent, allow_nan=False)


def write_json(path: Path, obj) -> None:
    atomic_write(path, (json_text(obj, indent=2) + "\n").encode())


def read_run(run_dir: str | os.PathLike) -> dict:
    """A finished run directory as Python objects (config, metrics, summary, staleness, messages)."""
    d = Path(run_dir)
    try:
        return {
            "dir": d,
            "config": json.loads((d / "config.json").read_text()),
            "metrics": [json.loads(ln) for ln in (d / "metrics.jsonl").read_text().splitlines() if ln.strip()],
            "summary": json.loads((d / "summary.json").read_text()),
            "staleness": json.loads((d / "staleness.json").read_text()),
            # per message; runs made before 0.3 have none
            "messages": ([json.loads(ln) for ln in (d / "messages.jsonl").read_text().splitlines() if ln.strip()]
                         if (d / "messages.jsonl").exists() else []),
        }
    except FileNotFoundError as e:
        raise OutputError(f"{d}: not a finished stalegrad run (missing {Path(e.filename).name})") from None
    except json.JSONDecodeError as e:
        raise OutputError(f"{d}: corrupt run file ({e.msg} at line {e.lineno})") from None


def load_model(run_dir: str | os.PathLike) -> "torch.nn.Module":
    """Rebuild the final model of a run made with a named model (``--model``)."""
    import torch

    from .models import build_model
    path = Path(run_dir) / "model.pt"
    payload = torch.load(path, map_location="cpu", weights_only=True)
    spec = payload.get("model") or {}
    if "name" not in spec:
        raise OutputError(f"{path}: the run used a custom torch.nn.Module; rebuild it and load 'state_dict'")
    hidden = tuple(spec["hidden"]) if spec.get("hidden") else None
    model = build_model(spec["name"], tuple(spec["input_shape"]), spec["num_classes"], hidden=hidden)
    model.load_state_dict(payload["state_dict"])
    return model
