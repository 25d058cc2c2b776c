"""Starting the local runtime's child processes, and what each child does first.

Workers are started with 'forkserver' where it exists (Linux, macOS), else
'spawn'. Both start from a clean interpreter: 'fork' from the server would
copy its OpenMP thread pool (libgomp is not fork-safe: a child's first
parallel op can hang) and any CUDA context (unusable after fork). The fork
server imports torch and stalegrad once (it preloads the modules the children
run, ``child`` and ``evaluator``) and never runs a torch op, so a worker forked
from it starts in milliseconds, where 'spawn' spends ~2 s per process
importing torch.
"""
from __future__ import annotations

import ctypes
import os
import signal
import sys

import torch
import torch.multiprocessing as mp

from ...errors import ConfigError
from ...core.resources import available_memory  # noqa: F401  (re-exported: the local runtime's own check)

START_METHODS = ("forkserver", "spawn")
# what the fork server imports once, so that each child it forks has it already
_PRELOAD = [f"{__package__}.child", f"{__package__}.evaluator"]


def default_threads(num_workers: int) -> int:
    """Each worker's torch threads by default: the cores shared out, at least one."""
    return max(1, cores() // num_workers)


def cores() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:   # not Linux
        return os.cpu_count() or 1


def default_start_method() -> str:
    return "forkserver" if "forkserver" in mp.get_all_start_methods() else "spawn"


def check_start_method(method) -> None:
    if method is not None and method not in START_METHODS:
        raise ConfigError("start_method", f"must be one of {', '.join(START_METHODS)}, got {method!r} "
                                          "('fork' would copy the server's thread pools and CUDA state into the workers)")


def context(method: str | None):
    """The multiprocessing context the children are started with."""
    method = method or default_start_method()
    ctx = mp.get_context(method)
    if method == "forkserver":
        ctx.set_forkserver_preload(_PRELOAD)
    return ctx


def become_child(threads: int) -> None:
    """What every child does first."""
    # Ctrl-C in a terminal reaches the whole process group: the server alone
    # decides how to stop, and stops the children itself.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    if sys.platform.startswith("linux"):   # die with our parent (the server, or the fork server, which dies with it)
        try:
            ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)   # PR_SET_PDEATHSIG
        except (OSError, AttributeError):
            pass
    torch.set_num_threads(threads)


def worker_device(device: str, m: int) -> torch.device:
    """cuda without an index spreads the workers over the GPUs."""
    if device == "cuda" and torch.cuda.device_count() > 1:
        return torch.device("cuda", m % torch.cuda.device_count())
    return torch.device(device)


def describe_exit(proc) -> str:
    """Why a child process ended, in words."""
    proc.join(timeout=0.5)
    code = proc.exitcode
    if code is None:
        return "its pipe closed"
    if code < 0:
        try:
            return f"killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"killed by signal {-code}"
    return f"exit code {code}"
