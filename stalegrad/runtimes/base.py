"""The runtime contract: everything a runtime may use, and nothing else.

A runtime decides *when* each worker pulls, computes and pushes, and *how*
weights and messages travel. It owns its workers. It receives a ``Training``
(in practice ``stalegrad.run.training.TrainingRun``) and drives it to its sample
budget; the math lives in the algorithm, the state in the server and the
workers, the accounting (epochs, evaluation, metrics, checkpoints' files)
in the training run. A new runtime implements ``Runtime`` against
``Training`` and needs nothing else: ``tests/test_runtime_contract.py`` runs a
round-robin runtime of a few dozen lines through it end to end.

The loop of every runtime, for worker m (``w = factory.build(m)``)::

    pulled = training.server.pull(m)                  # elastic rules pull after compute; what pull returns
                                                      # (DANA: a look-ahead, not w) is what m computes at
    loss, computed = w.compute(pulled, training.lr)
    training.server.push(m, w.message(pulled, computed), training.lr)
    training.after_push(w.samples_per_message, loss, now, train_acc=w.train_acc)
    if training.checkpoint_due():
        training.save_checkpoint({"kind": ..., "workers": [w.state_dict() for w in workers], ...})

until ``training.done``. ``run(training, seed=..., resume=state)`` is handed
back the dict it last gave ``save_checkpoint`` when a run is resumed.

Optional: a runtime that declares ``supports_probes = True`` (only the
simulator, which alone can recompute a stale gradient) hands every message to
``training.probes.observe(m, worker, pulled, msg, server, lr)`` before pushing
it, when ``training.probes`` is not None (``stalegrad.core.prober``; ``train``
refuses ``probe_every`` for other runtimes).
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Callable, Protocol, runtime_checkable

if TYPE_CHECKING:
    from torch import Tensor

    from ..core.server import ParameterServer
    from ..core.worker import WorkerFactory


class Evaluator(Protocol):
    """Evaluates weights elsewhere (another process), so that the server never waits.

    ``submit`` gets a snapshot's source and the record to complete; it must
    copy ``weights`` before returning, and later call
    ``complete(record, test_loss, test_acc)``, in submission order.
    """

    def submit(self, weights: "Tensor", record: dict, complete: Callable[[dict, float, float], None]) -> None: ...


@runtime_checkable
class Training(Protocol):
    """What a runtime may use of a training run."""

    @property
    def server(self) -> "ParameterServer":
        """The one parameter server: ``pull(m)``, ``push(m, msg, lr)``, ``remove_worker(m)``,
        ``version``, ``algorithm``, ``num_workers``."""

    @property
    def worker_factory(self) -> "WorkerFactory":
        """``build(m)`` makes worker m in this process; ``portable(x, y)`` a copy for another one."""

    @property
    def test_data(self):
        """The test set (``x``, ``y``), for a runtime's own evaluator."""

    @property
    def lr(self) -> float:
        """The learning rate now (the schedule at the current epoch)."""

    @property
    def done(self) -> bool:
        """Whether the sample budget is spent: stop starting messages."""

    def done_after(self, samples: int) -> bool:
        """Whether ``done`` will hold once ``after_push(samples, ...)`` has counted a message of ``samples``
        samples (a runtime that fetches a worker's next weights with its push asks first)."""

    def ahead(self, samples: int, messages: int) -> dict:
        """What the next ``messages`` messages of ``samples`` samples each will meet, counted in turn from
        now, without counting them: {"lr": the rate each is pushed with, "evaluate": the indices after
        which an evaluation is due, "last": the index of the one that spends the budget or None,
        "checkpoint": the server version at which a checkpoint is next due or None}. For a runtime whose
        workers push without asking it each time (the Ray runtime's direct path); a runtime that pushes
        one message at a time needs only ``lr``, ``evaluation_due``, ``done_after`` and ``checkpoint_due``."""

    def after_push(self, samples: int, loss: float, now: float, evaluator: Evaluator | None = None,
                   train_acc: float | None = None) -> None:
        """Count one pushed message of ``samples`` samples, mean loss ``loss`` and training accuracy
        ``train_acc`` (the worker's ``train_acc`` after its compute), at time ``now`` (virtual seconds
        for a simulator, wall seconds for a real runtime); evaluates when due, in this process or
        through ``evaluator``."""

    def evaluation_due(self, samples: int) -> bool:
        """Whether ``after_push(samples, ...)`` will evaluate. A runtime that keeps the server's
        state elsewhere (on Ray actors) brings ``server`` up to date first
        (``server.load_state_dict(..., strict=False)``)."""

    def checkpoint_due(self, version: int | None = None) -> bool:
        """Whether a periodic checkpoint is due now (after a push), or once the server is at ``version``."""

    @property
    def checkpoint_every(self) -> int:
        """Server updates between checkpoints; 0 when the run writes none."""

    def save_checkpoint(self, runtime_state: dict) -> None:
        """Write the whole run, with ``runtime_state`` (the runtime's own state, its workers'
        ``state_dict()`` included); does nothing when the run writes no checkpoints."""

    def evaluate(self, evaluator: Evaluator | None = None) -> None:
        """Evaluate the server's weights now (or hand a snapshot to ``evaluator``)."""

    @property
    def probes(self):
        """None, or (``probe_every``) the ``stalegrad.core.prober.Prober`` that a runtime declaring
        ``supports_probes = True`` hands each message with ``observe(m, worker, pulled, msg, server, lr)``
        just before pushing it."""

    def note(self, text: str | None = None, **figures) -> None:
        """Report something: ``text`` joins the run's notes, ``figures`` its summary.json
        (e.g. ``workers_lost=1``, ``transport={...}``)."""


@runtime_checkable
class Runtime(Protocol):
    """What ``stalegrad.train`` asks of a runtime."""

    def describe(self) -> dict:
        """Its name and options, for config.json (``{"name": ..., ...}``)."""

    def run(self, training: Training, *, seed: int, resume: dict | None = None) -> None:
        """Drive ``training`` until ``training.done``; ``resume`` is the state last saved."""

    # Optional: ``check(config)`` refuses options that do not fit the run (``ConfigError``),
    # called by ``stalegrad.train`` with the validated ``RunConfig`` before anything runs.
    # Optional: ``numerics()``, a context manager in which ``stalegrad.train`` builds, evaluates and runs
    # the whole training; it yields a dict for config.json's ``numerics``. The simulator pins the bits to
    # be independent of the thread count there (``stalegrad/numerics.py``).
