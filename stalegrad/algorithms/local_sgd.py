"""Local SGD with an outer optimizer: DiLoCo and asynchronous Local-SGD.

Workers take ``window`` local optimizer steps from the weights they pulled and
commit the change c = w_local - w_pulled, whose negative is the paper's
pseudo-gradient. The server applies an outer optimizer to it
(``agn.AccumulatedCommit``: sgd or nesterov).

- ``diloco`` (Douillard et al., arXiv 2311.08105): synchronous, the local-step
  family's counterpart of ssgd. A round averages every worker's commit and
  takes one outer Nesterov step (the paper's outer lr 0.7, momentum 0.9)::

      c = mean_m(c_m);  b <- mu*b + c;  w <- w + outer_lr*(c + mu*b)

- ``async-local-sgd`` (Liu et al., arXiv 2401.09135, "Asynchronous Local-SGD
  Training for Language Modeling"): each commit is applied as it arrives,
  with the paper's Delayed Nesterov outer optimizer (its Algorithm 3). With
  g = -c the pseudo-gradient, N the delay (``--dn-delay``, default the number
  of workers), m the momentum and D a buffer of the pseudo-gradients since
  the last momentum update, at the server's t-th update (from 0)::

      D <- D + g
      if (t+1) % N == 0:  m <- beta*m + D/N;  w <- w - eps*((1 - c*N + c)*beta*m + g/N);  D <- 0
      else:               w <- w - eps*(c*beta*m + g/N)

  so that over N updates the momentum moves once, on the average of their
  pseudo-gradients, and the weights move as one Nesterov step would (c = 0,
  the paper's setting; 0 <= c <= 1/N spreads the momentum over the N updates).
  The paper's dynamic local updates (a window per worker from its speed) need
  the workers' speeds, which only a runtime knows: not implemented.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from .._lazy import torch
from ..errors import ConfigError
from . import fused
from .agn import AccumulatedCommit
from .base import check_nonnegative, elementwise, param
from .state import per_element, scalar

if TYPE_CHECKING:
    from torch import Tensor


@dataclass(frozen=True)
class DiLoCo(AccumulatedCommit):
    name = "diloco"
    probed = False
    summary = ("DiLoCo (Douillard et al. 2023): synchronous local SGD; the server takes an outer Nesterov step "
               "on the mean commit")
    rule = ("worker: window local steps from the pulled w, commit c_m = w_local - w_pulled;  server, once every "
            "worker committed: c = mean(c_m), b <- mu*b + c, w <- w + outer_lr*(c + mu*b)")
    synchronous = True
    outer_opt: str = param("nesterov", "the server's outer optimizer on the commit (the negative pseudo-gradient); "
                           "sgd at outer-lr 1 adds the commit as it is", "--outer-opt", ("sgd", "nesterov"))
    outer_lr: float = param(0.7, "learning rate of the outer optimizer", "--outer-lr")

    @elementwise
    def round_delta(self, state, w, msgs, lr, out):
        # mean = (((0 + c_0) + c_1) + ...) / M, summed in ``out`` without temporaries (as ssgd)
        out.zero_()
        for c in msgs.values():
            out.add_(c)
        out.div_(len(msgs))
        return self.outer_step(state, out, 1.0, out)


@dataclass(frozen=True)
class AsyncLocalSGD(AccumulatedCommit):
    name = "async-local-sgd"
    probed = False
    summary = ("asynchronous Local-SGD with Delayed Nesterov (Liu et al. 2024): each commit applied as it "
               "arrives; the outer momentum moves once every N updates")
    rule = ("worker: window local steps, commit c = w_local - w_pulled (g = -c);  server: D <- D + g; every N-th "
            "update m <- beta*m + D/N, w <- w - eps*(beta*m + g/N), D <- 0; else w <- w - eps*g/N")
    outer_opt: str = param("delayed-nesterov", "the server's outer optimizer on the commit (the negative "
                           "pseudo-gradient); sgd at outer-lr 1 adds the commit as it is", "--outer-opt",
                           ("sgd", "nesterov", "delayed-nesterov"))
    outer_lr: float = param(0.7, "learning rate of the outer optimizer", "--outer-lr")
    dn_delay: int = param(0, "delayed-nesterov: server updates N between two momentum updates; 0: the number "
                          "of workers", "--dn-delay")
    dn_c: float = param(0.0, "delayed-nesterov: share c of the momentum applied at every update, "
                        "0 <= c <= 1/N", "--dn-c")

    server_writes = ("outer_buffer", "dn_sum")

    @dataclass
    class State(AccumulatedCommit.State):   # delayed-nesterov's (None with another outer optimizer):
        dn_sum: Tensor | None = per_element()   # D, the commits since the last momentum update (in their sign)
        dn_updates: int | None = scalar()       # the updates so far
        dn_delay: int | None = scalar()         # N: updates between two momentum updates

    def writes(self, state, worker):
        if self.outer_opt == "delayed-nesterov" and (state.dn_updates + 1) % state.dn_delay:
            return ("dn_sum",)   # the momentum moves on every N-th update only
        return self.server_writes

    def validate(self):
        super().validate()
        if not isinstance(self.dn_delay, int) or isinstance(self.dn_delay, bool) or self.dn_delay < 0:
            raise ConfigError("dn_delay", f"must be a non-negative integer (0: the number of workers), "
                                          f"got {self.dn_delay!r}", self.name)
        check_nonnegative(self, "dn_c")
        if self.outer_opt != "delayed-nesterov":   # they would be recorded while doing nothing
            given = "dn_delay" if self.dn_delay else "dn_c" if self.dn_c else None
            if given is not None:
                raise ConfigError(given, f"applies to outer_opt delayed-nesterov only (its N and c), not "
                                         f"{self.outer_opt}; drop it, or use outer_opt delayed-nesterov", self.name)
        if self.dn_delay:
            self.check_workers(self.dn_delay)

    def check_updates(self, updates: int) -> None:
        """Refuse an N (dn_delay) larger than the ``updates`` the run makes: the momentum would never move,
        and every update is 1/N of a pseudo-gradient, so that training does nothing (N = 1e20: the model
        stayed at its initial accuracy). N <= updates moves the momentum at least once, and the weights by at
        least one outer step on the mean pseudo-gradient."""
        if self.outer_opt == "delayed-nesterov" and self.dn_delay > max(1, updates):
            raise ConfigError("dn_delay", f"is {self.dn_delay}, more than the {updates} server updates this run "
                                          f"makes, so that the momentum never moves and each update is 1/"
                                          f"{self.dn_delay} of a commit; give at most {max(1, updates)} (0: the "
                                          "number of workers)", self.name)

    def check_workers(self, num_workers):
        n = self.dn_delay or num_workers
        if self.dn_c * n > 1:
            raise ConfigError("dn_c", f"must be at most 1/N = 1/{n} (N: --dn-delay, or the number of workers), "
                                      f"got {self.dn_c!r}", self.name)

    def server_init(self, w, num_workers):
        state = super().server_init(w, num_workers)
        if self.outer_opt == "delayed-nesterov":
            state.dn_sum, state.dn_updates, state.dn_delay = torch.zeros_like(w), 0, self.dn_delay or num_workers
        return state

    # Not @elementwise: delayed-nesterov counts updates in a scalar, which a chunk could not write back
    # (fused_apply's kernel runs on the whole vectors and moves the count once).
    def server_delta(self, state, w, worker, msg, tau, lr, out):
        if self.outer_opt != "delayed-nesterov":
            return self.outer_step(state, msg, 1.0, out)
        # In the commit's sign: the buffer and momentum below are the negatives of the paper's D and m.
        n, t, beta, c = state.dn_delay, state.dn_updates, self.outer_momentum, self.dn_c
        total, b = state.dn_sum, state.outer_buffer
        total.add_(msg)
        step = torch.div(msg, n, out=out)
        if (t + 1) % n == 0:
            b.mul_(beta).add_(total.div_(n))
            step.add_(b, alpha=(1 - c * n + c) * beta)
            total.zero_()
        elif c:
            step.add_(b, alpha=c * beta)
        state.dn_updates = t + 1
        return step, self.outer_lr

    def fused_apply(self, state, w, worker, msg, tau, lr, old, keep=None):
        if self.outer_opt != "delayed-nesterov":
            return None   # outer sgd and nesterov stay on torch operators (agn's outer_step)
        # One call on the whole vectors: the update count is moved here, once, as server_delta does.
        n, t = state.dn_delay, state.dn_updates
        state.dn_updates = t + 1
        return fused.local_sgd_apply(msg, w, state.dn_sum, state.outer_buffer, old, n=n,
                                     momentum_update=(t + 1) % n == 0, beta=self.outer_momentum, share=self.dn_c,
                                     s=self.outer_lr, keep=keep)
