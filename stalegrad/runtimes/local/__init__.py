"""Real asynchronous training on one machine (``--runtime local``).

The main process is the parameter server: it drives the ``Training``
(``runtimes/base.py``) and its ``ParameterServer`` from a single-threaded loop
over one pipe per worker process. The M workers run the simulator's worker
loop (``Worker``, built by the run's ``WorkerFactory``) at their own pace;
only the transport is new:

- weights move through shared memory: each worker has a pull buffer, which the
  server fills with one memory copy of its weights, and a push buffer, into
  which the worker copies its message; the pipes carry only tiny tuples;
- the training and test sets are in shared memory, mapped by every process;
- test-set evaluation runs in an evaluator process on a snapshot of the
  weights, so it never stalls an update;
- a worker that dies is removed from the server (synchronous rounds stop
  waiting for it), its shard goes to the survivors, and the run goes on;
- a checkpoint is a consistent cut: every worker is held between two
  messages while its state is gathered.

The files, one concern each (none imports this one):

- ``protocol``: the messages in both directions and the shared-memory layout;
- ``processes``: start methods, what each child does first, exit reasons;
- ``child``: the worker process; ``evaluator``: the evaluator process and
  its server side;
- ``session``: the server loop; ``stats``: latencies, timeline, trace.
"""
from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from ...errors import ConfigError
from ..base import Training
from .processes import START_METHODS, check_start_method, cores, default_start_method, default_threads
from .protocol import WorkerError
from .session import _Session


@dataclass
class LocalRuntime:
    """M worker processes and a parameter server on this machine.

    ``threads_per_worker`` (default ``max(1, cores // M)``) is each worker's
    ``torch.set_num_threads``; ``record_trace`` a CSV file for the order of
    pushes (``worker,pulled,applied,wall_s``), which ``--runtime sim --delay
    trace:FILE`` replays. After a run, ``stats`` holds the measured transport
    figures and ``pids`` the processes it used (a worker's is None if it was
    lost before the checkpoint a run resumed from).
    """
    threads_per_worker: int | None = None
    record_trace: str | os.PathLike | None = None
    start_method: str | None = None    # default: forkserver where there is one, else spawn
    stop_timeout: float = 2.0          # seconds a worker gets to finish its message at the end

    def __post_init__(self):
        t = self.threads_per_worker
        if t is not None and (not isinstance(t, int) or isinstance(t, bool) or t < 1):
            raise ConfigError("threads_per_worker", f"must be a positive integer, got {t!r}")
        check_start_method(self.start_method)
        self.stats: dict = {}
        self.pids: dict = {"workers": [], "evaluator": None}

    def check(self, config) -> None:
        """Refuse options that cannot work for this run (before anything is written)."""
        if self.record_trace is not None:
            parent = Path(self.record_trace).resolve().parent
            if not parent.is_dir():
                raise ConfigError("record_trace", f"is {str(self.record_trace)!r}, but the directory {parent} "
                                                  "does not exist")

    def describe(self) -> dict:
        return {"name": "local", "threads_per_worker": self.threads_per_worker, "cores": cores(),
                "start_method": self.start_method or default_start_method(),
                "record_trace": str(self.record_trace) if self.record_trace is not None else None}

    def run(self, training: Training, *, seed: int = 0, resume: dict | None = None) -> None:
        """Drive ``training`` to its sample budget with real worker processes; ``resume`` is
        the state this runtime last gave ``training.save_checkpoint``."""
        if resume is not None and resume.get("kind") != "local":
            raise ConfigError("runtime", "is local, but the checkpoint was made by another runtime; "
                                         "resume it with that runtime")
        _Session(self, training, resume).execute()


__all__ = ["LocalRuntime", "WorkerError", "default_threads", "START_METHODS"]
