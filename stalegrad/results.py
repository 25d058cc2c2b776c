"""Run directories: what ``--out DIR`` holds, written so a crash loses nothing.

    config.json      the resolved configuration
    metrics.jsonl    one JSON object per evaluation, appended as they happen
    staleness.json   tau histogram, mean, max, per-worker figures
    summary.json     final/best accuracy, times, updates, staleness, weights hash
    model.pt         the final model (state_dict plus what rebuilds it)

JSON files are strict JSON (NaN and infinities become null), written to a
temporary file and renamed, so a reader never sees half a file. ``rundir.py``
owns a run directory for the life of a run.
"""
from __future__ import annotations

import json
import math
import os
import tempfile
from contextlib import contextmanager
from pathlib import Path

import torch

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


def load_model(run_dir: str | os.PathLike) -> torch.nn.Module:
    """Rebuild the final model of a run made with a named model (``--model``)."""
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
