"""Run directories: what ``--out DIR`` holds, written so a crash loses nothing.

    config.json      the resolved configuration
    metrics.jsonl    one JSON object per evaluation, appended as they happen
    staleness.json   tau histogram, mean, max, per-worker figures
    summary.json     final/best accuracy, times, updates, staleness, weights hash
    model.pt         the final model (state_dict plus what rebuilds it)

JSON files are written to a temporary file and renamed, so a reader never
sees half a file.
"""
from __future__ import annotations

import json
import os
import tempfile
from contextlib import contextmanager
from pathlib import Path

import torch

from .errors import UsageError

RUN_FILES = ("config.json", "metrics.jsonl", "staleness.json", "summary.json", "model.pt")


class OutputError(UsageError):
    """A run directory or output path that cannot be used (one-line message)."""


@contextmanager
def atomic_open(path: str | os.PathLike):
    """A binary file that replaces ``path`` only once it is completely written."""
    path = Path(path)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
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


def atomic_write(path: Path, data: bytes) -> None:
    with atomic_open(path) as f:
        f.write(data)


def write_json(path: Path, obj) -> None:
    atomic_write(path, (json.dumps(obj, indent=2, sort_keys=False) + "\n").encode())


class RunWriter:
    """Owns one run directory for the duration of a run."""

    def __init__(self, out: str | os.PathLike, overwrite: bool = False, resume: bool = False):
        self.dir = Path(out)
        if resume:   # continue the run already there; start() rewrites its metrics
            if not (self.dir / "config.json").is_file():
                raise OutputError(f"--resume {self.dir}: not a stalegrad run directory (no config.json)")
            return
        if self.dir.exists() and not self.dir.is_dir():
            raise OutputError(f"--out {self.dir}: exists and is not a directory; choose another path")
        existing = [f for f in RUN_FILES if (self.dir / f).exists()]
        if existing and not overwrite:
            raise OutputError(f"--out {self.dir}: already holds a run ({existing[0]}); "
                              "pass --overwrite to replace it, or choose another directory")
        try:
            self.dir.mkdir(parents=True, exist_ok=True)
        except OSError as e:
            raise OutputError(f"--out {self.dir}: cannot create the directory ({e.strerror})") from None
        if existing:
            for f in existing:
                (self.dir / f).unlink()

    def start(self, config: dict, metrics: list[dict] = ()) -> None:
        """Write the configuration, and the metrics so far (a resumed run's)."""
        write_json(self.dir / "config.json", config)
        atomic_write(self.dir / "metrics.jsonl", "".join(json.dumps(m) + "\n" for m in metrics).encode())

    def metric(self, record: dict) -> None:
        with open(self.dir / "metrics.jsonl", "a") as f:
            f.write(json.dumps(record) + "\n")

    def finish(self, result, model_spec: dict | None = None) -> None:
        write_json(self.dir / "staleness.json", result.staleness)
        write_json(self.dir / "summary.json", result.summary)
        payload = {"state_dict": result.model.state_dict(), "weights": result.weights.cpu(),
                   "model": model_spec or {}, "summary": result.summary}
        with atomic_open(self.dir / "model.pt") as f:
            torch.save(payload, f)


def read_run(run_dir: str | os.PathLike) -> dict:
    """A finished run directory as Python objects (config, metrics, summary, staleness)."""
    d = Path(run_dir)
    try:
        return {
            "dir": d,
            "config": json.loads((d / "config.json").read_text()),
            "metrics": [json.loads(ln) for ln in (d / "metrics.jsonl").read_text().splitlines() if ln.strip()],
            "summary": json.loads((d / "summary.json").read_text()),
            "staleness": json.loads((d / "staleness.json").read_text()),
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
