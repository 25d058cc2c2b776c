"""stalegrad: asynchronous data-parallel training with staleness-aware optimizers.

    import stalegrad as sg
    train, test = sg.load_pair("digits")
    result = sg.train("mlp", train, test, sg.DCASGDAdaptive(), workers=8,
                      runtime=sg.Simulator(delay="gamma:2"), epochs=5, lr=0.1)
    print(result.summary["final_test_acc"], result.staleness["tau_mean"])

Names are imported on first use (PEP 562), so that ``import stalegrad`` and
the command line's help do not pay for importing torch.
"""
from __future__ import annotations

import importlib
import os

# Idle OpenMP threads spin briefly at a barrier, then sleep. torch's default (libgomp) spins for
# 300,000 iterations; when another process holds one of the cores, the spinning thread waits for its
# descheduled peer and a step took 20 to 90 times as long (docs/performance.md, "Stalls in diverging
# runs"). Sleeping at once (OMP_WAIT_POLICY=PASSIVE) cures that but made a lone run 1.7 times slower;
# 10,000 iterations keep both. The arithmetic is the same either way (same weights_sha256). libgomp
# reads this when torch is first imported, so it acts only if stalegrad is imported before torch; a
# wait policy or spin count the user set wins.
if "OMP_WAIT_POLICY" not in os.environ:
    os.environ.setdefault("GOMP_SPINCOUNT", "10000")
# MKL's matrix products give the same bits at any thread count in strict CNR mode, which MKL reads from
# this variable when it starts (stalegrad/numerics.py; the simulator checks it and falls back to one
# thread where torch had already started MKL). A mode the user set wins.
os.environ.setdefault("MKL_CBWR", "AUTO,STRICT")

__version__ = "0.3.0"

_WHERE = {
    "train": "training", "TrainResult": "training", "TrainingRun": "training",
    "RunConfig": "config",
    "StalegradError": "errors", "UsageError": "errors", "ConfigError": "errors", "RunError": "errors",
    "Simulator": "runtimes", "LocalRuntime": "runtimes", "RayRuntime": "runtimes", "Runtime": "runtimes", "Training": "runtimes",
    "ParameterServer": "server",
    "load_dataset": "data", "load_pair": "data", "Dataset": "data",
    **{name: "algorithms" for name in ("ALGORITHMS", "make_algorithm", "Algorithm", "SGD", "SSGD", "ASGD",
                                       "DCASGDConstant", "DCASGDAdaptive", "AGN", "Downpour", "DynSGD",
                                       "EASGD", "AEASGD")},
}

__all__ = list(_WHERE)


def __getattr__(name: str):
    if name not in _WHERE:
        raise AttributeError(f"module 'stalegrad' has no attribute {name!r}")
    value = getattr(importlib.import_module(f".{_WHERE[name]}", __name__), name)
    globals()[name] = value   # once imported, a plain attribute
    return value


def __dir__():
    return sorted(list(globals()) + __all__)
