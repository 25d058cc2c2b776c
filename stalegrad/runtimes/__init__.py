"""Runtimes move messages between workers and the parameter server.

They own no math and no training state: only *when* each worker pulls,
computes and pushes. ``sim`` is the deterministic simulator.
"""
from __future__ import annotations

from .sim import Simulator

RUNTIMES = ("sim",)


def make_runtime(runtime, num_workers: int):
    if isinstance(runtime, str):
        if runtime == "sim":
            return Simulator()
        raise ValueError(f"unknown runtime {runtime!r}; choose one of {', '.join(RUNTIMES)}")
    if not hasattr(runtime, "run"):
        raise TypeError(f"runtime must be a name or an object with run(training_run, seed), not {type(runtime).__name__}")
    return runtime


__all__ = ["Simulator", "make_runtime", "RUNTIMES"]
