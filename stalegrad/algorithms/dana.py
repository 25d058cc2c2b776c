"""DANA (Hakimi, Barkai, Gabel, Schuster, arXiv 1907.11612, "Taming momentum in a
distributed asynchronous environment"): asynchronous momentum SGD whose workers
compute their gradient at an estimate of the server's future position.

DANA-Zero keeps the workers' momentum vectors on the server, one per worker,
and their sum. Worker m's gradient g (computed at what it pulled) updates its
own momentum only (``gamma``: ``--momentum``)::

    v[m] <- gamma*v[m] + (g + wd*w)         (the order of torch.optim.SGD)
    w    <- w - lr * v[m]

and a pull sends not w but the look-ahead, where the momentum of all workers
would carry w if no gradient arrived::

    w_hat[m] = w - lr * gamma * sum_i v[i]

(``lr``: the rate of the last update, as the authors' code takes it from the
optimizer after its step). DANA-DC (``dana-dc``) also corrects the gradient
with DC-ASGD's Taylor term, taken from the look-ahead worker m computed at::

    g_dc = g + lam * g*g*(w - w_hat[m])

before it enters the momentum. docs/algorithms_after_2017.md gives the
sources (the paper and the authors' DANA-DC code) and the choices made.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from .._lazy import torch
from . import fused
from .base import GradientAlgorithm, check_nonnegative, param
from .state import RuleState, per_element, per_worker, scalar

if TYPE_CHECKING:
    from torch import Tensor


@dataclass(frozen=True)
class DANAZero(GradientAlgorithm):
    name = "dana-zero"
    probed = False
    summary = ("DANA-Zero (Hakimi et al. 2019): one momentum per worker on the server; a pull sends the "
               "look-ahead w - lr*gamma*sum(v)")
    rule = "v[m] <- gamma*v[m] + g;  w <- w - lr*v[m];  pull: w_hat[m] = w - lr*gamma*sum_i v[i]"
    server_writes = ("momenta", "momentum_sum")   # (w_bak, DANA-DC's look-ahead: written by on_pull only)
    momentum: float = param(0.9, "momentum gamma of each worker's momentum vector, kept on the server", "--momentum")

    @dataclass
    class State(RuleState):   # (not GradientAlgorithm's: the momenta are per worker)
        momenta: list | None = per_worker()          # v[m]: each worker's momentum
        momentum_sum: Tensor | None = per_element()   # sum_i v[i]
        lr: float = scalar(0.0)   # the rate of the last update, for the next pull's look-ahead (none before one)
        w_bak: list | None = per_worker()   # DANA-DC: the look-ahead each worker computes at (None: DANA-Zero)

    def default_lr(self):
        # The effective step of momentum gamma is lr/(1 - gamma): 0.1*(1 - gamma) keeps the 0.1 of
        # the rules without momentum (0.1 itself with gamma = 0.9 diverges on the tests' blobs).
        return 0.1 * (1 - self.momentum)

    def server_init(self, w, num_workers):
        return self.State(momenta=[torch.zeros_like(w) for _ in range(num_workers)], momentum_sum=torch.zeros_like(w))

    def on_pull(self, state, worker, w):
        look_ahead = self.look_ahead_buffer(state, worker, w)
        return torch.add(w, state.momentum_sum, alpha=-state.lr * self.momentum, out=look_ahead)

    def look_ahead_buffer(self, state, worker, w):
        """Where the look-ahead is written (DANA-DC keeps it as the worker's snapshot)."""
        return torch.empty_like(w)

    def corrected(self, state, w, worker, g, out):
        """The gradient that enters worker m's momentum (DANA-DC: with the delay compensation)."""
        return g

    # Not @elementwise: it keeps the learning rate in a scalar, which a chunk could not write back.
    def server_delta(self, state, w, worker, msg, tau, lr, out):
        g = self.corrected(state, w, worker, msg, out)
        if self.weight_decay:
            g = torch.add(g, w, alpha=self.weight_decay, out=out)
        v = state.momenta[worker]
        # change = (gamma - 1)*v + g, so that v and the sum move by the same amount
        change = torch.add(g, v, alpha=self.momentum - 1, out=out)
        v.add_(change)
        state.momentum_sum.add_(change)
        state.lr = lr
        return v, -lr

    def fused_apply(self, state, w, worker, msg, tau, lr, old, keep=None):
        # One pass (the look-ahead of on_pull stays one torch operator: a pass of its own, at pull time)
        finite = fused.dana_apply(msg, w, None if state.w_bak is None else state.w_bak[worker],
                                  state.momenta[worker], state.momentum_sum, old, lam=getattr(self, "lam", None),
                                  gamma=self.momentum, weight_decay=self.weight_decay, s=-lr, keep=keep)
        state.lr = lr
        return finite


@dataclass(frozen=True)
class DANADC(DANAZero):
    name = "dana-dc"
    summary = "DANA-DC (Hakimi et al. 2019): DANA-Zero with DC-ASGD's delay compensation at the look-ahead"
    rule = ("g_dc = g + lam*g*g*(w - w_hat[m]);  v[m] <- gamma*v[m] + g_dc;  w <- w - lr*v[m];  "
            "pull: w_hat[m] = w - lr*gamma*sum_i v[i]")
    lam: float = param(2.0, "variance-control parameter lambda of the delay compensation", "--lam")

    def validate(self):
        super().validate()
        check_nonnegative(self, "lam")

    def server_init(self, w, num_workers):
        state = super().server_init(w, num_workers)
        state.w_bak = [w.clone() for _ in range(num_workers)]
        return state

    def look_ahead_buffer(self, state, worker, w):
        return state.w_bak[worker]

    def corrected(self, state, w, worker, g, out):
        # out = g + lam * g*g*(w - w_hat[m]): (w - w_hat)*g, then one fused addcmul
        torch.sub(w, state.w_bak[worker], out=out).mul_(g)
        return torch.addcmul(g, out, g, value=self.lam, out=out)
