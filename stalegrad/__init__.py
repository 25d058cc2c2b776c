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
import importlib.abc
import importlib.machinery
import os
import sys
import warnings

# Idle OpenMP threads spin briefly at a barrier, then sleep. torch's default (libgomp) spins for
# 300,000 iterations; when another process holds one of the cores, the spinning thread waits for its
# descheduled peer and a step took 20 to 90 times as long (docs/performance.md, "Stalls in diverging
# runs"). Sleeping at once (OMP_WAIT_POLICY=PASSIVE) cures that but made a lone run 1.7 times slower;
# 10,000 iterations keep both. The arithmetic is the same either way (same weights_sha256). libgomp
# reads this when torch is first imported, so it acts only if stalegrad is imported before torch; a
# wait policy or spin count the user set wins.
if "OMP_WAIT_POLICY" not in os.environ:
    os.environ.setdefault("GOMP_SPINCOUNT", "10000")
# The same bits at any thread count and on any x86-64 CPU with AVX2 (stalegrad/numerics.py). MKL's
# matrix products are thread-count independent in strict CNR mode, and the same on every CPU when its
# code branch is pinned; torch's own kernels are the same when their instruction set is pinned
# (AVX512 kernels round differently from AVX2 ones). Both are read when torch starts, so this acts only
# if stalegrad is imported before torch (the simulator checks MKL and falls back to one thread where
# torch had already started it). Measured cost on an AVX512 machine: 0 to 12% (docs/performance.md,
# "Reproducible bits"). A value the user set wins; without AVX2, MKL chooses its branch (AUTO).
def _has_avx2() -> bool:
    try:
        with open("/proc/cpuinfo", encoding="ascii", errors="replace") as f:
            return any(line.startswith("flags") and " avx2" in line for line in f)
    except OSError:
        return False


if _has_avx2():
    os.environ.setdefault("MKL_CBWR", "AVX2,STRICT")
    os.environ.setdefault("ATEN_CPU_CAPABILITY", "avx2")
else:
    os.environ.setdefault("MKL_CBWR", "AUTO,STRICT")

__version__ = "0.4.0"

_WHERE = {
    "train": "run.training", "TrainResult": "run.training", "TrainingRun": "run.training",
    "RunConfig": "run.config",
    "StalegradError": "errors", "UsageError": "errors", "ConfigError": "errors", "RunError": "errors",
    "Simulator": "runtimes", "LocalRuntime": "runtimes", "RayRuntime": "runtimes", "Runtime": "runtimes", "Training": "runtimes",
    "ParameterServer": "core.server", "ShardedServer": "core.sharding", "Worker": "core.worker",
    "WorkerFactory": "core.worker",
    "load_dataset": "data", "load_pair": "data", "Dataset": "data", "fetch": "data.download",
    "build_model": "models", "load_model": "run.results",
    # every rule class of algorithms.ALGORITHMS (tests/test_public_api.py derives the list from it)
    **{name: "algorithms" for name in ("ALGORITHMS", "make_algorithm", "Algorithm", "SGD", "SSGD", "ASGD",
                                       "DCASGDConstant", "DCASGDAdaptive", "AGN", "Downpour", "DynSGD",
                                       "EASGD", "AEASGD", "StalenessAwareASGD", "GapAware", "DANAZero", "DANADC",
                                       "DiLoCo", "AsyncLocalSGD", "DCASGDAdaptiveScrambled",
                                       "DCASGDAdaptiveRedrawn", "DCASGDAdaptiveDamped", "RingmasterASGD",
                                       "RennalaSGD", "MSynchronousSGD")},
}

__all__ = list(_WHERE)


def __getattr__(name: str):
    if name not in _WHERE:
        raise AttributeError(f"module 'stalegrad' has no attribute {name!r}")
    value = getattr(importlib.import_module(f".{_WHERE[name]}", __name__), name)
    globals()[name] = value   # once imported, a plain attribute
    return value


# Modules that moved into the layers' subpackages (ARCHITECTURE.md): their old paths still import, with a
# DeprecationWarning, until the next release. The old name is the same module object as the new one.
MOVED = {old: f"{sub}.{old}" for sub, names in (
    ("core", "server server_checks sharding worker delays probes prober schedules resources"),
    ("run", "training config validation model_check checkpoint checkpoint_schema rundir results tblog "
            "progress metrics files"),
    ("study", "grid grid_names grid_ray stages selection stats intervals report report_curves report_plots "
              "report_probes report_protocol report_time plot"),
) for old in names.split()}


class _MovedModules(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Finds ``stalegrad.<old>`` for a moved module: imports its new path, warns, and puts that module under the
    old name (``_load_unlocked`` returns what ``sys.modules`` holds once ``exec_module`` has run)."""

    def find_spec(self, fullname, path=None, target=None):
        head, _, old = fullname.partition(".")
        if head == __name__ and old in MOVED:
            return importlib.machinery.ModuleSpec(fullname, self)
        return None

    def create_module(self, spec):
        return None

    def exec_module(self, module):
        old = module.__name__.partition(".")[2]
        new = f"{__name__}.{MOVED[old]}"
        warnings.warn(f"{module.__name__} moved to {new}; import it from there (the old path goes in the next "
                      f"release)", DeprecationWarning, stacklevel=2)
        sys.modules[module.__name__] = importlib.import_module(new)


if not any(isinstance(f, _MovedModules) for f in sys.meta_path):
    sys.meta_path.append(_MovedModules())


def __dir__():
    return sorted(list(globals()) + __all__)
