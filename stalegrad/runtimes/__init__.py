"""Runtimes move messages between workers and the parameter server.

They own no math and no training state: only *when* each worker pulls,
computes and pushes, and how the messages travel. ``base.py`` is the contract
every runtime implements; ``sim`` is the deterministic simulator, ``local``
runs real worker processes on this machine.
"""
from __future__ import annotations

from ..errors import ConfigError
from .base import Evaluator, Runtime, Training
from .local import LocalRuntime
from .sim import Simulator

RUNTIMES = ("sim", "local")


def make_runtime(runtime) -> Runtime:
    """A runtime from its name (default options), or the given runtime object, checked."""
    if isinstance(runtime, str):
        if runtime == "sim":
            return Simulator()
        if runtime == "local":
            return LocalRuntime()
        raise ConfigError("runtime", f"must be one of {', '.join(RUNTIMES)}, got {runtime!r}")
    if not isinstance(runtime, Runtime):
        raise ConfigError("runtime", f"must be a name or an object with run(training, *, seed, resume) and "
                                     f"describe(), not {type(runtime).__name__}")
    return runtime


__all__ = ["Simulator", "LocalRuntime", "make_runtime", "RUNTIMES", "Runtime", "Training", "Evaluator"]
