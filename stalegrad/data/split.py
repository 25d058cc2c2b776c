"""The validation split: ``val_split`` training samples held out of training, the same for every seed.

``split_indices(n, count)`` draws one permutation of ``0..n-1`` from the fixed seed ``VAL_SPLIT_SEED``
(never the run's seed): its first ``count`` indices are the validation set, the others, in their
original order, the training set. The split is independent of the training seed on purpose: the
selection seeds and the reporting seeds (docs/results/README.md, "Protocol") then train on the same
samples and are validated on the same samples, so the seed changes only the training's randomness
(initial weights, shards, mini-batch order, delays) and a setting selected on seeds 0-2 is reported
on seeds 3-9 under the very split it was chosen on.
"""
from __future__ import annotations

import dataclasses
from types import SimpleNamespace

from .._lazy import torch

VAL_SPLIT_SEED = 20260101   # fixed: the validation set of a data set is the same in every run


def val_count(val_split, n: int) -> int:
    """The number of samples ``val_split`` holds out of ``n``: a count as given, a fraction in (0, 1)
    rounded to the nearest count, 0 for no split."""
    if not val_split:
        return 0
    if isinstance(val_split, float) and 0 < val_split < 1:
        return int(round(val_split * n))
    return int(val_split)


def split_indices(n: int, count: int, seed: int = VAL_SPLIT_SEED):
    """(train indices, validation indices) of a data set of ``n`` samples: disjoint, together all of
    ``0..n-1``, each in increasing order; the same for the same (n, count, seed)."""
    order = torch.randperm(n, generator=torch.Generator().manual_seed(seed))
    val = order[:count].sort().values
    keep = torch.ones(n, dtype=torch.bool)
    keep[val] = False
    return keep.nonzero().flatten(), val


def holdout(data, count: int, seed: int = VAL_SPLIT_SEED):
    """(training part, validation part) of ``data`` (anything with ``x``, ``y``); ``(data, None)`` for
    ``count`` 0. The parts keep ``name`` and ``num_classes`` when ``data`` has them."""
    if not count:
        return data, None
    train_idx, val_idx = split_indices(len(data.y), count, seed)

    def part(idx):
        x, y = data.x[idx].contiguous(), data.y[idx].contiguous()
        if dataclasses.is_dataclass(data):      # a Dataset stays one
            return dataclasses.replace(data, x=x, y=y)
        fields = {k: getattr(data, k) for k in ("name", "num_classes") if hasattr(data, k)}
        return SimpleNamespace(x=x, y=y, **fields)
    return part(train_idx), part(val_idx)
