"""Data and timing wrappers shared by the simulator benchmarks."""
from __future__ import annotations

import threading
from pathlib import Path
from types import SimpleNamespace

import common
import torch
import torch.nn.functional as F

from stalegrad.runtimes import Simulator

FASHION = Path("/usr/share/datasets/fashion-mnist")


def image_data(n_train: int, n_test: int = 1000, seed: int = 0):
    """MNIST-shaped data: Fashion-MNIST when it is installed, else synthetic.

    Returns (train, test, source). Synthetic: class-dependent means plus
    noise, (1,28,28) float32, 10 classes, generated here from ``seed``.
    """
    if FASHION.is_dir():
        try:
            from stalegrad.data import load_pair
            train, test = load_pair("fashion-mnist", FASHION)
            train.x, train.y = train.x[:n_train].contiguous(), train.y[:n_train].contiguous()
            test.x, test.y = test.x[:n_test].contiguous(), test.y[:n_test].contiguous()
            return train, test, "fashion-mnist"
        except Exception:   # unreadable: fall through to synthetic
            pass
    gen = torch.Generator().manual_seed(seed)
    means = torch.randn(10, 1, 28, 28, generator=gen)

    def split(n):
        y = torch.randint(0, 10, (n,), generator=gen)
        x = means[y] + torch.randn(n, 1, 28, 28, generator=gen)
        return SimpleNamespace(x=x.contiguous(), y=y, num_classes=10)

    return split(n_train), split(n_test), "synthetic (1,28,28)"


class TimedSimulator(Simulator):
    """The simulator, timing only its event loop (no evaluation, no set-up)."""

    def run(self, *args, **kwargs):
        t = common.clock()
        super().run(*args, **kwargs)
        self.elapsed = common.clock() - t


class SteadySimulator(Simulator):
    """The simulator, timing its event loop after the set-up: ``elapsed`` excludes building the M
    workers (their optimizer state) and their first pulls, which ``setup`` times; a short run at
    large M is otherwise mostly set-up."""

    def run(self, *args, **kwargs):
        from stalegrad.runtimes.events import EventLoop
        from stalegrad.runtimes.vectorised import VectorisedLoop
        self.elapsed = 0.0
        originals = {cls: cls.__dict__["run"] for cls in (EventLoop, VectorisedLoop)}

        def timed(run):
            def wrapper(loop):
                t = common.clock()
                run(loop)
                self.elapsed += common.clock() - t
            return wrapper

        for cls, run in originals.items():
            cls.run = timed(run)
        t = common.clock()
        try:
            super().run(*args, **kwargs)
        finally:
            for cls, run in originals.items():
                cls.run = run
        self.setup = common.clock() - t - self.elapsed


def rss_bytes() -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    return 0


class PeakRSS:
    """Peak resident memory while a block runs, sampled every ``every`` seconds."""

    def __init__(self, every: float = 0.02):
        self.every, self.peak, self.base = every, 0, 0
        self._stop = threading.Event()

    def __enter__(self):
        self.base = self.peak = rss_bytes()
        self._thread = threading.Thread(target=self._poll, daemon=True)
        self._thread.start()
        return self

    def _poll(self):
        while not self._stop.wait(self.every):
            self.peak = max(self.peak, rss_bytes())

    def __exit__(self, *exc):
        self._stop.set()
        self._thread.join()
        self.peak = max(self.peak, rss_bytes())

    @property
    def growth_mb(self) -> float:
        return (self.peak - self.base) / 2**20


def plain_samples_per_s(model, opt, train, steps: int, batch: int) -> float:
    """samples/s of ``steps`` plain PyTorch training steps of ``model`` with ``opt`` (the baseline the
    simulator is held against): shuffled mini-batches gathered as the workers gather theirs."""
    gen = torch.Generator().manual_seed(0)
    x, y, n = train.x, train.y, len(train.y)
    perm, pos = torch.randperm(n, generator=gen), 0
    model.train()
    t = common.clock()
    for _ in range(steps):
        if pos + batch > n:
            perm, pos = torch.randperm(n, generator=gen), 0
        idx = perm[pos:pos + batch]
        pos += batch
        opt.zero_grad()
        loss = F.cross_entropy(model(x.index_select(0, idx)), y.index_select(0, idx))
        loss.backward()
        opt.step()
        loss.item()
    return steps * batch / (common.clock() - t)
