"""Accumulated-update algorithms: AGN (Hermans et al., ACML 2017) and DOWNPOUR.

Each worker starts from the weights it pulled, takes ``window`` steps with a
local optimizer (Adam by default, as in the paper), and commits the change
it made. AGN divides the change by the window (a scalar: the update is
*averaged*, not L2-normalised); DOWNPOUR commits it as it is. The server adds
the commit: there is no server learning rate.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from .._lazy import torch
from ..errors import ConfigError
from . import local_opt
from .base import Algorithm, check_nonnegative, elementwise, param


@dataclass(frozen=True)
class CommitAlgorithm(Algorithm):
    window: int = param(10, "local steps between two commits (the communication window lambda)", "--window")
    local_opt: str = param("adam", "the worker's local optimizer", "--local-opt", local_opt.LOCAL_OPTIMIZERS)
    local_momentum: float = param(0.0, "momentum of the local 'sgd' optimizer", "--local-momentum")
    local_weight_decay: float = param(0.0, "L2 weight decay inside the worker's local optimizer",
                                      "--local-weight-decay")

    normalise: ClassVar[bool] = False  # AGN divides the commit by the window
    batched_compute = True

    def validate(self):
        super().validate()
        if not isinstance(self.window, int) or isinstance(self.window, bool) or self.window < 1:
            raise ConfigError("window", f"must be a positive integer, got {self.window!r}", self.name)
        check_nonnegative(self, "local_weight_decay", "local_momentum")

    @property
    def steps_per_message(self) -> int:
        return self.window

    def worker_init(self, w0, num_workers):
        return {"opt": local_opt.init(self.local_opt, w0, self.local_momentum)}

    def stack_states(self, states: list[dict]) -> dict:
        """K workers' states as one (copies): tensors stacked to (K, n), the optimizer's by local_opt."""
        first = states[0]
        return {key: local_opt.stack([s[key] for s in states]) if key == "opt"
                else torch.stack([s[key] for s in states]) if isinstance(value, torch.Tensor)
                else value   # a scalar every worker shares (the elastic alpha)
                for key, value in first.items()}

    def unstack_states(self, batched: dict, states: list[dict]) -> None:
        for key, value in batched.items():
            if key == "opt":
                local_opt.unstack(value, [s[key] for s in states])
            elif isinstance(value, torch.Tensor):
                for k, s in enumerate(states):
                    s[key].copy_(value[k])

    def local_steps(self, state: dict, w, grad_fn, lr: float) -> float:
        """``window`` local optimizer steps on ``w`` in place; the mean loss. Batched (``w`` (K, n), a
        state from ``stack_states``, a grad_fn returning K losses): the K mean losses."""
        total = 0.0
        for _ in range(self.window):
            loss, g = grad_fn(w)
            local_opt.step(self.local_opt, state["opt"], w, g, lr,
                           momentum=self.local_momentum, weight_decay=self.local_weight_decay)
            total += loss
        return total / self.window

    def worker_compute(self, state, pulled, grad_fn, lr):
        w = pulled.clone()
        loss = self.local_steps(state, w, grad_fn, lr)
        delta = w.sub_(pulled)
        if self.normalise:
            delta.div_(self.window)
        return loss, delta

    @elementwise
    def server_delta(self, state, w, worker, msg, tau, lr, out):
        return msg, 1.0   # w + commit, added straight from the message


@dataclass(frozen=True)
class AGN(CommitAlgorithm):
    name = "agn"
    summary = "accumulated gradient normalisation (Hermans et al. 2017): commit the local change divided by the window"
    rule = "worker: window local steps from the pulled w, commit (w_local - w_pulled)/window;  server: w <- w + commit"
    normalise = True


@dataclass(frozen=True)
class Downpour(CommitAlgorithm):
    name = "downpour"
    summary = "DOWNPOUR (Dean et al. 2012): commit the accumulated local change, un-normalised"
    rule = "worker: window local steps from the pulled w, commit (w_local - w_pulled);  server: w <- w + commit"
