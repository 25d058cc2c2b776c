"""What every loader returns and every loader raises: the ``Dataset`` container,
``DataError``, and the names of the datasets and splits."""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import numpy as np

from .._lazy import torch
from ..errors import ConfigError, UsageError

DATASETS = ("mnist", "fashion-mnist", "cifar10", "digits", "synthetic")
# The datasets that live in files; the others are bundled or generated.
FILE_DATASETS = ("mnist", "fashion-mnist", "cifar10")
SPLITS = ("train", "test")


class DataError(UsageError):
    """A dataset cannot be found or read: one line naming the file (or the
    dataset), what is wrong with it and how to fix it."""

    def __init__(self, message: str):
        # Messages quote other exceptions' text; keep them on one line anyway.
        super().__init__(" ".join(str(message).splitlines()))


@dataclass
class Dataset:
    """A data set in memory, what every loader returns: ``x`` float32 of shape (N, *input_shape), ``y`` int64
    class labels of shape (N,), ``num_classes`` and its ``name``. Checked when made (ValueError if the dtypes
    or shapes do not fit); ``to(device)`` moves a copy."""
    name: str
    x: torch.Tensor          # float32, (N, *input_shape), contiguous
    y: torch.Tensor          # int64, (N,)
    num_classes: int

    def __post_init__(self):
        if self.x.dtype != torch.float32 or self.y.dtype != torch.int64:
            raise ValueError(f"{self.name}: x must be float32 and y int64, "
                             f"got {self.x.dtype} and {self.y.dtype}")
        if self.y.dim() != 1 or self.x.dim() < 2 or len(self.x) != len(self.y):
            raise ValueError(f"{self.name}: x {tuple(self.x.shape)} and "
                             f"y {tuple(self.y.shape)} do not pair up")
        self.x = self.x.contiguous()
        self.y = self.y.contiguous()

    @property
    def input_shape(self) -> tuple[int, ...]:
        return tuple(self.x.shape[1:])

    def __len__(self) -> int:
        return len(self.y)

    def to(self, device) -> "Dataset":
        return dataclasses.replace(self, x=self.x.to(device), y=self.y.to(device))


def check_name(name: str) -> str:
    """The canonical spelling of dataset ``name`` (``Fashion_MNIST`` -> ``fashion-mnist``)."""
    key = str(name).strip().lower().replace("_", "-")
    if key not in DATASETS:
        raise ConfigError("dataset", f"must be one of {', '.join(DATASETS)}, got {name!r}")
    return key


def check_split(split: str) -> str:
    if split not in SPLITS:
        raise ConfigError("split", f"must be one of {', '.join(SPLITS)}, got {split!r}")
    return split


def check_labels(labels: np.ndarray, num_classes: int, source: str) -> None:
    """DataError unless every label is in ``0..num_classes - 1``."""
    bad = np.flatnonzero((labels < 0) | (labels >= num_classes))
    if bad.size:
        i = int(bad[0])
        raise DataError(f"{source}: label {int(labels[i])} at index {i} is out of "
                        f"range 0..{num_classes - 1} ({bad.size} such labels)")
