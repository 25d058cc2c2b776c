"""What the local runtime's processes say to each other, and what they share.

Processes: the server (the main process, which holds the ``TrainingRun`` and
its ``ParameterServer``), M worker processes and one evaluator process. Each
child has one pipe to the server. The pipes carry only small tuples; weights,
data and measurements travel through shared memory (below).

Worker -> server, and the server's answer::

    ("ready",)               -> ("ok", lr)           the worker is built; when resuming, the server sends
                                                     ("restore", state) first; under a speed profile the
                                                     answer is ("ok", lr, t0), sent to every worker once all
                                                     are ready: t0 is the profile's second 0 (time.time())
    ("pull",)                -> ("w", version, lr)   the weights are in the worker's pull buffer
    ("push", samples, loss, train_acc)
                             -> ("ok", lr)           the message in the worker's push buffer was applied
                                                     (synchronous rules: once the round closed)
    ("state", state)            the answer to ("state",): the worker's ``Worker.state_dict()``, on CPU
    ("error", text)             a Python exception in the worker: the run stops with it

Server -> worker, besides the answers above; the worker handles these while
it waits for an answer, and goes on waiting::

    ("adopt", indices)       samples (a numpy int64 array) of a lost worker's shard: they join the
                             worker's mini-batch stream (``BatchStream.extend``)
    ("state",)               a checkpoint: sent instead of the answer to a push (at the end of a run, also
                             to a pull or "ready"), and again to a held worker after an "adopt"; the worker,
                             between two messages, answers ("state", state) and waits on
    ("restore", state)       resuming: load this ``Worker.state_dict()`` (after "ready", before "ok")
    ("stop",)                instead of an answer: end now

Server -> evaluator, and its answer::

    ("eval",)                -> ("result", test_loss, test_acc)   evaluate the snapshot buffers (the weights
                                                                  and the BatchNorm statistics)
    ("stop",)                   end now

Evaluator -> server, besides its results::

    ("error", text)             a Python exception in the evaluator: the run stops with it

Shared memory (CPU tensors whose storages travel to the children as file
descriptors):

- the training set (every worker) and the test set (the evaluator);
- per worker, a pull buffer (the server copies its weights in, one memory
  copy per pull), a push buffer (the worker copies its message in) and a row
  of meters (float64, ``METERS_WIDTH`` long): local steps, pulls, pushes,
  then the worker's last ``RING`` pull latencies and its last ``RING`` push
  latencies, each ring indexed by count modulo ``RING``, then, under a speed
  profile, its pacer's figures (``PACING``);
- one vector of BatchNorm statistics (``Buffers``), which every worker writes
  after each message (the last writer wins), and the evaluator's snapshot of
  weights and statistics.
"""
from __future__ import annotations

import torch
from torch import Tensor, nn

from ...errors import RunError

# ---- message kinds -------------------------------------------------------------------
READY, PULL, PUSH, STATE, ERROR = "ready", "pull", "push", "state", "error"   # from a worker
OK, WEIGHTS, ADOPT, RESTORE, STOP = "ok", "w", "adopt", "restore", "stop"    # to a worker
EVAL, RESULT = "eval", "result"                                             # evaluator

# ---- a worker's row of meters -------------------------------------------------------
RING = 4096                     # latencies kept per worker and kind (the most recent ones)
STEPS, PULLS, PUSHES = 0, 1, 2  # counters
PULL_RING, PUSH_RING = 0, 1     # the two rings, after the counters
_COUNT_OF = {PULL_RING: PULLS, PUSH_RING: PUSHES}
# A speed profile's figures (core/pacing.py), after the rings: the worker's Pacer.figures(), kept current
PACING = ("messages", "compute_s", "waited_s", "overruns", "late_s")
PACING_AT = 3 + 2 * RING
METERS_WIDTH = PACING_AT + len(PACING)


def record_latency(meters: Tensor, ring: int, seconds: float) -> None:
    """A worker adds one latency to its ``ring`` (``PULL_RING`` or ``PUSH_RING``) and counts it."""
    count = _COUNT_OF[ring]
    n = int(meters[count])
    meters[3 + ring * RING + n % RING] = seconds
    meters[count] = n + 1


def latencies(meters: Tensor, ring: int) -> list[float]:
    """The latencies a worker kept in ``ring`` (at most ``RING``, the most recent)."""
    n = min(int(meters[_COUNT_OF[ring]]), RING)
    start = 3 + ring * RING
    return meters[start:start + n].tolist()


def record_pacing(meters: Tensor, figures: dict) -> None:
    """A paced worker keeps its profile's figures current in its row of meters."""
    for i, key in enumerate(PACING):
        meters[PACING_AT + i] = figures[key]


def pacing_figures(meters: Tensor, worker: int) -> dict:
    """A worker's ``Pacer.figures()`` as its row of meters last held them."""
    values = meters[PACING_AT:PACING_AT + len(PACING)].tolist()
    return {"worker": worker, **{key: (int(v) if key in ("messages", "overruns") else round(v, 6))
                                 for key, v in zip(PACING, values)}}


class WorkerError(RunError):
    """A worker or the evaluator raised; the run was stopped."""


# ---- shared memory ------------------------------------------------------------------
def shared(t: Tensor) -> Tensor:
    """A CPU shared-memory copy of ``t`` (its storage is passed to children as a file descriptor)."""
    t = t.detach()
    if t.device.type == "cpu" and t.is_shared() and t.is_contiguous():
        return t
    return torch.empty(t.shape, dtype=t.dtype).share_memory_().copy_(t)


def zeros(*shape, dtype=torch.float32) -> Tensor:
    return torch.zeros(*shape, dtype=dtype).share_memory_()


class Buffers:
    """A module's floating-point buffers (BatchNorm running statistics) as one vector.

    Each worker writes its statistics into one shared vector after every
    message, the last writer winning; the evaluator and, at the end, the
    server's model read them. This stands for the simulator's single model,
    whose statistics every worker's forward passes update in turn.
    """

    def __init__(self, module: nn.Module):
        self.tensors = [b for b in module.buffers() if b.is_floating_point()]
        self.numel = sum(b.numel() for b in self.tensors)

    def write(self, out: Tensor) -> None:
        offset = 0
        for b in self.tensors:
            out[offset:offset + b.numel()].copy_(b.reshape(-1))
            offset += b.numel()

    def read(self, src: Tensor) -> None:
        offset = 0
        for b in self.tensors:
            b.copy_(src[offset:offset + b.numel()].view_as(b))
            offset += b.numel()
