"""Every algorithm of both papers and their baselines, by name."""
from __future__ import annotations

from .agn import AGN, CommitAlgorithm, Downpour
from .base import Algorithm, GradientAlgorithm
from .dcasgd import DCASGDAdaptive, DCASGDConstant
from .dynsgd import DynSGD
from .easgd import AEASGD, EASGD
from .sgd import ASGD, SGD, SSGD

ALGORITHMS: dict[str, type[Algorithm]] = {
    cls.name: cls
    for cls in (SGD, SSGD, ASGD, DCASGDConstant, DCASGDAdaptive, AGN, Downpour, DynSGD, EASGD, AEASGD)
}


def make_algorithm(name: str, **params) -> Algorithm:
    """Build and validate an algorithm from its name and hyper-parameters.

    Raises ValueError with a one-line message naming the problem and the fix.
    """
    if name not in ALGORITHMS:
        raise ValueError(f"unknown algorithm {name!r}; choose one of {', '.join(ALGORITHMS)}")
    cls = ALGORITHMS[name]
    known = {f.name for f in cls.hyperparameters()}
    for key in params:
        if key not in known:
            allowed = ", ".join(sorted(known)) or "none"
            raise ValueError(f"{name} has no parameter {key!r} (its parameters: {allowed})")
    algo = cls(**params)
    algo.validate()
    return algo


__all__ = ["ALGORITHMS", "make_algorithm", "Algorithm", "GradientAlgorithm", "CommitAlgorithm",
           "SGD", "SSGD", "ASGD", "DCASGDConstant", "DCASGDAdaptive", "AGN", "Downpour", "DynSGD",
           "EASGD", "AEASGD"]
