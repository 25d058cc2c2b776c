"""The simulator's two drivers: the event loop over a virtual clock, and trace replay.

Both own the M workers of a simulated run (built by the training run's
``worker_factory``, all sharing its model) and drive them through the runtime
contract (``runtimes/base.py``). ``sim.Simulator`` chooses one of them, or the
batched ``vectorised.VectorisedLoop``, which extends ``EventLoop``.
"""
from __future__ import annotations

import heapq
import math
import random

from ..core.delays import DelayModel, Trace
from .base import Training


class EventLoop:
    """M workers against a virtual clock: a min-heap of (finish time, sequence, worker).

    Popping worker m runs its computation (which depends only on what it
    pulled and on its own mini-batches, so computing at pop time equals
    computing at pull time), pushes the message and schedules m again. Ties
    break by the sequence number, so equal speeds give exact round robin.
    Synchronous algorithms park each finished worker until the round closes
    (not one whose message the rule dropped: it starts again at once). A rule
    with a ``stop_threshold`` (``--stops on``) has every worker whose pulled
    weights fall that many updates behind stopped and started again at the
    current weights: its computation never finished (no mini-batch drawn, no
    samples spent), and it is counted (``computations_stopped``).
    """
    pace = staticmethod(lambda: None)   # called once per message (the simulator's ThreadGovernor.tick)
    # A real run's transport (Simulator.message_time, .pull): each message's, drawn from an exponential of
    # this median, delays the worker's next computation; with pull "separate" (the local runtime's second
    # request) its pull comes that long after its push, after whatever reached the server meanwhile
    message_time = 0.0
    pull = "with-push"

    def __init__(self, training: Training, delay: DelayModel, step_time: float, rng: random.Random):
        self.training, self.delay, self.step_time, self.rng = training, delay, step_time, rng
        self.server = training.server
        self.algo = self.server.algorithm
        self.workers = [training.worker_factory.build(m) for m in range(self.server.num_workers)]
        self.heap: list[tuple[float, int, int]] = []
        self.seq = 0
        self.now = 0.0
        self.pulled = [None] * len(self.workers)
        self.parked: list[int] = []   # synchronous algorithms: finished, waiting for the round
        self.stop_at = self.algo.stop_threshold(self.server.num_workers)
        self.stopped = [0] * len(self.workers)   # computations stopped (stop_at), per worker
        self.pulls: list[tuple[float, int, int]] = []   # pull "separate": (when, sequence, worker) to come

    def start(self, m: int) -> None:
        """Worker m pulls (if it pulls first) and starts computing now (after its transport, if modelled)."""
        lag = 0.0
        if self.message_time:   # (drawn only when given: the clock of every other run stays bit for bit)
            lag = self.rng.expovariate(math.log(2) / self.message_time)
        if self.algo.pull_before_compute:
            if lag and self.pull == "separate" and self.pulled[m] is not None:   # (its first pull: at once)
                if any(p[2] == m for p in self.pulls):   # a stopped worker's pull still to come: replaced
                    self.pulls = [p for p in self.pulls if p[2] != m]
                    heapq.heapify(self.pulls)
                heapq.heappush(self.pulls, (self.now + lag, self.seq, m))
            else:   # into the worker's own buffer: no allocation per pull
                self.pulled[m] = self.server.pull(m, out=self.pulled[m])
        base = self.step_time * self.algo.steps_per_message
        finish = self.now + self.delay.duration(m, self.rng, self.now, base)
        if lag:
            finish += lag
        heapq.heappush(self.heap, (finish, self.seq, m))
        self.seq += 1

    def pull_due(self, when: float) -> None:
        """The separate pulls that come before the event at ``when`` (a worker's own always does)."""
        while self.pulls and self.pulls[0][0] <= when:
            m = heapq.heappop(self.pulls)[2]
            self.pulled[m] = self.server.pull(m, out=self.pulled[m])

    def begin(self) -> None:
        for m in range(len(self.workers)):
            self.start(m)

    def state_dict(self) -> dict:
        return {"kind": "events", "heap": list(self.heap), "seq": self.seq, "now": self.now,
                "parked": list(self.parked), "pulled": list(self.pulled), "rng": self.rng.getstate(),
                "workers": [w.state_dict() for w in self.workers],
                **({"stopped": list(self.stopped)} if self.stop_at is not None else {}),
                **({"pulls": list(self.pulls)} if self.pulls else {})}

    def load_state_dict(self, st: dict) -> None:
        if st.get("kind") != "events":
            raise ValueError("the checkpoint was made by a trace replay, not by the event loop")
        self.heap = [(float(t), int(q), int(m)) for t, q, m in st["heap"]]
        self.seq, self.now = int(st["seq"]), float(st["now"])
        self.parked, self.pulled = list(st["parked"]), to_device(list(st["pulled"]), self.server.w.device)
        self.rng.setstate(as_tuple(st["rng"]))
        self.stopped = [int(k) for k in st.get("stopped", [0] * len(self.workers))]
        self.pulls = [(float(t), int(q), int(m)) for t, q, m in st.get("pulls", [])]
        load_workers(self.workers, st["workers"])

    def run(self) -> None:
        training = self.training
        while not training.done:
            self.now, _, m = heapq.heappop(self.heap)
            if self.pulls:
                self.pull_due(self.now)
            worker, lr = self.workers[m], training.lr
            loss, computed = worker.compute(self.pulled[m], lr)
            self.deliver(m, loss, computed, lr, worker.train_acc)
            self.pace()
        self.report_stops()
        training.save_checkpoint(self.state_dict())   # the final state, so that a run can be extended

    def report_stops(self) -> None:
        """summary.json's ``computations_stopped`` (a rule with a ``stop_threshold`` only)."""
        if self.stop_at is not None:
            self.training.note(computations_stopped=sum(self.stopped), computations_stopped_per_worker=self.stopped)

    def deliver(self, m: int, loss: float, computed, lr: float, train_acc: float) -> None:
        """Worker m's computed window becomes its message: (elastic rules: pull the centre,) probe, push,
        account, and start it again."""
        training, server, worker = self.training, self.server, self.workers[m]
        if not self.algo.pull_before_compute:
            self.pulled[m] = server.pull(m, out=self.pulled[m])
        msg = worker.message(self.pulled[m], computed)
        if training.probes is not None:   # a stalegrad.core.prober.Prober with --probe-every
            training.probes.observe(m, worker, self.pulled[m], msg, server, lr)
        server.push(m, msg, lr)
        training.after_push(worker.samples_per_message, loss, self.now, train_acc=train_acc)
        self.continue_after_push(m)

    def continue_after_push(self, m: int) -> None:
        """Worker m starts again, or, in a synchronous round, waits for it to close."""
        if not self.algo.synchronous:
            self.start(m)
        else:
            self.parked.append(m)
            server = self.server
            if any(not server.waiting(p) for p in self.parked):   # the round closed, or m's message was dropped
                parked, self.parked = self.parked, []
                for p in parked:   # (in the order they finished)
                    if server.waiting(p):
                        self.parked.append(p)
                    else:
                        self.start(p)
        if self.stop_at is not None:
            self.stop_stale()
        if self.training.checkpoint_due():
            self.training.save_checkpoint(self.state_dict())

    def stop_stale(self) -> None:
        """Stop every computing worker whose pulled weights are ``stop_at`` or more updates old, and start it
        again at the current weights (in the order of the workers)."""
        server = self.server
        stale = sorted({k for _, _, k in self.heap if server.version - server.pulled_version[k] >= self.stop_at})
        if not stale:
            return
        self.heap = [entry for entry in self.heap if entry[2] not in stale]
        heapq.heapify(self.heap)
        for k in stale:
            self.stopped[k] += 1
            self.start(k)


class Replay:
    """Replay a recorded push order; with recorded pull versions, exactly.

    Each worker pulls when the server reaches the version it pulled in the
    recording, so every push sees the recorded tau. Past the end of the
    trace, the order repeats and workers pull right after their own push.
    """
    pace = EventLoop.pace

    def __init__(self, training: Training, trace: Trace, step_time: float):
        self.training, self.trace, self.step_time = training, trace, step_time
        self.server = training.server
        self.algo = self.server.algorithm
        M = self.server.num_workers
        self.workers = [training.worker_factory.build(m) for m in range(M)]
        # Each worker's recorded pull versions, in the order of its pushes.
        self.wants: list[list[int]] = [[] for _ in range(M)]
        if trace.pulled is not None:
            for w, v in zip(trace.workers, trace.pulled):
                self.wants[w].append(v)
        self.pending = [0] * M          # index into wants[m] of the next pull
        self.pulled = [None] * M
        self.has_pulled = [False] * M
        self.i = 0                      # next trace entry

    def begin(self) -> None:
        for m in range(len(self.workers)):
            if not self.wants[m] or self.wants[m][0] == 0:
                self.pull(m)

    def pull(self, m: int) -> None:
        self.pulled[m] = self.server.pull(m, out=self.pulled[m])
        self.has_pulled[m] = True

    def state_dict(self) -> dict:
        return {"kind": "replay", "i": self.i, "pending": list(self.pending), "has_pulled": list(self.has_pulled),
                "pulled": list(self.pulled), "workers": [w.state_dict() for w in self.workers]}

    def load_state_dict(self, st: dict) -> None:
        if st.get("kind") != "replay":
            raise ValueError("the checkpoint was made by the event loop, not by a trace replay")
        self.i, self.pending = int(st["i"]), [int(p) for p in st["pending"]]
        self.has_pulled = [bool(h) for h in st["has_pulled"]]
        self.pulled = to_device(list(st["pulled"]), self.server.w.device)
        load_workers(self.workers, st["workers"])

    def run(self) -> None:
        training, server, trace = self.training, self.server, self.trace
        n, M = len(trace.workers), len(self.workers)
        wants, pending, has_pulled, pulled = self.wants, self.pending, self.has_pulled, self.pulled
        probes = training.probes
        per_event = self.step_time / max(1, M)
        while not training.done:
            i = self.i
            exhausted = i >= n
            if i == n:
                training.note(f"trace {trace.path} ended after {n} pushes; its order was repeated "
                              "with pulls right after each push")
            m = trace.workers[i % n]
            worker = self.workers[m]
            lr = training.lr
            if self.algo.pull_before_compute:
                if not has_pulled[m]:    # recorded pull version never reached (e.g. a skipped update)
                    self.pull(m)
                loss, computed = worker.compute(pulled[m], lr)
            else:                        # elastic averaging pulls the centre after its local steps
                loss, computed = worker.compute(None, lr)
                self.pull(m)
            msg = worker.message(pulled[m], computed)
            if probes is not None:
                probes.observe(m, worker, pulled[m], msg, server, lr)
            server.push(m, msg, lr)
            has_pulled[m] = False
            pending[m] += 1
            if trace.wall_s is not None and not exhausted:
                now = trace.wall_s[i]
            else:
                now = (i + 1) * per_event * self.algo.steps_per_message
            training.after_push(worker.samples_per_message, loss, now, train_acc=worker.train_acc)
            self.i = i + 1
            if exhausted or pending[m] >= len(wants[m]):
                self.pull(m)
            # Workers whose recorded pull version has been reached pull now.
            for k in range(M):
                if not has_pulled[k] and pending[k] < len(wants[k]) and wants[k][pending[k]] <= server.version:
                    self.pull(k)
            if training.checkpoint_due():
                training.save_checkpoint(self.state_dict())
            self.pace()
        training.save_checkpoint(self.state_dict())   # the final state, so that a run can be extended


def to_device(obj, device):
    from ..core.server import to_device as move   # the server imports torch; help and argument errors must not
    return move(obj, device)


def load_workers(workers: list, states: list[dict]) -> None:
    if len(states) != len(workers):
        raise ValueError(f"the checkpoint holds {len(states)} workers, this run has {len(workers)}")
    for worker, st in zip(workers, states):
        worker.load_state_dict(st)


def as_tuple(x):
    """random.Random states come back from a checkpoint as lists."""
    return tuple(as_tuple(v) for v in x) if isinstance(x, (list, tuple)) else x
