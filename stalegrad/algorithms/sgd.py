"""Plain gradient rules: sequential SGD, synchronous SGD, asynchronous SGD."""
from __future__ import annotations

from dataclasses import dataclass

from .base import GradientAlgorithm, elementwise


@dataclass(frozen=True)
class SGD(GradientAlgorithm):
    name = "sgd"
    summary = "sequential SGD: one worker, no staleness; the reference every experiment compares against"
    rule = "w <- w - lr*g"
    sequential = True

    @elementwise
    def server_delta(self, state, w, worker, msg, tau, lr, out):
        return self.sgd_step(state, w, msg, lr, out)


@dataclass(frozen=True)
class ASGD(GradientAlgorithm):
    name = "asgd"
    summary = "asynchronous SGD (Downpour with window 1): each gradient is applied as it arrives"
    rule = "w <- w - lr*g_m   (g_m computed on the weights worker m pulled, tau updates ago)"

    @elementwise
    def server_delta(self, state, w, worker, msg, tau, lr, out):
        return self.sgd_step(state, w, msg, lr, out)


@dataclass(frozen=True)
class SSGD(GradientAlgorithm):
    name = "ssgd"
    summary = "synchronous SGD: wait for one gradient from every worker, apply their average"
    rule = "w <- w - lr * mean_m(g_m)   (all g_m computed on the same w)"
    synchronous = True

    @elementwise
    def round_delta(self, state, w, msgs, lr, out):
        # mean = (((0 + g_0) + g_1) + ...) / M, summed in ``out`` without temporaries
        out.zero_()
        for g in msgs.values():
            out.add_(g)
        out.div_(len(msgs))
        return self.sgd_step(state, w, out, lr, out)
