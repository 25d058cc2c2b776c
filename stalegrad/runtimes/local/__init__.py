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
- ``main_module``: whether the children can import the script that started the run;
- ``child``: the worker process; ``evaluator``: the evaluator process and
  its server side;
- ``session``: the server loop; ``cut``: its checkpoints as a consistent cut; ``stats``: latencies,
  timeline, trace.
"""
from __future__ import annotations

import os
from dataclasses import dataclass

from ...core import pacing
from ...core.pacing import profile_description
from ...errors import ConfigError, check_finite_positive
from ...errors import check_writable
from ..base import Training
from .main_module import check_main_script
from .processes import (START_METHODS, available_memory, check_start_method, cores, default_start_method,
                        default_threads)
from .protocol import WorkerError
from .session import Session


@dataclass
class LocalRuntime:
    """M worker processes and a parameter server on this machine.

    ``threads_per_worker`` (default ``max(1, cores // M)``) is each worker's
    ``torch.set_num_threads``; ``record_trace`` a CSV file for the order of
    pushes (``worker,pulled,applied,wall_s``), which ``--runtime sim --delay
    trace:FILE`` replays. ``worker_timeout``: seconds a live worker may send
    nothing while the server waits for it (its start: at least a minute)
    before it is treated as lost, as a killed one is; it keeps synchronous
    rounds from waiting forever for a stopped or hung worker. After a run, ``stats`` holds the measured transport
    figures and ``pids`` the processes it used (a worker's is None if it was
    lost before the checkpoint a run resumed from).

    ``delay``: a speed profile (``core/delays.py``, as the simulator's ``--delay``), made real: each worker
    sleeps out whatever its computation leaves of its message's drawn time (``core/pacing.py``), so the run is
    a cluster of uneven machines; ``step_time`` is the seconds of one local step of a speed-1 worker (default:
    sized from one measured step so that the workers ask for a quarter of the cores). Default: no profile, every
    worker as fast as its cores allow.
    """
    threads_per_worker: int | None = None
    record_trace: str | os.PathLike | None = None
    start_method: str | None = None    # default: forkserver where there is one, else spawn
    stop_timeout: float = 2.0          # seconds a worker gets to finish its message at the end
    worker_timeout: float = 300.0      # seconds of silence, while awaited, after which a worker is lost
    delay: str | None = None           # a speed profile (core/delays.py); None: no pacing
    step_time: float | None = None     # seconds per local step of a speed-1 worker; None: automatic

    def __post_init__(self):
        self.worker_timeout = check_finite_positive("worker_timeout", self.worker_timeout)
        t = self.threads_per_worker
        if t is not None and (not isinstance(t, int) or isinstance(t, bool) or t < 1):
            raise ConfigError("threads_per_worker", f"must be a positive integer, got {t!r}")
        if t is not None and t > cores():   # more threads than cores only slow a worker; thousands crash it
            raise ConfigError("threads_per_worker", f"is {t}, more than this machine's {cores()} cores; "
                                                    f"give at most {cores()}")
        check_start_method(self.start_method)
        self.stats: dict = {}
        self.pids: dict = {"workers": [], "evaluator": None}

    def check(self, config) -> None:
        """Refuse options that cannot work for this run (before anything is written)."""
        check_main_script()
        check_workers(config.workers)
        pacing.check_run(self.delay, self.step_time, config)
        if self.record_trace is not None:
            check_writable("record_trace", self.record_trace)

    def describe(self) -> dict:
        return {"name": "local", "threads_per_worker": self.threads_per_worker, "cores": cores(),
                "start_method": self.start_method or default_start_method(),
                "record_trace": str(self.record_trace) if self.record_trace is not None else None,
                "worker_timeout": self.worker_timeout, **profile_description(self.delay, self.step_time)}

    def run(self, training: Training, *, seed: int = 0, resume: dict | None = None) -> None:
        """Drive ``training`` to its sample budget with real worker processes; ``resume`` is
        the state this runtime last gave ``training.save_checkpoint``."""
        if resume is not None and resume.get("kind") != "local":
            raise ConfigError("runtime", "is local, but the checkpoint was made by another runtime; "
                                         "resume it with that runtime")
        Session(self, training, resume, seed).execute()


# What one worker process costs: its own interpreter and PyTorch (about 300 MB resident), and threads.
WORKERS_PER_CORE = 32
WORKER_MEMORY = 300 * 2**20


def max_workers() -> tuple[int, str]:
    """The most worker processes this machine can run, and the machine in words (for the message)."""
    n = cores()
    limit, machine = WORKERS_PER_CORE * n, f"{n} core{'s' if n != 1 else ''}"
    memory = available_memory()
    if memory is not None:
        limit = min(limit, memory // WORKER_MEMORY)
        machine += f", {memory / 2**30:.1f} GiB available"
    return max(2, limit), machine


def check_workers(workers: int) -> None:
    """Refuse more worker processes than this machine can run (before any is started)."""
    limit, machine = max_workers()
    if workers > limit:
        raise ConfigError("workers", f"is {workers}, but the local runtime runs one process per worker and this "
                                     f"machine ({machine}) can run at most {limit} ({WORKERS_PER_CORE} per core, "
                                     f"about {WORKER_MEMORY >> 20} MB each); use the simulator (runtime sim) "
                                     "for more workers")


__all__ = ["LocalRuntime", "WorkerError", "default_threads", "max_workers", "START_METHODS"]
