"""Staleness penalties: the server shrinks a stale gradient before it steps.

- ``sasgd``: Staleness-aware ASGD (Zhang, Gupta, Lian, Liu, IJCAI 2016,
  arXiv 1511.05950). The learning rate of each gradient is divided by its
  staleness tau = i - j, the server's timestamp when the gradient arrives
  minus the one it was computed at (section 2.1): exactly our tau, the
  updates since the pull. A hardsync gradient has tau = 0 (section 2.4) and
  keeps the rate alpha0; ``staleness_offset = 1`` divides by tau + 1 instead
  (the rule that older runs ran, kept for their resumes)::

      g_sa = g / max(tau + staleness_offset, 1)

- ``gap-aware``: Gap-Aware (Barkai, Hakimi, Schuster, ICLR 2020, arXiv
  1909.10802). Each parameter's gradient is divided by its Gap, the distance
  that parameter moved since worker m pulled, in units of C, a running
  average of that parameter's step size. Two readings of C (``ga_reading``),
  k the updates before this one, lr_max the largest rate so far:

  ``authors`` (default; the authors' group's ``GapAware`` in FTPipe): before
  the step, from the raw gradient (with momentum: the momentum buffer as the
  previous step left it), bias-corrected over k + 1; weight decay penalised::

      v <- beta*v + (1-beta)*x*x          x = g (momentum: the buffer b)
      C = lr_max * (sqrt(v / (1 - beta^(k+1))) + eps);  G = 1 + |w - w_bak[m]| / C
      d = (g + wd*w) / G,  then heavy-ball momentum, w <- w - lr*d

  ``applied-step``: after the step, from the step d it applied, bias-corrected
  over k (G = 1 at k = 0); weight decay added after the penalty::

      C = lr_max * (sqrt(v / (1 - beta^k)) + eps);  G = 1 + |w - w_bak[m]| / C
      d = g/G + wd*w, then heavy-ball momentum, w <- w - lr*d;  v <- beta*v + (1-beta)*d*d

Both step as the other gradient rules do (``GradientAlgorithm``): momentum in
the order of torch.optim.SGD. docs/algorithms_after_2017.md records the
choices where the papers leave room, with the lines they rest on.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from .._lazy import torch
from . import fused
from ..errors import ConfigError
from .base import GradientAlgorithm, check_fraction, check_positive, elementwise, param
from .state import per_element, per_worker, scalar

if TYPE_CHECKING:
    from torch import Tensor

# Gap-Aware's two readings of C (docs/algorithms_after_2017.md): its authors' code, and the step applied
GA_READINGS = ("authors", "applied-step")


@dataclass(frozen=True)
class StalenessAwareASGD(GradientAlgorithm):
    name = "sasgd"
    probed = False
    summary = "staleness-aware ASGD (Zhang et al. 2016): each gradient's learning rate divided by its staleness"
    rule = ("w <- w - lr/max(tau + staleness_offset, 1) * g   (tau = i - j: updates since the pull; "
            "offset 0: the paper's lr/tau, lr at tau = 0)")
    staleness_offset: int = param(0, "0 divides the rate by the staleness tau as the paper does (lr at "
                                     "tau = 0); 1 divides by tau + 1", "--staleness-offset")

    def validate(self):
        super().validate()
        if type(self.staleness_offset) is not int or self.staleness_offset not in (0, 1):
            raise ConfigError("staleness_offset", "must be 0 (the paper's lr/tau, lr at tau = 0) or 1 "
                                                  f"(lr/(tau+1)), got {self.staleness_offset!r}", self.name)

    def scale(self, tau: int) -> float:
        """The factor of this gradient's rate: 1/tau (1 at tau = 0), or 1/(tau + 1) with offset 1."""
        return 1.0 / max(tau + self.staleness_offset, 1)

    @elementwise
    def server_delta(self, state, w, worker, msg, tau, lr, out):
        scale = self.scale(tau)
        if not (self.momentum or self.weight_decay):
            return msg, -lr * scale   # one pass over the message, as asgd
        # The division acts on this gradient's term only (lr/tau on g + wd*w), not on the
        # momentum that earlier gradients left in the buffer.
        if self.weight_decay:
            direction = torch.add(msg, w, alpha=self.weight_decay, out=out).mul_(scale)
        else:
            direction = torch.mul(msg, scale, out=out)
        return self.heavy_ball(state, direction, lr)

    def fused_apply(self, state, w, worker, msg, tau, lr, old, keep=None):
        if not (self.momentum or self.weight_decay):
            return None   # the torch path is already one pass: w.add_(g, alpha=-lr*scale)
        return fused.sasgd_apply(msg, w, state.momentum_buffer, old, scale=self.scale(tau),
                                 weight_decay=self.weight_decay, momentum=self.momentum, s=-lr, keep=keep)


@dataclass(frozen=True)
class GapAware(GradientAlgorithm):
    name = "gap-aware"
    probed = False
    summary = ("Gap-Aware (Barkai et al. 2020): each parameter's gradient divided by 1 + the distance it moved "
               "since the pull, in units of its running-average step size")
    rule = ("G = 1 + |w - w_bak[m]| / (lr_max*(sqrt(v_hat)+eps));  w <- w - lr*(g + wd*w)/G;  v: running mean "
            "of g^2 (momentum: of the buffer) before the step; --ga-reading applied-step: of the step after it")
    server_writes = ("momentum_buffer", "step_square")
    ga_beta: float = param(0.999, "decay beta of the running average of the squared gradient (or step) in C",
                           "--ga-beta")
    ga_eps: float = param(1e-8, "epsilon added to the root-mean-square gradient (or step) in C", "--ga-eps")
    ga_reading: str = param("authors", "what C averages: 'authors' (the authors' GapAware code) the raw squared "
                                       "gradient (with momentum: the buffer's) before the step, weight decay "
                                       "penalised too; 'applied-step' the squared step after it, weight decay not "
                                       "penalised", "--ga-reading", GA_READINGS)

    @dataclass
    class State(GradientAlgorithm.State):
        w_bak: list | None = per_worker()          # the weights each worker pulled
        step_square: Tensor | None = per_element()   # v: the running average of the squared gradient (or step)
        updates: int = scalar(0)                   # k: updates in the running average
        lr_max: float = scalar(0.0)                # the largest rate so far

    def validate(self):
        super().validate()
        check_fraction(self, "ga_beta", low_open=True)
        check_positive(self, "ga_eps")

    def server_init(self, w, num_workers):
        state = super().server_init(w, num_workers)
        state.w_bak = [w.clone() for _ in range(num_workers)]
        state.step_square = torch.zeros_like(w)
        return state

    def on_pull(self, state, worker, w):
        state.w_bak[worker].copy_(w)

    # Not @elementwise: it counts updates in scalars, which a chunk could not write back (the fused
    # kernel runs on the whole vectors and fused_apply updates the scalars once).
    def server_delta(self, state, w, worker, msg, tau, lr, out):
        state.lr_max = max(state.lr_max, lr)
        k = state.updates
        state.updates = k + 1
        if self.ga_reading == "authors":
            return self._authors_delta(state, w, worker, msg, k, lr, out)
        if k:
            # out = G = 1 + |w - w_bak| / C, then g / G
            c = torch.sqrt(state.step_square / (1 - self.ga_beta ** k)).add_(self.ga_eps).mul_(state.lr_max)
            torch.sub(w, state.w_bak[worker], out=out).abs_().div_(c).add_(1.0)
            direction = torch.div(msg, out, out=out)
        else:
            direction = out.copy_(msg)
        if self.weight_decay:
            direction.add_(w, alpha=self.weight_decay)
        step, s = self.heavy_ball(state, direction, lr)
        state.step_square.mul_(self.ga_beta).addcmul_(step, step, value=1 - self.ga_beta)
        return step, s

    def _authors_delta(self, state, w, worker, msg, k, lr, out):
        """The authors' reading: the average first, of the raw gradient (with momentum: of the buffer the
        previous step left), bias-corrected over k + 1 updates; then (g + wd*w)/G through the momentum."""
        v, beta = state.step_square, self.ga_beta
        x = state.momentum_buffer if self.momentum else msg
        v.mul_(beta).addcmul_(x, x, value=1 - beta)
        c = torch.sqrt(v / (1 - beta ** (k + 1))).add_(self.ga_eps).mul_(state.lr_max)
        gap = torch.sub(w, state.w_bak[worker], out=out).abs_().div_(c).add_(1.0)
        if self.weight_decay:   # (c is not needed any more: it takes g + wd*w)
            direction = torch.add(msg, w, alpha=self.weight_decay, out=c).div_(gap)
        else:
            direction = torch.div(msg, gap, out=out)
        return self.heavy_ball(state, direction, lr)

    def fused_apply(self, state, w, worker, msg, tau, lr, old, keep=None):
        # One call on the whole vectors: the scalars are updated here, once, as server_delta does.
        state.lr_max = max(state.lr_max, lr)
        k = state.updates
        state.updates = k + 1
        return fused.gap_aware_apply(msg, w, state.w_bak[worker], state.step_square, state.momentum_buffer,
                                     old, updates=k, lr_max=state.lr_max, beta=self.ga_beta, eps=self.ga_eps,
                                     weight_decay=self.weight_decay, momentum=self.momentum, s=-lr,
                                     authors=self.ga_reading == "authors", keep=keep)
