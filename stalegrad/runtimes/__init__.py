"""Runtimes move messages between workers and the parameter server.

They own no math and no training state: only *when* each worker pulls,
computes and pushes, and how the messages travel. ``base.py`` is the contract
every runtime implements; ``sim`` is the deterministic simulator, ``local``
runs real worker processes on this machine.

They may import ``core``, ``algorithms``, ``models``, ``data`` and the top-level
modules; never ``run``, ``study`` or ``cli`` (``tests/test_architecture.py``): a runtime sees a run only through
``base.Training``.
"""
from __future__ import annotations

import importlib

from ..errors import ConfigError
from .base import Evaluator, Runtime, Training

RUNTIMES = ("sim", "local", "ray")


def __getattr__(name: str):
    # The runtimes import torch: imported on first use (the CLI lists RUNTIMES without them).
    modules = {"Simulator": ".sim", "LocalRuntime": ".local", "RayRuntime": ".ray"}
    if name not in modules:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(modules[name], __name__), name)


def make_runtime(runtime) -> Runtime:
    """A runtime from its name (default options), or the given runtime object, checked."""
    if isinstance(runtime, str):
        if runtime == "sim":
            from .sim import Simulator
            return Simulator()
        if runtime == "local":
            from .local import LocalRuntime
            return LocalRuntime()
        if runtime == "ray":
            from .ray import RayRuntime
            return RayRuntime()
        raise ConfigError("runtime", f"must be one of {', '.join(RUNTIMES)}, got {runtime!r}")
    if not isinstance(runtime, Runtime):
        raise ConfigError("runtime", f"must be a name or an object with run(training, *, seed, resume) and "
                                     f"describe(), not {type(runtime).__name__}")
    return runtime


__all__ = ["Simulator", "LocalRuntime", "RayRuntime", "make_runtime", "RUNTIMES", "Runtime", "Training", "Evaluator"]
