"""Rules that drop stale gradients to win time: Ringmaster ASGD, Rennala SGD, m-synchronous SGD.

All three send one gradient at the pulled weights (``GradientAlgorithm``) and refuse, through
``Algorithm.admits``, the messages computed too many updates ago; a refused message is dropped whole
(weights, version and rule state unchanged), counted in ``updates_dropped`` (summary.json, and per worker in
staleness.json), and its samples still count against the run's budget: the work was done. With
``stops on`` the simulator instead stops such a computation before it finishes and starts the worker again at
the current weights (``Algorithm.stop_threshold``; the simulator only, counted in ``computations_stopped``).

- ``ringmaster``: Ringmaster ASGD (Maranjyan, Tyurin, Richtarik, ICML 2025, arXiv 2501.16168). Asynchronous
  SGD that ignores every gradient whose delay reaches the threshold R. The algorithm box, as its first author
  restates it (Algorithm "without calculation stops"): "Gradient g^k = grad f(x^{k-delta^k}; xi) arrives from
  worker i; if delta^k < R: [update] x^{k+1}, worker i begins calculating at x^{k+1}, k = k + 1; else: ignore
  the outdated gradient, worker i begins calculating at x^k"; and "with calculation stops": "Stop calculating
  stochastic gradients with delays >= R, and start computing new ones at x^k instead". delta^k is our tau
  (updates since the pull), and the update is asgd's x^{k+1} = x^k - gamma g^k::

      tau < R:  w <- w - lr*g;     tau >= R: dropped          (R = delay_threshold; 0: M)

- ``rennala``: Rennala SGD (Tyurin, Richtarik, NeurIPS 2023, arXiv 2305.12387). The server collects B
  gradients computed at the current point, from any workers (a fast one may send several), and steps once on
  their mean; a gradient computed at an earlier point is ignored. The method, as Tyurin restates it (Algorithm
  1 of "Bridging the gap between homogeneous and heterogeneous asynchronous optimization", Rennala's
  weights): "Ask all workers to calculate stochastic gradients at x^k; while [fewer than S gathered]: wait for
  the next worker j, receive [its] stochastic gradient [at x^k], ask this worker to calculate a stochastic
  gradient at x^k; x^{k+1} = x^k - gamma g^k, g^k the mean of the gathered gradients; stop all the workers'
  calculations (or ignore the unfinished calculations in the next iterations)"::

      tau = 0: s <- s + g, n <- n + 1;  at n = B: w <- w - lr*s/B, s <- 0, n <- 0;   tau > 0: dropped

  A gradient taken into s changes no weights, so the version stays and the next gradients computed at the
  same point still have tau = 0 (B = rennala_batch; 0: M).

- ``m-ssgd``: m-synchronous SGD (Begunov, Tyurin, arXiv 2602.03802, 2026: "Synchronous SGD and its robust
  variant, called m-Synchronous SGD"; the backup workers of Chen, Pan, Monga, Bengio, Jozefowicz, "Revisiting
  distributed synchronous SGD", arXiv 1604.00981, 2016, which aggregate the first N of N + b workers). Each
  round the server steps on the mean of the first m gradients computed at the current point and drops the rest
  (the stragglers' gradients arrive after the round closed: tau > 0). A worker that sent to the open round
  waits for it to close, as ssgd's do; a dropped straggler starts again at once at the current weights::

      round: the first min(m, live) gradients with tau = 0;  w <- w - lr * mean(g);   tau > 0: dropped

  Only the abstracts of 2602.03802 and 1604.00981 could be read here, not their algorithm boxes: this rule is
  written from the abstracts and the rule as this project specifies it (docs/algorithms_after_2017.md).

Their optional server momentum and weight decay are torch.optim.SGD's, as every gradient rule's
(``GradientAlgorithm.sgd_step``), applied to the accepted gradient (ringmaster), the batch mean (rennala) or
the round mean (m-ssgd); the papers have neither (defaults 0).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from .._lazy import torch
from ..errors import ConfigError
from .base import HELD, GradientAlgorithm, elementwise, param
from .sgd import SSGD
from .state import per_element, scalar

if TYPE_CHECKING:
    from torch import Tensor

STOPS = ("off", "on")
STOPS_HELP = ("'on' (the simulator only): a worker's computation is stopped once it would be dropped (ringmaster: its "
              "weights R updates old, the paper's Algorithm 5; rennala: one step old, the paper's 'stop all the "
              "workers' calculations'; m-ssgd: the round closed without it) and starts again at the current weights; "
              "'off': it finishes, and the server drops the late message")


def _check_count(algo, name: str, what: str) -> None:
    value = getattr(algo, name)
    if type(value) is not int or value < 0:
        raise ConfigError(name, f"must be an integer >= 0 ({what}), got {value!r}", algo.name)


@dataclass(frozen=True)
class RingmasterASGD(GradientAlgorithm):
    name = "ringmaster"
    probed = False   # (a dropped gradient is no update)
    summary = ("Ringmaster ASGD (Maranjyan, Tyurin, Richtarik 2025): asgd that drops every gradient computed R or "
               "more updates ago")
    rule = "tau < R: w <- w - lr*g_m;  tau >= R: g_m dropped   (R = delay_threshold; 0: M workers)"
    delay_threshold: int = param(0, "R: a gradient computed R or more updates ago (tau >= R) is dropped; 0: R = M, "
                                    "the number of workers (equal speeds give tau = M-1: nothing dropped, asgd; "
                                    "only a gradient during which M updates came in is). The paper's theory takes "
                                    "R = max(1, ceil(sigma^2/eps)), unknown in practice",
                                 "--delay-threshold")
    stops: str = param("off", STOPS_HELP, "--stops", STOPS)

    def validate(self):
        super().validate()
        _check_count(self, "delay_threshold", "0: the number of workers")

    def threshold(self, num_workers: int) -> int:
        """R, resolved: ``delay_threshold``, or M when it is 0."""
        return self.delay_threshold or num_workers

    def admits(self, worker, tau, num_workers):
        return tau < self.threshold(num_workers)

    def stop_threshold(self, num_workers):
        return self.threshold(num_workers) if self.stops == "on" else None

    @elementwise
    def server_delta(self, state, w, worker, msg, tau, lr, out):
        return self.sgd_step(state, w, msg, lr, out)


@dataclass(frozen=True)
class RennalaSGD(GradientAlgorithm):
    name = "rennala"
    probed = False   # (an update is a batch's mean, not one message's -lr*g)
    summary = ("Rennala SGD (Tyurin, Richtarik 2023): the server averages B gradients computed at the current "
               "weights, from any workers, and steps once; older gradients are dropped")
    rule = ("tau = 0: s <- s + g_m, until B of them: w <- w - lr*s/B, s <- 0;  tau > 0: g_m dropped   "
            "(B = rennala_batch; 0: M workers)")
    server_writes = ("momentum_buffer", "grad_sum")
    drops_held = True   # a step that is not finite drops its batch whole, the messages held for it too
    rennala_batch: int = param(0, "B: gradients at the current weights averaged into one step (several may come from "
                                  "one fast worker); 0: B = M, the number of workers, one round of ssgd's batch at "
                                  "equal speeds. The paper's theory takes B = max(1, ceil(sigma^2/eps))",
                               "--rennala-batch")
    stops: str = param("off", STOPS_HELP, "--stops", STOPS)

    @dataclass
    class State(GradientAlgorithm.State):
        grad_sum: Tensor | None = per_element()   # s: the sum of the gradients gathered for the next step
        gathered: int = scalar(0)                 # n: how many
        batch: int | None = scalar()              # B, resolved

    def validate(self):
        super().validate()
        _check_count(self, "rennala_batch", "0: the number of workers")

    def batch(self, num_workers: int) -> int:
        """B, resolved: ``rennala_batch``, or M when it is 0."""
        return self.rennala_batch or num_workers

    def server_init(self, w, num_workers):
        state = super().server_init(w, num_workers)
        state.grad_sum, state.batch = torch.zeros_like(w), self.batch(num_workers)
        return state

    def writes(self, state, worker):
        # A held message only adds to the sum, kept as it is: one that overflows it makes the batch's step
        # non-finite, and a skipped step drops the batch (drop_held), so the sum never needs its old values.
        return () if state.gathered + 1 < state.batch else ("momentum_buffer",)

    def drop_held(self, state):
        state.grad_sum.zero_()
        state.gathered = 0

    def admits(self, worker, tau, num_workers):
        return tau == 0

    def stop_threshold(self, num_workers):
        return 1 if self.stops == "on" else None

    # Not @elementwise: it counts the gathered gradients in a scalar, once per message.
    def server_delta(self, state, w, worker, msg, tau, lr, out):
        total = state.grad_sum
        total.add_(msg)
        state.gathered += 1
        if state.gathered < state.batch:
            return HELD
        torch.div(total, state.gathered, out=out)
        total.zero_()
        state.gathered = 0
        return self.sgd_step(state, w, out, lr, out)

    def fused_apply(self, state, w, worker, msg, tau, lr, old, keep=None):
        return None   # no fused kernel: a message is added to the sum, and only every B-th steps


@dataclass(frozen=True)
class MSynchronousSGD(SSGD):
    name = "m-ssgd"
    summary = ("m-synchronous SGD (Begunov, Tyurin 2026; Chen et al. 2016's backup workers): each round steps on the "
               "mean of the first m gradients at the current weights and drops the stragglers'")
    rule = ("w <- w - lr * mean(first min(m, live) g_m with tau = 0);  the others (tau > 0) dropped   "
            "(m = quorum; 0: M-1 workers, at least 1)")
    quorum: int = param(0, "m: the gradients at the current weights that close a round (fewer when fewer workers "
                           "are live); 0: m = M-1, one backup worker (Chen et al. 2016 ran a few backups among "
                           "many workers), at least 1", "--quorum")
    stops: str = param("off", STOPS_HELP, "--stops", STOPS)

    def validate(self):
        super().validate()
        _check_count(self, "quorum", "0: the number of workers minus one")

    def check_workers(self, num_workers):
        if self.quorum > num_workers:
            raise ConfigError("quorum", f"is {self.quorum}, more than the {num_workers} workers: a round would never "
                                        f"close; give at most {num_workers} (or 0: {max(1, num_workers - 1)})",
                              self.name, mentions=("workers",))

    def m(self, num_workers: int) -> int:
        """m, resolved: ``quorum``, or M - 1 (at least 1) when it is 0."""
        return self.quorum or max(1, num_workers - 1)

    def admits(self, worker, tau, num_workers):
        return tau == 0

    def round_complete(self, sent, live, num_workers):
        return sent >= min(self.m(num_workers), live)

    def stop_threshold(self, num_workers):
        return 1 if self.stops == "on" else None
