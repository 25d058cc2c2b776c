"""DC-ASGD (Zheng et al., ICML 2017): delay-compensated asynchronous SGD.

The server corrects a stale gradient with the diagonal of the first-order
Taylor term, using the weights that *this* worker pulled (w_bak[m], one
snapshot per worker, taken at pull time as in the paper's Algorithm 2):

    g_dc = g + lam * g*g*(w - w_bak[m])

DC-ASGD-a makes lam element-wise, lam0 / sqrt(ms[m] + eps), with one
MeanSquare ms[m] per worker, updated *before* it is used (the order of the
authors' dcasgda_updater.h). Momentum and weight decay, when enabled, act on
g_dc afterwards (see GradientAlgorithm.sgd_step): the Taylor term corrects the
loss gradient only.
"""
from __future__ import annotations

from dataclasses import dataclass

from .._lazy import torch

from . import fused
from .base import GradientAlgorithm, check_fraction, check_nonnegative, check_positive, elementwise, param
from .state import per_worker


class _DelayCompensated(GradientAlgorithm):
    server_writes = ("momentum_buffer",)   # (w_bak: written by on_pull only)

    @dataclass
    class State(GradientAlgorithm.State):
        w_bak: list | None = per_worker()   # one snapshot per worker: the weights it pulled, never shared

    def server_init(self, w, num_workers):
        state = super().server_init(w, num_workers)
        state.w_bak = [w.clone() for _ in range(num_workers)]
        return state

    def on_pull(self, state, worker, w):
        state.w_bak[worker].copy_(w)


@dataclass(frozen=True)
class DCASGDConstant(_DelayCompensated):
    name = "dcasgd-c"
    summary = "DC-ASGD with constant lambda (Zheng et al. 2017)"
    rule = "w <- w - lr*(g + lam*g*g*(w - w_bak[m]))"
    lam: float = param(0.04, "variance-control parameter lambda of the delay compensation", "--lam")

    def validate(self):
        super().validate()
        check_nonnegative(self, "lam")

    @elementwise
    def server_delta(self, state, w, worker, msg, tau, lr, out):
        g = msg
        # out = g + lam * g*g*(w - w_bak): (w - w_bak)*g, then one fused addcmul
        torch.sub(w, state.w_bak[worker], out=out).mul_(g)
        torch.addcmul(g, out, g, value=self.lam, out=out)
        return self.sgd_step(state, w, out, lr, out)

    def fused_apply(self, state, w, worker, msg, tau, lr, old, keep=None):
        return fused.dcasgd_c_apply(msg, w, state.w_bak[worker], state.momentum_buffer, old,
                                    lam=self.lam, weight_decay=self.weight_decay, momentum=self.momentum, s=-lr, keep=keep)


@dataclass(frozen=True)
class DCASGDAdaptive(_DelayCompensated):
    name = "dcasgd-a"
    summary = "DC-ASGD with adaptive, element-wise lambda and a MeanSquare per worker (Zheng et al. 2017)"
    rule = ("ms[m] <- mom*ms[m] + (1-mom)*g*g;  "
            "w <- w - lr*(g + lam0/sqrt(ms[m]+eps) * g*g*(w - w_bak[m]))")
    lam0: float = param(2.0, "lambda_0 of the adaptive lambda", "--lam0")
    ms_momentum: float = param(0.95, "momentum m of the per-worker MeanSquare", "--ms-momentum")
    eps: float = param(1e-7, "epsilon inside the square root", "--eps")
    server_writes = ("momentum_buffer", "mean_square")

    @dataclass
    class State(_DelayCompensated.State):
        mean_square: list | None = per_worker()   # the MeanSquare ms[m] of each worker

    def validate(self):
        super().validate()
        check_nonnegative(self, "lam0")
        check_positive(self, "eps")
        check_fraction(self, "ms_momentum")

    def server_init(self, w, num_workers):
        state = super().server_init(w, num_workers)
        state.mean_square = [torch.zeros_like(w) for _ in range(num_workers)]
        return state

    @elementwise
    def server_delta(self, state, w, worker, msg, tau, lr, out):
        g = msg
        ms = state.mean_square[worker]
        ms.mul_(self.ms_momentum).addcmul_(g, g, value=1 - self.ms_momentum)
        # out = g + lam0/sqrt(ms+eps) * g*g*(w - w_bak): g*g*(w - w_bak), then one fused addcdiv
        self.drift(state, w, worker, out).mul_(g).mul_(g)
        torch.addcdiv(g, out, ms.add(self.eps).sqrt_(), value=self.lam0, out=out)
        return self.sgd_step(state, w, out, lr, out)

    def drift(self, state, w, worker, out):
        """``out = w - w_bak[worker]``, how far the weights moved since this worker pulled: the delay the
        Taylor term compensates (a mechanism control replaces it, ``algorithms.controls``)."""
        return torch.sub(w, state.w_bak[worker], out=out)

    def fused_apply(self, state, w, worker, msg, tau, lr, old, keep=None):
        return fused.dcasgd_a_apply(msg, w, state.w_bak[worker], state.mean_square[worker],
                                    state.momentum_buffer, old, lam0=self.lam0, ms_momentum=self.ms_momentum,
                                    eps=self.eps, weight_decay=self.weight_decay, momentum=self.momentum, s=-lr,
                                    keep=keep)
