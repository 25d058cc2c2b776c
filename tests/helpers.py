"""Small data sets the tests share."""
from types import SimpleNamespace

import torch


def blobs(n=256, d=8, classes=3, seed=0):
    """Gaussian blobs around class means fixed once for all calls: ``seed`` only draws the samples."""
    means = torch.randn(classes, d, generator=torch.Generator().manual_seed(1234)) * 3
    g = torch.Generator().manual_seed(seed)
    y = torch.randint(0, classes, (n,), generator=g)
    x = means[y] + torch.randn(n, d, generator=g)
    return SimpleNamespace(x=x, y=y, num_classes=classes)


# The training and test sets of the simulator, checkpoint and reference tests.
TRAIN, TEST = blobs(seed=0), blobs(n=128, seed=1)


def write_trace(path, rows):
    """A delay trace file (``--delay trace:PATH``) of ``(worker, pulled, applied, wall_s)`` rows."""
    path.write_text("worker,pulled,applied,wall_s\n" + "".join(f"{w},{p},{a},{t}\n" for w, p, a, t in rows))
