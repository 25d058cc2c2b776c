"""The direct path's bookkeeping inside a server shard: workers push to and pull from the shard
themselves, and the driver reads what happened afterwards.

On the driver's path every update costs the driver a wait, a call to the shard and a call to the
worker (``driver.py``). With one shard and an asynchronous rule that pulls before computing, the
shard alone decides the order of the pushes, so the driver is not needed there: each worker calls
``push_direct`` (its message; the reply is its next weights and learning rate), one round trip per
update, and the driver fetches the ``records`` every few tens of milliseconds (``poll``).

What the driver decided after each push on its own path, the ledger decides from a **plan** the
driver computes ahead (``Training.ahead``): the learning rate of each message (by its index: the
count of messages pushed since the driver started), the messages after which an evaluation is due
(the ledger keeps a copy of the weights there, for the driver to evaluate when it gets there), the
message that spends the budget, and the version at which a checkpoint is due. So the order of the
pushes, each one's tau and learning rate, and the weights evaluated are those the driver's path gives
for the same order of pushes. Where the plan says to stop:

- a checkpoint is due (``hold``): the worker whose push reached that version, and every worker after
  it, gets HOLD instead of weights; once all are held the driver saves the run (a consistent cut);
- the budget is spent (``done``): every worker gets STOP; later messages are applied (the final
  checkpoint holds every worker between two messages) or dropped (no checkpoints), as on the driver's path;
- the plan does not reach the message (the driver is behind): WAIT, and the worker pushes the same
  message again when the driver starts it after extending the plan (``taken`` says whether it was applied).

A generation number (one per loading of the shards) makes a worker that computed on weights of a
shard that died and was restored get STALE, never an update.

Pure Python on a ``ParameterServer``: no Ray here (``actors.ShardActor`` wraps it).
"""
from __future__ import annotations

import time

import torch

from ...core.server import NonFiniteError

GO, HOLD, STOP, WAIT, STALE, LOST, FAILED = "go", "hold", "stop", "wait", "stale", "lost", "failed"


class Ledger:
    def __init__(self, server, generation: int, count: int, t0: float, drain: bool):
        self.server, self.generation, self.count = server, generation, count
        self.t0 = t0              # wall-clock seconds (time.time) at which the run's clock reads 0
        self.drain = drain        # messages after the budget's last are applied (the run writes checkpoints)
        self.lr: dict[int, float] = {}   # message index -> the learning rate it is pushed with
        self.evaluate: set[int] = set()
        self.last: int | None = None
        self.checkpoint: int | None = None
        self.mode = "run"         # "hold" (a checkpoint is due), "done" (the budget is spent), "failed"
        self.records: list[tuple] = []
        self.snapshots: dict[int, dict] = {}
        self.adopted: dict[int, list] = {}
        self.delivered: list[int] = []   # workers whose adopted samples went out with a reply
        self.buffers = None       # the running statistics of the last pushing worker (BatchNorm)
        self.pulls_with_push = 0

    def plan(self, start: int, lrs: list[float], evaluate: list[int], last: int | None,
             checkpoint: int | None, resume: bool = False) -> None:
        """Extend the plan with the rates of messages start, start+1, ...; ``resume``: after a checkpoint."""
        for i, lr in enumerate(lrs):
            self.lr[start + i] = lr
        self.evaluate.update(evaluate)
        self.last = last if last is not None else self.last
        self.checkpoint = checkpoint
        if resume and self.mode == "hold":
            self.mode = "run"

    def _stopped(self) -> tuple | None:
        return (STOP,) if self.mode in ("done", "failed") else (HOLD,) if self.mode == "hold" else None

    def pull(self, m: int, generation: int) -> tuple:
        """A worker that starts: (GO, lr, weights, adopted samples), or why not."""
        if generation != self.generation:
            return (STALE,)
        stopped = self._stopped()
        if stopped is not None:
            return stopped
        return self._go(m, taken=False)

    def _go(self, m: int, taken: bool) -> tuple:
        lr = self.lr.get(self.count)
        if lr is None:            # the driver has not planned this far yet
            return (WAIT, taken)
        adopted = self.adopted.pop(m, [])
        if adopted:
            self.delivered.append(m)
        return GO, lr, self.server.pull(m).numpy(), adopted

    def push(self, m: int, generation: int, meta: tuple, msg, buffers) -> tuple:
        """Apply worker m's message (meta = (loss, samples, finite, train_acc, last push's seconds)) and
        say what the worker does next: (GO, lr, weights, adopted), HOLD, STOP, WAIT or STALE."""
        if generation != self.generation:
            return (STALE,)
        j = self.count
        if self.mode == "failed" or (self.mode == "done" and not self.drain):
            return (STOP,)        # (after the budget without checkpoints: dropped, as the driver's path drops it)
        lr = self.lr.get(j)
        if lr is None:
            return (WAIT, False)
        server = self.server
        pulled, version = server.pulled_version[m], server.version
        try:
            applied = server.push(m, torch.from_numpy(msg), lr)
        except NonFiniteError:
            self.mode = "failed"  # (on_nonfinite "stop"): nobody pushes again
            raise
        loss, samples, _, train_acc, latency = meta
        self.records.append((m, pulled, version, applied, time.time() - self.t0, loss, samples, train_acc, latency))
        self.count += 1
        self.lr.pop(j, None)
        if buffers is not None:
            self.buffers = buffers
        if j in self.evaluate:    # the weights the driver's path would evaluate after this message
            self.evaluate.discard(j)
            state = server.state_dict(algorithm_state=False)
            state["w"] = state["w"].clone()
            self.snapshots[j] = {"state": state, "buffers": self.buffers}
        if j == self.last:
            self.mode = "done"
        elif self.mode == "run" and self.checkpoint is not None and server.version >= self.checkpoint:
            self.mode = "hold"
        stopped = self._stopped()
        if stopped is not None:
            return stopped
        reply = self._go(m, taken=True)
        self.pulls_with_push += reply[0] == GO
        return reply

    def adopt(self, m: int, indices) -> None:
        """Samples of a lost worker for worker m: they go with its next weights."""
        self.adopted.setdefault(m, []).append(indices)

    def poll(self) -> tuple:
        """What happened since the last poll: (records, snapshots, workers given adopted samples,
        pulls sent with a push so far, mode)."""
        out = (self.records, self.snapshots, self.delivered, self.pulls_with_push, self.mode)
        self.records, self.snapshots, self.delivered = [], {}, []
        return out
