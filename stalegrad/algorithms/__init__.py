"""Every algorithm of both papers, their baselines and the rules that came after, by name.

The math layer: it may import only the top-level ``errors`` and ``_lazy``; never ``models``, ``data``, ``core``,
``runtimes``, ``run``, ``study`` or ``cli`` (``tests/test_architecture.py``).
"""
from __future__ import annotations

import warnings

from ..errors import ConfigError
from .agn import AGN, AccumulatedCommit, CommitAlgorithm, Downpour
from .base import Algorithm, GradientAlgorithm
from .controls import DCASGDAdaptiveDamped, DCASGDAdaptiveRedrawn, DCASGDAdaptiveScrambled
from .dana import DANADC, DANAZero
from .dcasgd import DCASGDAdaptive, DCASGDConstant
from .dynsgd import DynSGD
from .easgd import AEASGD, EASGD
from .local_sgd import AsyncLocalSGD, DiLoCo
from .penalised import GapAware, StalenessAwareASGD
from .sgd import ASGD, SGD, SSGD
from .time_rules import MSynchronousSGD, RennalaSGD, RingmasterASGD

ALGORITHMS: dict[str, type[Algorithm]] = {
    cls.name: cls
    for cls in (SGD, SSGD, ASGD, DCASGDConstant, DCASGDAdaptive, AGN, Downpour, DynSGD, EASGD, AEASGD,
                StalenessAwareASGD, GapAware, DANAZero, DANADC, DiLoCo, AsyncLocalSGD, DCASGDAdaptiveScrambled,
                DCASGDAdaptiveRedrawn,   # control: the Taylor term's sign redrawn at every push
                DCASGDAdaptiveDamped,    # control: a scalar pull of its mean size (damping only)
                RingmasterASGD, RennalaSGD, MSynchronousSGD)
}


# Renamed parameters, accepted under their old name for one release: (algorithm class, old) -> new.
RENAMED = {(CommitAlgorithm, "weight_decay"): "local_weight_decay"}


# Parameters added since a run may have been saved, with the value that reproduces the rule such a run ran:
# (algorithm, parameter) -> value. A resume fills an absent one with this, not with today's default.
ADDED = {("sasgd", "staleness_offset"): 1,            # older runs: lr/(tau+1), not the paper's lr/tau
         ("gap-aware", "ga_reading"): "applied-step"}  # C from the applied step until the authors' reading


def as_saved(name: str, params: dict) -> dict:
    """``params`` saved for algorithm ``name``, with every parameter added since filled as the saved run ran."""
    return {**{key: value for (algo, key), value in ADDED.items() if algo == name and key not in params}, **params}


def renamed(cls: type[Algorithm], key: str) -> str | None:
    """The new name of ``key`` if it is a deprecated spelling of one of ``cls``'s parameters."""
    return next((new for (base, old), new in RENAMED.items() if old == key and issubclass(cls, base)), None)


def make_algorithm(name: str, **params) -> Algorithm:
    """Build and validate an algorithm from its name and hyper-parameters.

    Raises ConfigError with a one-line message naming the problem and the fix.
    """
    if name not in ALGORITHMS:
        raise ConfigError("algorithm", f"must be one of {', '.join(ALGORITHMS)}, got {name!r}")
    cls = ALGORITHMS[name]
    known = {f.name for f in cls.hyperparameters()}
    for key in list(params):
        new = renamed(cls, key)
        if new is not None and new not in params:
            warnings.warn(f"{name}: {key} is now called {new} (the old name goes in the next release)",
                          DeprecationWarning, stacklevel=2)
            params[new] = params.pop(key)
        elif key not in known:
            allowed = ", ".join(sorted(known)) or "none"
            raise ConfigError(key, f"is not a parameter of {name} (its parameters: {allowed})")
    algo = cls(**params)
    algo.validate()
    return algo


__all__ = ["ALGORITHMS", "make_algorithm", "Algorithm", "GradientAlgorithm", "CommitAlgorithm",
           "SGD", "SSGD", "ASGD", "DCASGDConstant", "DCASGDAdaptive", "AGN", "Downpour", "DynSGD",
           "EASGD", "AEASGD", "AccumulatedCommit", "StalenessAwareASGD", "GapAware", "DANAZero", "DANADC",
           "DiLoCo", "AsyncLocalSGD", "RingmasterASGD", "RennalaSGD", "MSynchronousSGD",
           "DCASGDAdaptiveScrambled", "DCASGDAdaptiveRedrawn", "DCASGDAdaptiveDamped"]
