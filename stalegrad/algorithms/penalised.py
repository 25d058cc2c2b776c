"""Staleness penalties: the server shrinks a stale gradient before it steps.

- ``sasgd``: Staleness-aware ASGD (Zhang, Gupta, Lian, Liu, IJCAI 2016,
  arXiv 1511.05950). The learning rate of each gradient is divided by its
  staleness. The paper counts a gradient's own update in its staleness (a
  gradient read at timestamp j and applied as update j -> j+1 has staleness
  1, and n-softsync has mean staleness n), so its tau_paper is our tau + 1,
  tau being the updates since the pull::

      g_sa = g / (tau + 1)

- ``gap-aware``: Gap-Aware (Barkai, Hakimi, Schuster, ICLR 2020, arXiv
  1909.10802). Each parameter's gradient is divided by its Gap, the distance
  that parameter moved since worker m pulled, in units of C, a running
  average of the server's step size for that parameter::

      v <- beta*v + (1-beta)*d*d          after every update w <- w - lr*d
      C = lr_max * (sqrt(v / (1 - beta^k)) + eps)   (k updates so far; lr_max the largest lr yet)
      G = 1 + |w - w_bak[m]| / C          (G = 1 before the first update: nothing moved)
      g_ga = g / G

Both then step as the other gradient rules do (``GradientAlgorithm``):
weight decay is added to the penalised gradient and heavy-ball momentum acts
on the sum, in the order of torch.optim.SGD; ``d`` is what the step moved by
(the momentum buffer, or the penalised gradient plus weight decay).
docs/algorithms_after_2017.md records the choices where the papers leave room.
"""
from __future__ import annotations

from dataclasses import dataclass

from .._lazy import torch
from . import fused
from .base import GradientAlgorithm, check_fraction, check_positive, elementwise, param


@dataclass(frozen=True)
class StalenessAwareASGD(GradientAlgorithm):
    name = "sasgd"
    probed = False
    summary = "staleness-aware ASGD (Zhang et al. 2016): each gradient's learning rate divided by its staleness"
    rule = "w <- w - lr/(tau+1) * g   (tau: updates since the pull; the paper's staleness counts the update itself)"

    @elementwise
    def server_delta(self, state, w, worker, msg, tau, lr, out):
        scale = 1.0 / (tau + 1)
        if not (self.momentum or self.weight_decay):
            return msg, -lr * scale   # one pass over the message, as asgd
        # The division acts on this gradient's term only (lr/tau_paper on g + wd*w), not on the
        # momentum that earlier gradients left in the buffer.
        if self.weight_decay:
            direction = torch.add(msg, w, alpha=self.weight_decay, out=out).mul_(scale)
        else:
            direction = torch.mul(msg, scale, out=out)
        if self.momentum:
            buf = state["momentum_buffer"]
            buf.mul_(self.momentum).add_(direction)
            direction = buf
        return direction, -lr

    def fused_apply(self, state, w, worker, msg, tau, lr, old):
        if not (self.momentum or self.weight_decay):
            return None   # the torch path is already one pass: w.add_(g, alpha=-lr/(tau+1))
        return fused.sasgd_apply(msg, w, state.get("momentum_buffer"), old, scale=1.0 / (tau + 1),
                                 weight_decay=self.weight_decay, momentum=self.momentum, s=-lr)


@dataclass(frozen=True)
class GapAware(GradientAlgorithm):
    name = "gap-aware"
    probed = False
    summary = ("Gap-Aware (Barkai et al. 2020): each parameter's gradient divided by 1 + the distance it moved "
               "since the pull, in units of its running-average step size")
    rule = ("G = 1 + |w - w_bak[m]| / (lr_max*(sqrt(v_hat)+eps));  w <- w - lr*(g/G);  "
            "v <- beta*v + (1-beta)*step^2")
    per_element_state = ("momentum_buffer", "w_bak", "step_square")
    ga_beta: float = param(0.999, "decay beta of the running average of the squared step", "--ga-beta")
    ga_eps: float = param(1e-8, "epsilon added to the root-mean-square step in C", "--ga-eps")

    def validate(self):
        super().validate()
        check_fraction(self, "ga_beta", low_open=True)
        check_positive(self, "ga_eps")

    def server_init(self, w, num_workers):
        state = super().server_init(w, num_workers)
        state["w_bak"] = [w.clone() for _ in range(num_workers)]
        state["step_square"] = torch.zeros_like(w)
        state["updates"] = 0      # k: updates in the running average
        state["lr_max"] = 0.0
        return state

    def on_pull(self, state, worker, w):
        state["w_bak"][worker].copy_(w)

    # Not @elementwise: it counts updates in scalars, which a chunk could not write back (the fused
    # kernel runs on the whole vectors and fused_apply updates the scalars once).
    def server_delta(self, state, w, worker, msg, tau, lr, out):
        state["lr_max"] = max(state["lr_max"], lr)
        k = state["updates"]
        if k:
            # out = G = 1 + |w - w_bak| / C, then g / G
            c = torch.sqrt(state["step_square"] / (1 - self.ga_beta ** k)).add_(self.ga_eps).mul_(state["lr_max"])
            torch.sub(w, state["w_bak"][worker], out=out).abs_().div_(c).add_(1.0)
            direction = torch.div(msg, out, out=out)
        else:
            direction = out.copy_(msg)
        if self.weight_decay:
            direction.add_(w, alpha=self.weight_decay)
        if self.momentum:
            buf = state["momentum_buffer"]
            buf.mul_(self.momentum).add_(direction)
            direction = buf
        state["step_square"].mul_(self.ga_beta).addcmul_(direction, direction, value=1 - self.ga_beta)
        state["updates"] = k + 1
        return direction, -lr

    def fused_apply(self, state, w, worker, msg, tau, lr, old):
        # One call on the whole vectors: the scalars are updated here, once, as server_delta does.
        state["lr_max"] = max(state["lr_max"], lr)
        k = state["updates"]
        state["updates"] = k + 1
        return fused.gap_aware_apply(msg, w, state["w_bak"][worker], state["step_square"], state.get("momentum_buffer"),
                                     old, updates=k, lr_max=state["lr_max"], beta=self.ga_beta, eps=self.ga_eps,
                                     weight_decay=self.weight_decay, momentum=self.momentum, s=-lr)

