"""Elastic averaging SGD (Zhang, Choromanska, LeCun, NeurIPS 2015).

Each worker keeps its own weights x_k and takes ``window`` local steps on
them. Then it meets the centre c: E = alpha*(x_k - c); the worker moves
x_k <- x_k - E and the centre moves c <- c + E. Workers are never overwritten
by the centre: the coupling is elastic only.

- ``easgd``: synchronous. All workers exchange with the same centre in one
  round; c <- c + sum_k E_k. alpha = beta / M, with the paper's beta = 0.9.
- ``aeasgd``: asynchronous. Each worker pulls the centre when its window ends
  (the pull happens *before* the elastic difference, as in the thesis
  algorithm), alpha = rho * elastic_lr (dist-keras: rho=5, learning_rate=0.01).
"""
from __future__ import annotations

from dataclasses import dataclass

from .agn import CommitAlgorithm
from ..errors import ConfigError
from .base import check_fraction, check_positive, elementwise, param


class _Elastic(CommitAlgorithm):
    pull_before_compute = False

    def alpha(self, num_workers: int) -> float:
        raise NotImplementedError

    def worker_init(self, w0, num_workers):
        state = super().worker_init(w0, num_workers)
        state["weights"] = w0.clone()
        state["alpha"] = self.alpha(num_workers)
        return state

    def worker_compute(self, state, pulled, grad_fn, lr):
        return self.local_steps(state, state["weights"], grad_fn, lr), None

    def worker_finish(self, state, pulled, computed):
        x = state["weights"]
        elastic = x.sub(pulled).mul_(state["alpha"])
        x.sub_(elastic)
        return elastic


@dataclass(frozen=True)
class EASGD(_Elastic):
    name = "easgd"
    summary = "synchronous elastic averaging SGD (Zhang et al. 2015)"
    rule = ("every window local steps, all workers: E_k = alpha*(x_k - c), x_k <- x_k - E_k;  "
            "server: c <- c + sum_k E_k;  alpha = beta/M")
    synchronous = True
    beta: float = param(0.9, "moving-average rate beta = M*alpha of the centre", "--beta")

    def validate(self):
        super().validate()
        check_fraction(self, "beta", low_open=True, high_open=False)

    def alpha(self, num_workers: int) -> float:
        return self.beta / num_workers

    @elementwise
    def round_delta(self, state, w, msgs, lr, out):
        out.zero_()
        for e in msgs.values():
            out.add_(e)


@dataclass(frozen=True)
class AEASGD(_Elastic):
    name = "aeasgd"
    summary = "asynchronous elastic averaging SGD (Zhang et al. 2015; dist-keras AEASGD)"
    rule = ("every window local steps: pull c, E = alpha*(x_k - c), x_k <- x_k - E, commit E;  "
            "server: c <- c + E;  alpha = rho*elastic_lr")
    rho: float = param(5.0, "elastic coupling strength rho", "--rho")
    elastic_lr: float = param(0.01, "elastic learning rate; alpha = rho*elastic_lr", "--elastic-lr")

    def validate(self):
        super().validate()
        check_positive(self, "rho", "elastic_lr")
        if not self.rho * self.elastic_lr <= 1:
            raise ConfigError("elastic_lr", f"times rho (alpha = rho*elastic_lr) must be <= 1, "
                                            f"got {self.rho * self.elastic_lr!r}", self.name)

    def alpha(self, num_workers: int) -> float:
        return self.rho * self.elastic_lr

    @elementwise
    def server_delta(self, state, w, worker, msg, tau, lr, out):
        return msg, 1.0   # c + E, added straight from the message
