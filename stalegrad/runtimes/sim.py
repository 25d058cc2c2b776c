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
from dataclasses import dataclass

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

    def run(self, run, seed: int = 0, resume: dict | None = None) -> None:
        """Drive ``run`` to its sample budget; ``resume`` is the state a checkpoint saved."""
        model = self.delay if isinstance(self.delay, DelayModel) else parse_delay(self.delay, run.num_workers)
        if self.vectorised:   # batched gradients, see vectorised.py; False (with a note): not applicable
            from .vectorised import run_vectorised
            if run_vectorised(run, model, self.step_time, random.Random(seed), resume):
                return
        if isinstance(model, Trace) and not run.algorithm.synchronous:
            loop = _Replay(run, model, self.step_time)
        else:
            loop = _EventLoop(run, model, self.step_time, random.Random(seed))
        if resume is None:
            loop.begin()
        else:
            loop.load_state_dict(resume)
        loop.run()


class _EventLoop:
    def __init__(self, run, delay: DelayModel, step_time: float, rng: random.Random):
        self.run_, self.delay, self.step_time, self.rng = run, delay, step_time, rng
        self.server = run.server
        self.algo = run.algorithm
        self.heap: list[tuple[float, int, int]] = []
        self.seq = 0
        self.now = 0.0
        self.pulled = [None] * run.num_workers
        self.parked: list[int] = []   # synchronous algorithms: finished, waiting for the round

    def start(self, m: int) -> None:
        """Worker m pulls (if it pulls first) and starts computing now."""
        if self.algo.pull_before_compute:
            # into the worker's own buffer: no allocation per pull
            self.pulled[m] = self.server.pull(m, out=self.pulled[m])
        steps = self.algo.steps_per_message
        finish = self.now + self.step_time * steps * self.delay.factor(m, self.rng)
        heapq.heappush(self.heap, (finish, self.seq, m))
        self.seq += 1

    def begin(self) -> None:
        for m in range(self.run_.num_workers):
            self.start(m)

    def state_dict(self) -> dict:
        return {"kind": "events", "heap": list(self.heap), "seq": self.seq, "now": self.now,
                "parked": list(self.parked), "pulled": list(self.pulled), "rng": self.rng.getstate()}

    def load_state_dict(self, st: dict) -> None:
        if st.get("kind") != "events":
            raise ValueError("the checkpoint was made by a trace replay, not by the event loop")
        self.heap = [(float(t), int(q), int(m)) for t, q, m in st["heap"]]
        self.seq, self.now = int(st["seq"]), float(st["now"])
        self.parked, self.pulled = list(st["parked"]), list(st["pulled"])
        self.rng.setstate(_as_tuple(st["rng"]))

    def run(self) -> None:
        run, server, algo = self.run_, self.server, self.algo
        while not run.done:
            self.now, _, m = heapq.heappop(self.heap)
            worker = run.workers[m]
            lr = run.lr
            computed = worker.compute(self.pulled[m], lr)
            if not algo.pull_before_compute:
                self.pulled[m] = server.pull(m, out=self.pulled[m])
            server.push(m, worker.message(self.pulled[m], computed), lr)
            run.after_push(worker.samples_per_message, worker.last_loss, self.now)
            self.continue_after_push(m)
        self.finish()

    def continue_after_push(self, m: int) -> None:
        """Worker m starts again, or, in a synchronous round, waits for it to close."""
        if not self.algo.synchronous:
            self.start(m)
        else:
            self.parked.append(m)
            if not self.server.round_open:   # the round closed: everyone starts again
                for p in self.parked:
                    self.start(p)
                self.parked.clear()
        if self.run_.checkpoint_due():
            self.run_.save_checkpoint(self.state_dict())

    def finish(self) -> None:
        if self.run_.checkpoint_path is not None:   # the final state, so that a run can be extended
            self.run_.save_checkpoint(self.state_dict())


class _Replay:
    """Replay a recorded push order; with recorded pull versions, exactly.

    Each worker pulls when the server reaches the version it pulled in the
    recording, so every push sees the recorded tau. Past the end of the
    trace, the order repeats and workers pull right after their own push.
    """

    def __init__(self, run, trace: Trace, step_time: float):
        self.run_, self.trace, self.step_time = run, trace, step_time
        self.server = run.server
        M = run.num_workers
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
        for m in range(self.run_.num_workers):
            if not self.wants[m] or self.wants[m][0] == 0:
                self.pull(m)

    def pull(self, m: int) -> None:
        self.pulled[m] = self.server.pull(m, out=self.pulled[m])
        self.has_pulled[m] = True

    def state_dict(self) -> dict:
        return {"kind": "replay", "i": self.i, "pending": list(self.pending), "has_pulled": list(self.has_pulled),
                "pulled": list(self.pulled)}

    def load_state_dict(self, st: dict) -> None:
        if st.get("kind") != "replay":
            raise ValueError("the checkpoint was made by the event loop, not by a trace replay")
        self.i, self.pending = int(st["i"]), [int(p) for p in st["pending"]]
        self.has_pulled, self.pulled = [bool(h) for h in st["has_pulled"]], list(st["pulled"])

    def run(self) -> None:
        run, server, trace = self.run_, self.server, self.trace
        n, M = len(trace.workers), run.num_workers
        wants, pending, has_pulled, pulled = self.wants, self.pending, self.has_pulled, self.pulled
        per_event = self.step_time / max(1, M)
        while not run.done:
            i = self.i
            exhausted = i >= n
            if exhausted and not any("trace" in note for note in run.notes):
                run.notes.append(f"trace {trace.path} ended after {n} pushes; its order was repeated "
                                 "with pulls right after each push")
            m = trace.workers[i % n]
            worker = run.workers[m]
            lr = run.lr
            if run.algorithm.pull_before_compute:
                if not has_pulled[m]:    # recorded pull version never reached (e.g. a skipped update)
                    self.pull(m)
                computed = worker.compute(pulled[m], lr)
            else:                        # elastic averaging pulls the centre after its local steps
                computed = worker.compute(None, lr)
                self.pull(m)
            server.push(m, worker.message(pulled[m], computed), lr)
            has_pulled[m] = False
            pending[m] += 1
            if trace.wall_s is not None and not exhausted:
                now = trace.wall_s[i]
            else:
                now = (i + 1) * per_event * run.algorithm.steps_per_message
            run.after_push(worker.samples_per_message, worker.last_loss, now)
            self.i = i + 1
            if exhausted or pending[m] >= len(wants[m]):
                self.pull(m)
            # Workers whose recorded pull version has been reached pull now.
            for k in range(M):
                if not has_pulled[k] and pending[k] < len(wants[k]) and wants[k][pending[k]] <= server.version:
                    self.pull(k)
            if run.checkpoint_due():
                run.save_checkpoint(self.state_dict())
        if run.checkpoint_path is not None:   # the final state, so that a run can be extended
            run.save_checkpoint(self.state_dict())


def _as_tuple(x):
    """random.Random states come back from a checkpoint as lists."""
    return tuple(_as_tuple(v) for v in x) if isinstance(x, (list, tuple)) else x
