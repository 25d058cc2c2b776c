"""Datasets, loaded whole into memory as torch tensors.

Training here is asynchronous and many workers index the same samples at
random, so every dataset is decoded once, up front, into one float32 tensor
``x`` of shape ``(N, *input_shape)`` and one int64 tensor ``y``. The training
loop then only slices tensors; nothing here runs per step.

Datasets
    mnist, fashion-mnist  IDX files (raw or gzipped), x (N, 1, 28, 28) in [0, 1]
    cifar10               the python pickle batches (or their .tar.gz),
                          x (N, 3, 32, 32) in [0, 1]
    digits                scikit-learn's bundled 8x8 digits, x (N, 1, 8, 8)
    synthetic             generated from ``seed``, x (N, 32)

Where files are looked for, first match wins (``find_dataset_dir``):
    1. the ``data_dir`` argument (the dataset folder itself, or a parent of
       ``<name>/``), 2. ``$STALEGRAD_DATA`` (the same), 3. the user cache
    ``$XDG_CACHE_HOME/stalegrad/<name>`` (``~/.cache/...``), which is where
    ``fetch`` puts downloads, 4. ``SYSTEM_DATA_DIRS`` (``/usr/share/datasets``,
    where Debian's ``dataset-fashion-mnist`` package installs its files).

Every problem with a file surfaces as one ``DataError`` (a ``UsageError``)
whose one-line message names the file, says what is wrong and how to fix it:
users see these on the command line, where a gzip or pickle traceback would
tell them nothing. An unknown dataset or split is a ``ConfigError`` naming
the parameter (``dataset``, ``split``).

The modules, one concern each: ``dataset`` (the container, ``DataError``,
the names), ``idx`` (MNIST, Fashion-MNIST), ``cifar`` (CIFAR-10), ``builtin``
(digits, synthetic), ``locate`` (look-up order, cache), ``download``
(``fetch``). This module only dispatches.

It may import only the top-level modules; never ``algorithms``, ``models``,
``core``, ``runtimes``, ``run``, ``study`` or ``cli`` (``tests/test_architecture.py``).
"""
from __future__ import annotations

import os

from .builtin import (SYNTHETIC_CLASSES, SYNTHETIC_FEATURES, SYNTHETIC_SIZES,
                      load_digits, load_synthetic)
from .cifar import load_cifar, parse_cifar_batch, read_cifar_archive
from .dataset import (DATASETS, FILE_DATASETS, SPLITS, DataError, Dataset,
                      check_name, check_split)
from .download import SOURCES, fetch
from .idx import load_idx_pair, parse_idx, read_file_bytes, read_idx
from .locate import ENV_VAR, SYSTEM_DATA_DIRS, cache_dir, find_dataset_dir

__all__ = [
    "DATASETS", "ENV_VAR", "FILE_DATASETS", "SOURCES", "SPLITS", "SYNTHETIC_CLASSES",
    "SYNTHETIC_FEATURES", "SYNTHETIC_SIZES", "SYSTEM_DATA_DIRS", "DataError", "Dataset",
    "cache_dir", "fetch", "find_dataset_dir", "load_dataset", "load_pair", "parse_cifar_batch",
    "parse_idx", "read_cifar_archive", "read_file_bytes", "read_idx",
]


def load_dataset(name: str, split: str, data_dir: str | os.PathLike | None = None,
                 *, seed: int = 0) -> Dataset:
    """Load one split ("train" or "test") of a dataset into memory.

    ``seed`` only matters for ``synthetic``; ``data_dir`` only for the
    datasets that live in files.
    """
    name = check_name(name)
    check_split(split)
    if name == "digits":
        return load_digits(split)
    if name == "synthetic":
        return load_synthetic(split, seed)
    folder = find_dataset_dir(name, data_dir)
    try:
        if name == "cifar10":
            return load_cifar(folder, split)
        return load_idx_pair(name, folder, split)
    except DataError as err:
        raise DataError(f"{err}; replace the file, e.g. with "
                        f"'stalegrad data fetch {name}'") from None


def load_pair(name: str, data_dir: str | os.PathLike | None = None,
              *, seed: int = 0) -> tuple[Dataset, Dataset]:
    """(train, test) of one dataset."""
    return (load_dataset(name, "train", data_dir, seed=seed),
            load_dataset(name, "test", data_dir, seed=seed))
