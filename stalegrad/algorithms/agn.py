"""Accumulated-update algorithms: AGN (Hermans et al., ACML 2017) and DOWNPOUR.

Each worker starts from the weights it pulled, takes ``window`` steps with a
local optimizer (Adam by default, as in the paper), and commits the change
it made. AGN divides the change by the window (a scalar: the update is
*averaged*, not L2-normalised); DOWNPOUR commits it as it is. The server adds
the commit: there is no server learning rate.

The server may instead apply an outer optimizer to the commit c, whose
negative is DiLoCo's pseudo-gradient (Douillard et al., arXiv 2311.08105):

    sgd:       w <- w + outer_lr * c                  (outer_lr 1: the commit as it is, the default)
    nesterov:  b <- mu*b + c;  w <- w + outer_lr * (c + mu*b)

which is torch.optim.SGD(lr=outer_lr, momentum=mu, nesterov=True) stepping on
the pseudo-gradient -c, with b the negative of its momentum buffer.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, ClassVar

from .._lazy import torch
from ..errors import ConfigError
from . import local_opt
from .base import Algorithm, check_fraction, check_nonnegative, check_positive, elementwise, param
from .state import RuleState, per_element

if TYPE_CHECKING:
    from torch import Tensor


@dataclass(frozen=True)
class CommitAlgorithm(Algorithm):
    """The commit rules' common part: a worker takes ``window`` steps of a local optimizer and sends one
    commit, the change it made since its pull (the elastic rules: the elastic difference to the centre); the
    server adds it, or steps on it with an outer optimizer (``AccumulatedCommit``)."""
    window: int = param(10, "local steps between two commits (the communication window lambda)", "--window")
    local_opt: str = param("adam", "the worker's local optimizer", "--local-opt", local_opt.LOCAL_OPTIMIZERS)
    local_momentum: float = param(0.0, "momentum of the local 'sgd' optimizer", "--local-momentum")
    local_weight_decay: float = param(0.0, "L2 weight decay inside the worker's local optimizer",
                                      "--local-weight-decay")

    normalise: ClassVar[bool] = False  # AGN divides the commit by the window
    batched_compute = True
    server_writes = ()   # the commit is added as it is (AccumulatedCommit: an outer optimizer's buffer)

    def validate(self):
        super().validate()
        if not isinstance(self.window, int) or isinstance(self.window, bool) or self.window < 1:
            raise ConfigError("window", f"must be a positive integer, got {self.window!r}", self.name)
        check_nonnegative(self, "local_weight_decay")
        local_opt.check(self)

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
class AccumulatedCommit(CommitAlgorithm):
    """Commit rules whose server applies an outer optimizer to the (scaled) commit."""
    outer_opt: str = param("sgd", "the server's outer optimizer on the commit (the negative pseudo-gradient); "
                           "sgd at outer-lr 1 adds the commit as it is", "--outer-opt", ("sgd", "nesterov"))
    outer_lr: float = param(1.0, "learning rate of the outer optimizer", "--outer-lr")
    outer_momentum: float = param(0.9, "momentum mu of the nesterov outer optimizers", "--outer-momentum")

    server_writes = ("outer_buffer",)

    @dataclass
    class State(RuleState):
        outer_buffer: Tensor | None = per_element()   # the outer Nesterov's buffer (None: outer sgd)

    def validate(self):
        super().validate()   # outer_opt among the field's choices: delayed-nesterov counts updates in a
        check_positive(self, "outer_lr")   # scalar, which only async-local-sgd's unchunked rule can do
        check_fraction(self, "outer_momentum")

    def server_init(self, w, num_workers):
        return self.State(outer_buffer=torch.zeros_like(w) if self.outer_opt != "sgd" else None)

    def outer_step(self, state: State, commit, scale: float, out) -> tuple:
        """The update outer_opt makes of ``scale * commit``, as (t, s) for ``s * t``."""
        if self.outer_opt == "sgd":
            return commit, self.outer_lr * scale   # outer_lr 1, scale 1: w + commit, today's rule
        c = commit if scale == 1.0 else torch.mul(commit, scale, out=out)
        b = state.outer_buffer
        b.mul_(self.outer_momentum).add_(c)
        return torch.add(c, b, alpha=self.outer_momentum, out=out), self.outer_lr

    @elementwise
    def server_delta(self, state, w, worker, msg, tau, lr, out):
        return self.outer_step(state, msg, 1.0, out)


@dataclass(frozen=True)
class AGN(AccumulatedCommit):
    name = "agn"
    summary = "accumulated gradient normalisation (Hermans et al. 2017): commit the local change divided by the window"
    rule = "worker: window local steps from the pulled w, commit (w_local - w_pulled)/window;  server: w <- w + commit"
    normalise = True


@dataclass(frozen=True)
class Downpour(AccumulatedCommit):
    name = "downpour"
    summary = "DOWNPOUR (Dean et al. 2012): commit the accumulated local change, un-normalised"
    rule = "worker: window local steps from the pulled w, commit (w_local - w_pulled);  server: w <- w + commit"
