"""Runtimes move messages between workers and the parameter server.

They own no math and no training state: only *when* each worker pulls,
computes and pushes. ``sim`` is the deterministic simulator; ``local`` runs
real worker processes on this machine.
"""
from __future__ import annotations

from .local import LocalRuntime
from .sim import Simulator

RUNTIMES = ("sim", "local")


def make_runtime(runtime, num_workers: int):
    if isinstance(runtime, str):
        if runtime == "sim":
            return Simulator()
        if runtime == "local":
            return LocalRuntime()
        raise ValueError(f"unknown runtime {runtime!r}; choose one of {', '.join(RUNTIMES)}")
    if not hasattr(runtime, "run"):
        raise TypeError(f"runtime must be a name or an object with run(training_run, seed), not {type(runtime).__name__}")
    return runtime


__all__ = ["Simulator", "LocalRuntime", "make_runtime", "RUNTIMES"]
