"""The algorithm interface: pure math on flat float32 parameter vectors.

An algorithm has a worker side and a server side, and nothing else: no I/O,
no transport, no clocks. Runtimes (simulator, local processes, Ray) move the
messages; the parameter server (``stalegrad.core.server``) keeps the state.

Worker side
    ``worker_init(w0, num_workers)``           -> per-worker state (a dict)
    ``worker_compute(state, pulled, grad_fn, lr)`` -> (mean loss, computed)
    ``worker_finish(state, pulled, computed)``  -> the message to push

    ``pull_before_compute`` says when the worker pulls: before its local steps
    (gradient and commit algorithms) or after them (elastic averaging, which
    pulls the centre only to compute the elastic difference).

Server side
    ``server_init(w, num_workers)``            -> server state (the rule's ``State``: ``algorithms/state.py``)
    ``on_pull(state, worker, w)``              -> record what the worker pulled; None, or the
        weights to send instead of ``w`` (DANA: a look-ahead position the server computes)
    ``server_delta(state, w, worker, msg, tau, lr, out)``
        write into ``out`` the amount to *add* to ``w`` (asynchronous rules),
        or return a pair ``(t, s)``: the amount is then ``s * t``, which the
        server adds in one fused pass, ``w.add_(t, alpha=s)`` (the rounding of
        torch.optim.SGD's ``param.add_(buf, alpha=-lr)``); ``t`` may be the
        message itself, ``out`` or a state tensor, and is not modified
    ``round_delta(state, w, msgs, lr, out)``
        the same for synchronous rules, given one message per member of the round
    ``server_delta`` may also return ``HELD``: the rule took the message into its state and
        steps later (Rennala SGD sums B gradients): no update, no version, and the message's
        (worker, tau) is logged with the step that uses it

Admission and rounds (pure in their arguments: a sharded server's driver asks them too)
    ``admits(worker, tau, num_workers)``      -> whether the server takes a message computed tau
        updates ago (default: every one); one it refuses is dropped, its samples still spent
    ``round_complete(sent, live, num_workers)`` -> synchronous rules: whether the open round,
        ``sent`` of the ``live`` workers in it, closes (default: every live worker sent)
    ``stop_threshold(num_workers)``           -> None, or the staleness at which the simulator
        stops a worker's computation and starts it again at the current weights

The server checks the amount for NaN/Inf (``t`` and the overflow of ``s * t``)
before adding it, and the state the rule wrote, so a rule never needs to guard its
own arithmetic: an update that is not finite is undone whole, the rule's state
included (``server_writes``, ``core/transaction.py``). Rules must not modify ``w``
or the messages themselves. Rules marked ``@elementwise`` are run on cache-sized
chunks of the vectors (see ``elementwise``).
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Callable, ClassVar

from .._lazy import torch
from ..errors import ConfigError, check_finite_positive
from . import fused
from .state import RuleState, check_declaration, per_element

if TYPE_CHECKING:
    from torch import Tensor

# What ``server_delta`` returns when it took the message into the rule's state and steps later.
HELD = "held"

# grad_fn(weights) -> (mini-batch loss, flat gradient). The gradient tensor may
# be a view of a buffer that the next call overwrites: consume it first.
GradFn = Callable[["Tensor"], "tuple[float, Tensor]"]


def elementwise(rule):
    """Mark a ``server_delta`` or ``round_delta`` as element-wise.

    Element i of ``out`` must depend only on element i of ``w``, of the
    message(s) and of the state tensors shaped like ``w`` (which the rule may
    update only in place), and on scalars. The parameter server then runs the
    rule on cache-sized chunks of all of them: the same numbers, but each
    chunk's intermediate results stay in cache instead of every tensor
    operation of the rule making one more pass over memory. An override that is
    not marked again is run on whole vectors.
    """
    rule.elementwise = True
    return rule


def rule_docstring(cls) -> str:
    """The docstring of a rule class that has none of its own: its summary (what it is, its source) and update."""
    return f"{cls.summary}.\n\nUpdate rule: ``{cls.rule}``"


def param(default, help: str, flag: str | None = None, choices: tuple | None = None):
    """A documented hyper-parameter: default, help text, CLI flag, choices."""
    return field(default=default, metadata={"help": help, "flag": flag, "choices": choices})


@dataclass(frozen=True)
class Algorithm:
    """An update rule: a frozen dataclass of hyper-parameters with pure methods, a worker side and a server
    side (the module says what each does). A rule names itself (``name``: ``--algo``, ``ALGORITHMS``' key),
    says what it is and where it comes from (``summary``) and how it updates (``rule``); its fields, each
    declared with ``param``, are its hyper-parameters, which become CLI flags, TOML keys and help
    (``hyperparameters()``, ``stalegrad algorithms``). A rule without a docstring of its own gets one made
    of its summary and update rule."""
    name: ClassVar[str] = ""
    summary: ClassVar[str] = ""
    rule: ClassVar[str] = ""          # the update rule, in one or two lines of text
    synchronous: ClassVar[bool] = False
    pull_before_compute: ClassVar[bool] = True
    sequential: ClassVar[bool] = False  # exactly one worker
    # The worker sends one gradient at the weights it pulled (worker_compute is grad_fn(pulled)),
    # so the simulator may compute the gradients of several workers in one batched call.
    vectorisable: ClassVar[bool] = False
    # worker_compute also runs K workers at once: states from stack_states(states) (written back by
    # unstack_states), pulled (K, n) and a grad_fn of (K, n) weights returning K losses and (K, n)
    # gradients; it returns K mean losses and (K, n) computed (or None). The simulator batches waiting workers.
    batched_compute: ClassVar[bool] = False
    # The server state's declaration (``algorithms/state.py``), which server_init returns: its per-element and
    # per-worker fields (``per_element_state``) are what an @elementwise rule gets sliced to a chunk, and what a
    # server split into shards splits; a subclass that keeps more declares a subclass of its parent's State.
    State: ClassVar[type[RuleState]] = RuleState
    # Fields of State whose tensors server_delta, round_delta and fused_apply write in place (a per-worker
    # list: the pushing worker's tensor; in a round, every one), checked against State where the class is
    # written. The server keeps their old values, and the state's scalars, so that an update that is not
    # finite leaves the state as it was (``writes``: the fields of one push; a rule that ``drops_held`` may
    # leave out what ``drop_held`` resets). None: not declared, every tensor of the state is kept.
    server_writes: ClassVar[tuple[str, ...] | None] = None
    # Whether an update that is not finite also drops the messages the rule holds for its step (``drop_held``,
    # once the state is put back): Rennala's step sums its batch, which would overflow again with the next message.
    drops_held: ClassVar[bool] = False
    # The simulator's probes (--probe-every) take the update to be -lr times the gradient, or the
    # commit itself; rules whose update is something else are not probed.
    probed: ClassVar[bool] = True

    # ---- introspection (CLI, docs, config) ---------------------------------
    def __init_subclass__(cls, **kwargs):
        super().__init_subclass__(**kwargs)
        # help(rule) says what the rule is, its source and its update, from the attributes the CLI and the API
        # reference read too. This runs before @dataclass, which would write the bare signature into an empty
        # __doc__; a class that only shares code (no name of its own) keeps none.
        if cls.__dict__.get("__doc__") is None and "name" in cls.__dict__ and cls.summary:
            cls.__doc__ = rule_docstring(cls)
        check_declaration(cls)   # server_writes among State's fields: a misspelt name fails here, not at run time

    @classmethod
    def hyperparameters(cls) -> list[dataclasses.Field]:
        return [f for f in dataclasses.fields(cls)]

    def to_dict(self) -> dict:
        return {"name": self.name, **dataclasses.asdict(self)}

    def validate(self) -> None:
        """Raise ConfigError naming the bad hyper-parameter and the fix."""
        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            choices = f.metadata.get("choices")
            if choices is not None and value not in choices:
                raise ConfigError(f.name, f"must be one of {', '.join(map(str, choices))}, got {value!r}", self.name)
            if isinstance(f.default, float) and (isinstance(value, bool) or not isinstance(value, (int, float))):
                raise ConfigError(f.name, f"must be a number, got {value!r}", self.name)

    def default_lr(self) -> float | None:
        """The learning rate a run takes when none is given; None: the run's own default
        (0.1, or 0.001 with a local Adam)."""
        return None

    def check_workers(self, num_workers: int) -> None:
        """Raise ConfigError if the hyper-parameters do not fit ``num_workers`` workers."""

    @property
    def steps_per_message(self) -> int:
        return 1

    @property
    def per_element_state(self) -> tuple[str, ...]:
        """The fields of ``State`` shaped like w (tensors, or per-worker lists of them)."""
        return self.State.per_element_fields()

    # ---- worker side --------------------------------------------------------
    def worker_init(self, w0: Tensor, num_workers: int) -> dict:
        return {}

    def worker_compute(self, state: dict, pulled: Tensor | None, grad_fn: GradFn, lr: float) -> "tuple[float, object]":
        """Run the local steps; return (mean mini-batch loss, computed)."""
        raise NotImplementedError

    def worker_finish(self, state: dict, pulled: Tensor | None, computed):
        return computed

    # ---- server side --------------------------------------------------------
    def server_init(self, w: Tensor, num_workers: int) -> RuleState:
        return self.State()

    def on_pull(self, state: RuleState, worker: int, w: Tensor) -> "Tensor | None":
        """Record what ``worker`` pulls. Return None to send it the server's weights ``w``, or a
        tensor shaped like ``w`` to send instead (the server copies it out before the next call, so it
        may be a state tensor). Element i of it may depend only on element i of ``w`` and of the
        per-element state, so that a server split into shards sends the same weights."""
        return None

    def server_delta(self, state: RuleState, w: Tensor, worker: int, msg: Tensor, tau: int, lr: float,
                     out: Tensor) -> "tuple[Tensor, float] | None":
        """Fill ``out`` with the update (return None), or return (t, s): the update is s*t."""
        raise NotImplementedError(f"{self.name} is synchronous: use round_delta")

    def round_delta(self, state: RuleState, w: Tensor, msgs: dict[int, Tensor], lr: float,
                    out: Tensor) -> "tuple[Tensor, float] | None":
        """As server_delta, for a synchronous round's messages (one per live worker)."""
        raise NotImplementedError(f"{self.name} is asynchronous: use server_delta")

    def admits(self, worker: int, tau: int, num_workers: int) -> bool:
        """Whether the server takes ``worker``'s message, computed ``tau`` updates ago. One it refuses is
        dropped: weights, version and rule state unchanged, counted in ``updates_dropped``. A function of
        its arguments and the hyper-parameters only: the driver of sharded servers asks it too."""
        return True

    def round_complete(self, sent: int, live: int, num_workers: int) -> bool:
        """Synchronous rules: whether the open round closes, ``sent`` of the ``live`` workers having a
        message in it (a NaN/Inf one counts as sent). Default: every live worker."""
        return sent >= live

    def stop_threshold(self, num_workers: int) -> int | None:
        """None, or the staleness (updates since its pull) at which the simulator stops a worker's
        computation and starts it again at the current weights (``--stops on``: Ringmaster ASGD's
        Algorithm 5; Rennala SGD's "stop all the workers' calculations")."""
        return None

    def writes(self, state: RuleState, worker: int | None) -> tuple[str, ...] | None:
        """The fields of the state that the next update writes in place: ``worker``'s push, or a round (None).
        Default ``server_writes``; a rule that writes a tensor only on some updates may say so here."""
        return self.server_writes

    def drop_held(self, state: RuleState) -> None:
        """Forget the messages held for the next step (a rule whose ``drops_held`` is True)."""

    def fused_apply(self, state: RuleState, w: Tensor, worker: int, msg: Tensor, tau: int, lr: float,
                    old: Tensor, keep: dict | None = None) -> bool | None:
        """server_delta's update added to ``w`` in place in one pass (``algorithms.fused``), the
        old ``w`` kept in ``old`` and the old values of every state tensor it writes in ``keep[field]``
        (one for each field of ``writes``); returns whether the update, and the state it wrote, is
        finite (the server then puts them back if not). None: no fused kernel for this rule, run
        ``server_delta``. Called only when the server runs the fused kernels (numba, float32 on the CPU)."""
        return None


def check_positive(algo: Algorithm, *names: str) -> None:
    """Each named hyper-parameter is a finite number > 0 (ConfigError otherwise)."""
    for n in names:
        check_finite_positive(n, getattr(algo, n), algo.name)


def check_nonnegative(algo: Algorithm, *names: str) -> None:
    """Each named hyper-parameter is a finite number >= 0 (ConfigError otherwise)."""
    for n in names:
        check_finite_positive(n, getattr(algo, n), algo.name, strict=False)


def check_fraction(algo: Algorithm, name: str, low_open: bool = False, high_open: bool = True) -> None:
    """The named hyper-parameter lies in [0, 1) (or the interval the flags say)."""
    v = getattr(algo, name)
    ok = isinstance(v, (int, float)) and not isinstance(v, bool) and (0 < v if low_open else 0 <= v) \
        and (v < 1 if high_open else v <= 1)
    if not ok:
        interval = ("(" if low_open else "[") + "0, 1" + (")" if high_open else "]")
        raise ConfigError(name, f"must be in {interval}, got {v!r}", algo.name)


# --------------------------------------------------------------------------
# Shared pieces of the gradient-push family (sgd, ssgd, asgd, dcasgd-*, sasgd, gap-aware, dana-*):
# the worker sends the gradient of one mini-batch at the weights it pulled;
# the server turns a (possibly corrected) gradient into a step with optional
# heavy-ball momentum and L2 weight decay, in the order of torch.optim.SGD.
# --------------------------------------------------------------------------
@dataclass(frozen=True)
class GradientAlgorithm(Algorithm):
    """The gradient rules' common part: a worker sends the gradient of one mini-batch at the weights it
    pulled; the server turns the (corrected) gradient into a step with optional heavy-ball momentum and L2
    weight decay, in the order of ``torch.optim.SGD`` (``sgd_step``)."""
    vectorisable = True
    server_writes = ("momentum_buffer",)

    @dataclass
    class State(RuleState):
        momentum_buffer: Tensor | None = per_element()   # heavy-ball momentum (None without momentum)

    momentum: float = param(0.0, "server heavy-ball momentum, applied after the delay correction", "--momentum")
    weight_decay: float = param(0.0, "L2 weight decay added to the (corrected) gradient on the server", "--weight-decay")

    def validate(self) -> None:
        super().validate()
        check_nonnegative(self, "weight_decay")
        check_fraction(self, "momentum")

    def worker_compute(self, state, pulled, grad_fn, lr):
        loss, g = grad_fn(pulled)
        # No copy: every runtime consumes the message (push) before the next
        # gradient, and the server copies what it keeps for a synchronous round.
        return loss, g

    def server_init(self, w, num_workers):
        return self.State(momentum_buffer=torch.zeros_like(w) if self.momentum else None)

    def fused_apply(self, state, w, worker, msg, tau, lr, old, keep=None):
        if not (self.momentum or self.weight_decay):
            return None   # the torch path is already one pass: w.add_(g, alpha=-lr)
        return fused.sgd_apply(msg, w, state.momentum_buffer, old, weight_decay=self.weight_decay,
                               momentum=self.momentum, s=-lr, keep=keep)

    def sgd_step(self, state: State, w: Tensor, direction: Tensor, lr: float, out: Tensor) -> tuple[Tensor, float]:
        """The step -lr * (momentum buffer of (direction + weight_decay * w)), as (t, -lr).

        The order of torch.optim.SGD; ``out`` receives direction + weight_decay*w
        when there is weight decay (``direction`` may be ``out`` itself). With
        neither momentum nor weight decay, t is ``direction``: no copy at all.
        """
        if self.weight_decay:
            direction = torch.add(direction, w, alpha=self.weight_decay, out=out)
        return self.heavy_ball(state, direction, lr)

    def heavy_ball(self, state: State, direction: Tensor, lr: float) -> tuple[Tensor, float]:
        """The step -lr * (b <- momentum*b + direction), as (b, -lr); (direction, -lr) without momentum."""
        if self.momentum:
            buf = state.momentum_buffer
            buf.mul_(self.momentum).add_(direction)
            direction = buf
        return direction, -lr
