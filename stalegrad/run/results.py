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
import hashlib
import json
import math
import os
import tempfile
from contextlib import contextmanager
from pathlib import Path

from ..errors import UsageError
from .files import JSON_LIMIT, JSONL_LIMIT, UnreadableFile, loads_json, read_text

def weights_sha256(w) -> str:
    """summary.json's hash of the final weights (float32 bytes)."""
    import torch
    return hashlib.sha256(w.detach().to("cpu", torch.float32).contiguous().numpy().tobytes()).hexdigest()


def messages_tensor(columns) -> object:
    """The columns of a run's messages (``array("d")`` each) as one (messages, fields) float64 tensor."""
    import torch
    return torch.stack([torch.frombuffer(c, dtype=torch.float64).clone() if len(c) else
                        torch.zeros(0, dtype=torch.float64) for c in columns], 1)


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


class DamagedRun(OutputError):
    """A run directory that is not a finished run, or whose files are damaged: ``dir`` and ``reason``."""

    def __init__(self, run_dir: Path, reason: str):
        super().__init__(f"{run_dir}: {reason}")
        self.dir, self.reason = run_dir, reason


def read_run(run_dir: str | os.PathLike) -> dict:
    """A finished run directory as Python objects (config, metrics, summary, staleness, messages).

    Raises ``DamagedRun`` (one line: the directory and what is wrong) for a missing, unreadable or
    malformed file; what is read is checked to have the shapes the readers of a run rely on."""
    d = Path(run_dir)
    run = {
        "dir": d,
        "config": _read(d, "config.json"),
        "metrics": _read(d, "metrics.jsonl", lines=True),
        "summary": _read(d, "summary.json"),
        "staleness": _read(d, "staleness.json"),
        # per message; runs made before 0.3 have none
        "messages": _read(d, "messages.jsonl", lines=True) if (d / "messages.jsonl").exists() else [],
    }
    _check_shapes(run)
    return run


def _read(d: Path, name: str, lines: bool = False):
    """The JSON (``lines``: JSON lines) of ``d/name``; ``DamagedRun`` saying why it cannot be read (missing,
    not a regular file, larger than ``JSON_LIMIT`` or ``JSONL_LIMIT``, not UTF-8, not JSON)."""
    try:
        text = read_text(d / name, JSONL_LIMIT if lines else JSON_LIMIT)
    except FileNotFoundError:
        raise DamagedRun(d, f"not a finished stalegrad run (missing {name})") from None
    except UnreadableFile as e:
        raise DamagedRun(d, f"{name} {e.reason}") from None
    if not lines:
        return _parse(d, name, text, 0)
    return [(i, _parse(d, name, ln, i)) for i, ln in enumerate(text.splitlines(), 1) if ln.strip()]


def _parse(d: Path, name: str, text: str, line: int):
    try:
        return loads_json(text)
    except json.JSONDecodeError as e:   # (nested too deeply too: "nested too deeply at line N")
        raise DamagedRun(d, f"{name} is corrupt ({e.msg} at line {line or e.lineno})") from None


# The numbers a record may hold (or null, for a non-finite value); any other key is left alone.
METRIC_NUMBERS = ("epoch", "updates", "samples", "wall_s", "virtual_s", "lr", "train_loss", "train_acc", "test_loss",
                  "test_acc", "val_loss", "val_acc", "tau_mean", "nonfinite_skipped")
MESSAGE_NUMBERS = ("samples", "wall_s", "virtual_s", "loss", "train_acc")
# What summary.json's figures can be: an accuracy is in [0, 1] (null: never measured), a count or a staleness is
# finite and >= 0 (null: none, e.g. no update); a loss may be anything a number can be (NaN: diverged).
ACCURACIES = ("final_test_acc", "best_test_acc", "final_val_acc", "best_val_acc", "test_acc", "val_acc", "train_acc")
SUMMARY_COUNTS = ("tau_mean", "tau_max", "nonfinite_skipped", "updates_dropped", "updates", "samples", "epochs")


def is_number(v) -> bool:
    return isinstance(v, int | float) and not isinstance(v, bool)


def value_problem(key: str, v, nan_ok: bool = False) -> str | None:
    """Why ``v`` cannot be the value of ``key`` in a run's files (an accuracy of 7.5, a count of Infinity), or None.
    ``nan_ok``: NaN means "not measured", as null does (a record of metrics.jsonl or messages.jsonl written before
    they were strict JSON)."""
    if v is None or (nan_ok and v != v):
        return None
    if not is_number(v):
        return f"{key} is {v!r:.40}, not a number"
    if key in ACCURACIES and not 0 <= v <= 1:   # (NaN is in no interval)
        return f"{key} is {v!r}, not an accuracy in [0, 1]"
    if key in SUMMARY_COUNTS and not (math.isfinite(v) and v >= 0):
        return f"{key} is {v!r}, not a finite number >= 0"
    return None


def summary_problem(summary) -> str | None:
    """Why ``summary`` (summary.json, parsed) is not what a run writes, or None: not an object, an impossible
    figure (``value_problem``), ``diverged`` not true or false."""
    if not isinstance(summary, dict):
        return f"summary.json is {_kind(summary)}, not a JSON object"
    for key in (*ACCURACIES[:4], *SUMMARY_COUNTS, "final_test_loss"):
        if (problem := value_problem(key, summary.get(key))) is not None:
            return f"summary.json: {problem}"
    if not isinstance(summary.get("diverged", False), bool):
        return f"summary.json: diverged is {summary['diverged']!r:.40}, not true or false"
    return None


def read_summary(run_dir: str | os.PathLike) -> dict:
    """The summary.json of ``run_dir``, checked (``summary_problem``); ``DamagedRun`` saying why not."""
    d = Path(run_dir)
    summary = _read(d, "summary.json")
    if (problem := summary_problem(summary)) is not None:
        raise DamagedRun(d, problem)
    return summary


def _check_shapes(run: dict) -> None:
    """Refuse a run whose files parse but hold something else than a run writes (``DamagedRun``);
    JSON lines become lists of records."""
    d = run["dir"]
    for name in ("config", "summary", "staleness"):
        if not isinstance(run[name], dict):
            raise DamagedRun(d, f"{name}.json is {_kind(run[name])}, not a JSON object")
    if (problem := summary_problem(run["summary"])) is not None:
        raise DamagedRun(d, problem)
    hist = run["staleness"].get("histogram")
    if hist is not None:
        if not isinstance(hist, dict) or not all(k.lstrip("-").isdigit() and is_number(v) for k, v in hist.items()):
            raise DamagedRun(d, "staleness.json: histogram is not a table of tau -> count")
    for name, numbers in (("metrics", METRIC_NUMBERS), ("messages", MESSAGE_NUMBERS)):
        for i, record in run[name]:
            if not isinstance(record, dict):
                raise DamagedRun(d, f"{name}.jsonl line {i} is {_kind(record)}, not a JSON object")
            problem = next(filter(None, (value_problem(k, record.get(k), nan_ok=True) for k in numbers)), None)
            if problem is not None:
                raise DamagedRun(d, f"{name}.jsonl line {i}: {problem}")
        run[name] = [record for _, record in run[name]]
    if not run["metrics"]:
        raise DamagedRun(d, "metrics.jsonl holds no evaluation (a finished run has at least the first one)")


def _kind(v) -> str:
    return {list: "a list", str: "a string", type(None): "null", bool: "a boolean"}.get(type(v), "a number")


def load_model(run_dir: str | os.PathLike) -> "torch.nn.Module":
    """Rebuild the final model of a run made with a named model (``--model``)."""
    import torch

    from ..models import build_model
    path = Path(run_dir) / "model.pt"
    payload = torch.load(path, map_location="cpu", weights_only=True)
    spec = payload.get("model") or {}
    if "name" not in spec:
        raise OutputError(f"{path}: the run used a custom torch.nn.Module; rebuild it and load 'state_dict'")
    hidden = tuple(spec["hidden"]) if spec.get("hidden") else None
    model = build_model(spec["name"], tuple(spec["input_shape"]), spec["num_classes"], hidden=hidden)
    model.load_state_dict(payload["state_dict"])
    return model


def _hashable(v):
    if isinstance(v, list | tuple):
        return tuple(_hashable(x) for x in v)
    if isinstance(v, dict):
        return tuple(sorted((k, _hashable(x)) for k, x in v.items()))
    return v


def flat_config(cfg: dict) -> tuple[dict, set]:
    """config.json as one flat dict (``algo``, its parameters, ``runtime``, ``delay``, ...), and the
    names that are the algorithm's parameters."""
    out, algo_keys = {}, set()
    for k, v in cfg.items():
        if k not in ("algorithm", "runtime") or not isinstance(v, dict):
            out[k] = _hashable(v)
    for part in ("algorithm", "runtime"):
        for k, v in (cfg.get(part) or {}).items():
            name = ("algo" if part == "algorithm" else "runtime") if k == "name" else k
            if name in out:
                name = f"{part}.{k}"
            out[name] = _hashable(v)
            if part == "algorithm":
                algo_keys.add(name)
    return out, algo_keys


def last_line(path: Path) -> str:
    """The last non-empty line of a text file (at most 500 characters), or "" when there is none."""
    try:
        with open(path, "rb") as f:   # its end only: a run's stderr may be long
            f.seek(max(0, f.seek(0, os.SEEK_END) - 65536))
            text = f.read().decode(errors="replace")
    except OSError:
        text = ""
    lines = [ln.strip() for ln in text.splitlines() if ln.strip()]
    return lines[-1][:500] if lines else ""
