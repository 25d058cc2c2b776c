"""The driver of the direct path: workers push to and pull from the server shard themselves.

With one server shard and an asynchronous rule that pulls before computing (``fits``), an update is one
round trip between a worker and the shard (``actors.WorkerActor.run``, ``ledger.Ledger.push``); the
driver is not on that path. It plans ahead (``Training.ahead``: each message's learning rate, the
evaluations, the end of the budget, the next checkpoint), reads the shard's records every ``POLL_S``
seconds or when a worker stops (``poll``), and accounts for each message in order as the driver's path
does right after each push (``after_push``; an evaluation gets the weights the shard kept after that
message). Checkpoints are a consistent cut, as on the driver's path: the shard holds every worker after
its message once the checkpoint's version is reached, the driver saves, and starts them again.

Faults as on the driver's path (``recovery.py``): a worker whose actor dies is replaced or dropped (its
samples go to the survivors through the shard, with their next weights); a shard that dies is restarted
by Ray and loaded back from the last checkpoint, with a new generation, so that a message computed on
the weights before is refused (STALE), never applied.
"""
from __future__ import annotations

import time

import torch

from ...core.server import NonFiniteError
from ...errors import RunError
from .actors import to_torch
from .driver import Driver, ShardLost
from .ledger import FAILED, LOST, WAIT

PLAN = 1024     # messages planned ahead of the driver's count; extended when half of it is left
POLL_S = 0.05   # seconds between two reads of the shard's records while every worker runs


def fits(runtime, training) -> bool:
    """Whether a run can take the direct path: one shard, an asynchronous rule that pulls before it
    computes, and a training run that plans ahead (``Training.ahead``)."""
    algo = training.server.algorithm
    return (min(runtime.ps_shards, training.server.w.numel()) == 1 and not algo.synchronous
            and algo.pull_before_compute and callable(getattr(training, "ahead", None)))


class DirectDriver(Driver):
    poll_s = POLL_S

    def __init__(self, runtime, training, resume: dict | None):
        super().__init__(runtime, training, resume)
        # refs of the workers' ``run`` -> worker; a loop left behind (a restored shard, the end without
        # checkpoints) is dropped: it ends at its next call to the shard (STALE, STOP) or with its actor
        self.loops: dict = {}
        self.generation = 0
        self.processed = 0             # messages accounted for (the ledger's count when it caught up)
        self.planned = 0               # messages whose rate the shard knows
        self.mode = "run"              # the ledger's, at the last poll
        self.undelivered: dict[int, list] = {}   # samples of a lost worker not yet sent to their adopter
        self.per_message = self.algo.steps_per_message * self.factory.batch_size
        self.polls = 0
        self.channel = None            # the shard's socket for workers on its machine (channel.py), if any
        self.socket_calls = 0          # pulls and pushes answered through it, over the shard's generations
        self.socket_fallbacks = 0      # workers that the socket, on their machine, did not take: Ray calls

    def start(self) -> None:
        super().start()
        self._direct()

    def _direct(self) -> None:
        """(Re)start the shard's ledger at the driver's count, with a plan."""
        t0 = time.time() - (time.perf_counter() - self.t0)   # the run's clock, in the shard's wall seconds
        self.planned = self.processed
        self.channel = self._get([self.shards[0].direct.remote(self.generation, self.processed, t0,
                                                               bool(self.training.checkpoint_every),
                                                               self.rt.same_node_socket)])[0]
        self._get([self.shards[0].plan.remote(**self.extension(force=True))])
        for m, parts in self.undelivered.items():
            for part in parts:
                self.shards[0].adopt.remote(m, part)

    def extension(self, force: bool = False, resume: bool = False) -> dict | None:
        """The plan from the shard's last planned message on, while fewer than PLAN // 2 are left."""
        if not force and self.planned - self.processed > PLAN // 2:
            return None
        ahead = self.training.ahead(self.per_message, PLAN)
        skip = self.planned - self.processed
        extension = {"start": self.planned, "lrs": ahead["lr"][skip:],
                     "evaluate": [self.processed + k for k in ahead["evaluate"] if k >= skip],
                     "last": None if ahead["last"] is None else self.processed + ahead["last"],
                     "checkpoint": ahead["checkpoint"], "resume": resume}
        self.planned = self.processed + PLAN
        return extension

    def launch(self, m: int) -> None:
        self.loops[self.actors[m].run.remote(self.shards[0], self.generation, self.channel)] = m

    def give_samples(self, m: int, part: torch.Tensor) -> None:
        self.undelivered.setdefault(m, []).append(part.numpy())
        self.shards[0].adopt.remote(m, part.numpy())

    # ---- the loop -------------------------------------------------------------------
    def run(self) -> None:
        training = self.training
        if not training.done:
            for m in sorted(self.live):
                self.launch(m)
        while not training.done or (training.checkpoint_every and self.loops):
            try:   # (the shard may die at any call: also while every worker is held for a checkpoint)
                if not self.loops:
                    if not self.live:
                        raise RunError(f"all {self.M} workers were lost; see the notes above")
                    if self.mode == "hold" and training.checkpoint_due():
                        self.checkpoint()
                        continue
                    if self.polls and not training.done:   # (every record is in: a worker stops only after its push)
                        raise RuntimeError(f"every worker stopped at message {self.processed} with the budget not "
                                           f"spent and no checkpoint due (the shard's mode: {self.mode})")
                self.step()
            except ShardLost:
                self.restore_shards()
        self.finish()

    def step(self) -> None:
        """Wait for a worker to stop (or ``poll_s``), then account for the shard's records."""
        ray, failed, waiting = self.ray, None, []
        ready, rest = ray.wait(list(self.loops), num_returns=1, timeout=self.poll_s) if self.loops else ([], [])
        if ready and rest:
            ready += ray.wait(rest, num_returns=len(rest), timeout=0)[0]
        for ref in ready:
            m = self.loops.pop(ref)
            try:
                status, text = ray.get(ref)
            except (ray.exceptions.RayActorError, ray.exceptions.ObjectLostError):
                self.replace_worker(m)   # (its actor or node died; a replacement starts at once)
                continue
            except ray.exceptions.RayTaskError as e:
                raise RunError(f"worker {m} failed: {str(e.cause).splitlines()[0] if e.cause else e}") from None
            if status == LOST:
                raise ShardLost
            if status == FAILED:
                failed = text
            elif status == WAIT:
                waiting.append(m)
            # (HOLD, STOP: the worker waits for a checkpoint or the end; STALE: a loop of a restored shard's
            # generation before, whose message was refused)
        self.poll()
        if failed is not None:
            raise NonFiniteError(failed)
        for m in waiting:
            self.launch(m)

    def poll(self) -> None:
        records, snapshots, delivered, self.pulls_with_push, self.mode, served = self._get(
            [self.shards[0].poll.remote(self.extension())])[0]
        self.socket_calls += served
        self.polls += 1
        for m in delivered:
            self.undelivered.pop(m, None)
        training, sharded = self.training, self.sharded
        for m, pulled, version, applied, now, loss, samples, train_acc, latency in records:
            j, self.processed = self.processed, self.processed + 1
            if applied:
                sharded.version = version + 1
            self.server.version = sharded.version   # the training run's clock: checkpoint_due() reads it
            self.pushes[m] += 1
            if latency is not None:
                self.push_s.append(latency)
            if self.trace is not None:
                self.trace.append((m, pulled, version, now))
            snapshot = snapshots.get(j)
            if training.evaluation_due(samples) != (snapshot is not None):
                raise RuntimeError(f"the shard's plan and the run disagree on an evaluation after message {j}")
            if snapshot is not None:
                self.load_snapshot(snapshot)
            training.after_push(samples, loss, now, train_acc=train_acc)

    def load_snapshot(self, snapshot: dict) -> None:
        """The weights (and the pushing worker's BatchNorm statistics) kept for an evaluation."""
        self.server.load_state_dict(to_torch(snapshot["state"]), strict=False)
        if snapshot["buffers"] is not None:
            buffers = [b for b in self.factory.model.module.buffers() if b.is_floating_point()]
            for b, v in zip(buffers, snapshot["buffers"]):
                b.copy_(torch.from_numpy(v.copy()))

    # ---- checkpoints and faults -------------------------------------------------------------------
    def checkpoint(self, also_running: int | None = None) -> None:
        """Every worker is held after its message (the shard said HOLD): a consistent cut."""
        self.snapshot = self.sync(algorithm_state=True)
        self.save()
        if self.training.done:
            return
        self._get([self.shards[0].plan.remote(**self.extension(force=True, resume=True))])
        self.mode = "run"
        for m in sorted(self.live):
            self.launch(m)

    def restore_shards(self, launch: bool = True) -> None:
        """A shard died: back to the last checkpoint (``Recovery``), then a ledger of a new generation."""
        self.loops.clear()
        self.generation += 1
        super().restore_shards(launch=False)
        self.mode = "run"
        self._direct()
        if launch and not self.training.done:
            for m in sorted(self.live):
                self.launch(m)

    def finish(self) -> None:
        # Without checkpoints the messages still running are dropped (the shard refuses them): the
        # loops are not waited for, as the driver's path does not wait for its futures.
        self.loops.clear()
        self.report_socket()
        super().finish()

    def report_socket(self) -> None:
        """One note for the run, however many workers and messages: the workers that the shard's socket did not
        take (channel.attempt: out of descriptors, no answer in time) made their calls through Ray, with the same
        bits; why, in the shard's words where it has them."""
        live = sorted(m for m in self.live if m in self.actors)
        if self.channel is None or not live:
            return
        try:
            problems = [p for p in self.ray.get([self.actors[m].socket_status.remote() for m in live], timeout=30)
                        if p is not None]
            trouble = self.ray.get(self.shards[0].socket_trouble.remote(), timeout=30) if problems else None
        except Exception:   # (an actor lost at the very end: nothing to say of it)
            return
        self.socket_fallbacks = len(problems)
        if problems:
            why = f"it could not accept them: {trouble}" if trouble else problems[0]
            self.note(f"{len(problems)} of {len(live)} workers could not use the server shard's socket on their "
                      f"machine ({why}) and made their calls through Ray instead: the same bits, more time a message")

    def transport(self) -> dict:
        """The driver's path's figures (a push's round trip: as its worker sees it), the path, and how
        often the driver read the shard's records."""
        return {**super().transport(), "path": "direct", "driver_polls": self.polls,
                "socket_calls": self.socket_calls, "socket_fallbacks": self.socket_fallbacks}
