"""stalegrad: asynchronous data-parallel training with staleness-aware optimizers.

    import stalegrad as sg
    train, test = sg.load_pair("digits")
    result = sg.train("mlp", train, test, sg.DCASGDAdaptive(), workers=8,
                      runtime=sg.Simulator(delay="gamma:2"), epochs=5, lr=0.1)
    print(result.summary["final_test_acc"], result.staleness["tau_mean"])
"""
from .algorithms import (AEASGD, AGN, ALGORITHMS, ASGD, DCASGDAdaptive, DCASGDConstant, SGD, SSGD,
                         Algorithm, Downpour, DynSGD, EASGD, make_algorithm)
from .data import Dataset, load_dataset, load_pair  # noqa: E402
from .runtimes import LocalRuntime, Simulator
from .server import ParameterServer
from .train import TrainResult, train

__version__ = "0.1.0"

__all__ = ["train", "TrainResult", "Simulator", "LocalRuntime", "ParameterServer", "load_dataset", "load_pair", "Dataset",
           "ALGORITHMS", "make_algorithm", "Algorithm", "SGD", "SSGD", "ASGD", "DCASGDConstant",
           "DCASGDAdaptive", "AGN", "Downpour", "DynSGD", "EASGD", "AEASGD"]
