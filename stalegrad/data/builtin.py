"""The datasets without files: digits (bundled with scikit-learn) and
synthetic (generated from a seed)."""
from __future__ import annotations

import gzip
import importlib.util
from pathlib import Path

import numpy as np

from .._lazy import torch
from .dataset import DataError, Dataset

# ---- digits: bundled with scikit-learn ---------------------------------------
_DIGITS_TEST = 360


def _bundled_digits():
    """(images (1797, 64), labels) as scikit-learn's ``load_digits(return_X_y=True)`` returns them.

    Read from the file scikit-learn bundles, as its loader reads it, without importing scikit-learn:
    that import (scipy.stats with it) cost 1.5 s of every run's start, and a grid starts a run per cell.
    Where that file is not found (another layout), scikit-learn's own loader reads it."""
    try:
        spec = importlib.util.find_spec("sklearn")
    except (ImportError, ValueError):
        spec = None
    if spec is None:
        raise DataError("dataset 'digits' needs scikit-learn: pip install scikit-learn")
    for folder in spec.submodule_search_locations or ():
        path = Path(folder) / "datasets" / "data" / "digits.csv.gz"
        if path.is_file():
            # sklearn.datasets.load_digits: np.loadtxt of this file, the last column the label
            with open(path, "rb") as raw, gzip.open(raw, mode="rt", encoding="utf-8") as text:
                data = np.loadtxt(text, delimiter=",")
            return data[:, :-1], data[:, -1].astype(int, copy=False)
    try:
        from sklearn.datasets import load_digits as sklearn_digits
    except ImportError:
        raise DataError("dataset 'digits' needs scikit-learn: pip install scikit-learn") from None
    return sklearn_digits(return_X_y=True)


def load_digits(split: str) -> Dataset:
    """scikit-learn's 8x8 digits, x (N, 1, 8, 8) in [0, 1]; the same 360 test digits every time."""
    images, labels = _bundled_digits()
    # A fixed permutation, independent of the run's seed, so that every run
    # (and every paper table) evaluates on the same 360 test digits.
    order = np.random.default_rng(0).permutation(len(labels))
    idx = order[-_DIGITS_TEST:] if split == "test" else order[:-_DIGITS_TEST]
    x = torch.from_numpy((images[idx] / 16.0).astype(np.float32)).view(-1, 1, 8, 8)
    y = torch.from_numpy(labels[idx].astype(np.int64))
    return Dataset("digits", x, y, 10)


# ---- synthetic: generated ----------------------------------------------------
SYNTHETIC_FEATURES = 32
SYNTHETIC_CLASSES = 10
SYNTHETIC_SIZES = {"train": 4096, "test": 1024}
# Each class is a mixture of two unit-variance Gaussian clusters whose centres
# sit on a sphere of this radius. At 4.0 the best possible accuracy is ~96%,
# a linear model gets ~80% and a small MLP ~90%+: it rewards training a
# non-linear model without being solved in a few steps.
_SYNTHETIC_RADIUS = 4.0
_SYNTHETIC_CLUSTERS = 2


def load_synthetic(split: str, seed: int) -> Dataset:
    """One split of the synthetic problem of ``seed``, x (N, 32)."""
    # Sub-seeds: one stream defines the problem (cluster centres), one each
    # draws the train and the test samples from it.
    root = int(seed) % 2**64
    problem = np.random.default_rng([root, 0])
    k = SYNTHETIC_CLASSES * _SYNTHETIC_CLUSTERS
    centres = problem.standard_normal((k, SYNTHETIC_FEATURES))
    centres *= _SYNTHETIC_RADIUS / np.linalg.norm(centres, axis=1, keepdims=True)

    rng = np.random.default_rng([root, 1 if split == "train" else 2])
    n = SYNTHETIC_SIZES[split]
    labels = rng.permutation(np.arange(n) % SYNTHETIC_CLASSES)  # balanced classes
    cluster = labels * _SYNTHETIC_CLUSTERS + rng.integers(0, _SYNTHETIC_CLUSTERS, n)
    points = centres[cluster] + rng.standard_normal((n, SYNTHETIC_FEATURES))
    return Dataset("synthetic", torch.from_numpy(points.astype(np.float32)),
                   torch.from_numpy(labels.astype(np.int64)), SYNTHETIC_CLASSES)
