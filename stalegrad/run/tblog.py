"""TensorBoard logs of a run (``--tensorboard DIR``; ``pip install 'tensorboard>=2.14'``).

The same figures as the run directory, as ``torch.utils.tensorboard`` writes them:

- ``eval/*``: every evaluation's record (test accuracy and loss, training loss and accuracy, mean tau,
  learning rate, epoch, virtual seconds, skipped updates), at step = samples trained, with the run's
  wall time;
- ``workers/train_acc`` and ``workers/loss``: every message (messages.jsonl), at its samples;
- ``staleness/tau``: a histogram of the updates' tau between two evaluations, at each evaluation's step;
- ``final/*``: the summary's accuracies, and its notes as text.
"""
from __future__ import annotations

import contextlib
import math
import os
import tempfile
import time
from pathlib import Path

from ..errors import ConfigError

EVAL_SCALARS = ("test_acc", "test_loss", "train_loss", "train_acc", "tau_mean", "lr", "epoch", "virtual_s",
                "nonfinite_skipped")


def check_logdir(logdir: str | Path) -> None:
    """Refuse ``--tensorboard DIR`` before anything runs: its package is missing, or DIR cannot be
    a directory we write in (created at the start of the run, as TensorBoard does)."""
    try:
        from torch.utils.tensorboard import SummaryWriter  # noqa: F401
    except ImportError:
        raise ConfigError("tensorboard", "needs the tensorboard package: pip install 'tensorboard>=2.14'") \
            from None
    if str(logdir) == "":     # torch would log into its default ./runs/<date>_<host>
        raise ConfigError("tensorboard", "is empty; give a directory name (. for the current directory)")
    path = Path(logdir).absolute()
    existing = next(p for p in (path, *path.parents) if p.exists())
    if not existing.is_dir():
        raise ConfigError("tensorboard", f"is {str(logdir)!r}, but {existing} is a file, not a directory; "
                                         "give a directory")
    if not os.access(existing, os.W_OK | os.X_OK):
        raise ConfigError("tensorboard", f"is {str(logdir)!r}, but {existing} is not writable; give another directory")
    _try_writing(logdir, path)


def _try_writing(logdir, path: Path) -> None:
    """Create ``path`` and a file in it, then remove what was created: os.access says yes to root everywhere,
    and /proc, a read-only mount or a full disk would refuse only the run's first log, after it started."""
    made = []
    try:
        for p in (*reversed(path.parents), path):
            if not p.is_dir():
                p.mkdir()
                made.append(p)
        fd, probe = tempfile.mkstemp(prefix=".tensorboard.", suffix=".check", dir=path)
        os.close(fd)
        os.unlink(probe)
    except OSError as e:
        raise ConfigError("tensorboard", f"is {str(logdir)!r}, but that directory cannot be created or written "
                                         f"({e.strerror or e}); give another directory") from None
    finally:
        for p in reversed(made):
            with contextlib.suppress(OSError):
                p.rmdir()


def _finite(v) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


class TensorBoardLog:
    """Give ``metric`` as ``train(on_eval=...)`` and call ``finish(result)`` at the end."""

    def __init__(self, logdir: str | Path):
        from torch.utils.tensorboard import SummaryWriter
        self.writer = SummaryWriter(log_dir=str(logdir))
        self.start = time.time()

    def metric(self, record: dict) -> None:
        wall = self.start + (record.get("wall_s") or 0.0)
        for key in EVAL_SCALARS:
            if _finite(record.get(key)):
                self.writer.add_scalar(f"eval/{key}", record[key], record["samples"], walltime=wall)

    def finish(self, result) -> None:
        import numpy as np
        w = self.writer
        for m in result.messages:
            for key in ("train_acc", "loss"):
                if _finite(m[key]):
                    w.add_scalar(f"workers/{key}", m[key], m["samples"], walltime=self.start + m["wall_s"])
        taus = np.asarray(result.staleness_log.taus, dtype=np.int64)
        if taus.size:
            bins = np.arange(-0.5, int(taus.max()) + 1.5)   # one bin per tau value
            done = 0
            for record in result.metrics:
                upto = min(int(record.get("updates", 0)), taus.size)
                if upto > done:
                    w.add_histogram("staleness/tau", taus[done:upto], record["samples"], bins=bins)
                    done = upto
            if done < taus.size:
                w.add_histogram("staleness/tau", taus[done:], result.summary["samples"], bins=bins)
        s = result.summary
        for key in ("final_test_acc", "best_test_acc", "tau_mean", "tau_max"):
            if _finite(s.get(key)):
                w.add_scalar(f"final/{key}", s[key], s["samples"])
        if s.get("notes"):
            w.add_text("notes", "\n\n".join(s["notes"]), s["samples"])
        self.close()

    def close(self) -> None:
        self.writer.close()
