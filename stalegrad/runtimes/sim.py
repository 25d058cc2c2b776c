"""The deterministic simulator of asynchronous training (``--runtime sim``).

One process plays M workers against a virtual clock. A min-heap holds each
worker's finish time; popping it runs that worker's computation (which
depends only on what it pulled and on its own mini-batches, so computing it
at pop time gives the same result as at pull time), pushes the message, and
schedules the worker again. Ties break by scheduling order, so equal speeds
give exact round robin. Synchronous algorithms park each finished worker
until the round closes, at the slowest worker's finish time.
"""
from __future__ import annotations

import heapq
import random
from dataclasses import dataclass, field

from ..delays import DelayModel, Trace, parse_delay


@dataclass
class Simulator:
    delay: str | DelayModel = "uniform"
    step_time: float = 1.0   # virtual seconds of one local step of a speed-1 worker
    vectorised: bool = False  # batch the gradients of workers whose pushes fall due together

    def __post_init__(self):
        if not self.step_time > 0:
            raise ValueError(f"--step-time must be > 0, got {self.step_time!r}")

    def describe(self) -> dict:
        spec = self.delay if isinstance(self.delay, str) else self.delay.spec
        return {"name": "sim", "delay": spec, "step_time": self.step_time, "vectorised": self.vectorised}

    def run(self, run, seed: int = 0) -> None:
        model = self.delay if isinstance(self.delay, DelayModel) else parse_delay(self.delay, run.num_workers)
        if isinstance(model, Trace) and not run.algorithm.synchronous:
            _Replay(run, model, self.step_time).run()
        else:
            _EventLoop(run, model, self.step_time, random.Random(seed)).run()


class _EventLoop:
    def __init__(self, run, delay: DelayModel, step_time: float, rng: random.Random):
        self.run_, self.delay, self.step_time, self.rng = run, delay, step_time, rng
        self.server = run.server
        self.algo = run.algorithm
        self.heap: list[tuple[float, int, int]] = []
        self.seq = 0
        self.now = 0.0
        self.pulled = [None] * run.num_workers

    def start(self, m: int) -> None:
        """Worker m pulls (if it pulls first) and starts computing now."""
        if self.algo.pull_before_compute:
            self.pulled[m] = self.server.pull(m)
        steps = self.algo.steps_per_message
        finish = self.now + self.step_time * steps * self.delay.factor(m, self.rng)
        heapq.heappush(self.heap, (finish, self.seq, m))
        self.seq += 1

    def run(self) -> None:
        run, server, algo = self.run_, self.server, self.algo
        for m in range(run.num_workers):
            self.start(m)
        parked: list[int] = []
        while not run.done:
            self.now, _, m = heapq.heappop(self.heap)
            worker = run.workers[m]
            lr = run.lr
            computed = worker.compute(self.pulled[m], lr)
            if not algo.pull_before_compute:
                self.pulled[m] = server.pull(m)
            server.push(m, worker.message(self.pulled[m], computed), lr)
            run.after_push(worker.samples_per_message, worker.last_loss, self.now)
            if not algo.synchronous:
                self.start(m)
                continue
            parked.append(m)
            if not server.round_open:   # the round closed: everyone starts again
                for p in parked:
                    self.start(p)
                parked.clear()


class _Replay:
    """Replay a recorded push order; with recorded pull versions, exactly.

    Each worker pulls when the server reaches the version it pulled in the
    recording, so every push sees the recorded tau. Past the end of the
    trace, the order repeats and workers pull right after their own push.
    """

    def __init__(self, run, trace: Trace, step_time: float):
        self.run_, self.trace, self.step_time = run, trace, step_time
        self.server = run.server

    def run(self) -> None:
        run, server, trace = self.run_, self.server, self.trace
        n, M = len(trace.workers), run.num_workers
        # Each worker's recorded pull versions, in order of its pushes.
        wants: list[list[int]] = [[] for _ in range(M)]
        if trace.pulled is not None:
            for w, v in zip(trace.workers, trace.pulled):
                wants[w].append(v)
        pending = [0] * M          # index into wants[m] of the next pull
        pulled = [None] * M
        has_pulled = [False] * M

        def pull(m):
            pulled[m] = server.pull(m)
            has_pulled[m] = True

        def due_pulls():
            # Workers whose recorded pull version has been reached pull now.
            for m in range(M):
                if not has_pulled[m] and pending[m] < len(wants[m]) and wants[m][pending[m]] <= server.version:
                    pull(m)

        for m in range(M):
            if not wants[m] or wants[m][0] == 0:
                pull(m)
        i = 0
        per_event = self.step_time / max(1, M)
        while not run.done:
            exhausted = i >= n
            if exhausted and not run.notes:
                run.notes.append(f"trace {trace.path} ended after {n} pushes; its order was repeated "
                                 "with pulls right after each push")
            m = trace.workers[i % n]
            worker = run.workers[m]
            lr = run.lr
            if run.algorithm.pull_before_compute:
                if not has_pulled[m]:    # recorded pull version never reached (e.g. a skipped update)
                    pull(m)
                computed = worker.compute(pulled[m], lr)
            else:                        # elastic averaging pulls the centre after its local steps
                computed = worker.compute(None, lr)
                pull(m)
            server.push(m, worker.message(pulled[m], computed), lr)
            has_pulled[m] = False
            pending[m] += 1
            now = trace.wall_s[i] if (trace.wall_s is not None and not exhausted) else (i + 1) * per_event * run.algorithm.steps_per_message
            run.after_push(worker.samples_per_message, worker.last_loss, now)
            i += 1
            if exhausted or pending[m] >= len(wants[m]):
                pull(m)
            due_pulls()
