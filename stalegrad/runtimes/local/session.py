"""One run of the local runtime: start the processes, serve them, stop them.

The server loop is single-threaded: it waits on every worker's pipe and
process sentinel and on the evaluator's, and handles one message at a time
(``protocol`` lists them). Checkpoints are a consistent cut: once one is due,
each worker is held after its next push (workers parked in a synchronous
round at once) and reports its ``Worker.state_dict()``; when every live worker
has, the run is saved and they go on. At the end of the budget, when the run
writes checkpoints, the same gathering gives the final checkpoint: messages
already under way are still applied, no new one starts.

A worker the server waits for (not parked, not held with its state given) that
has sent nothing for ``worker_timeout`` seconds is lost as a killed one is (a
stopped or hung one would stall a synchronous round forever); its clock
restarts at each message it sends or is sent: one healthy message must fit.
"""
from __future__ import annotations

import sys
import time
from multiprocessing.connection import wait

import torch

from ...core import pacing
from ...core.server import to_device
from ...errors import ConfigError
from ..base import Training
from .child import worker_main
from .cut import ConsistentCut
from .evaluator import ProcessEvaluator
from .processes import context, cores, default_threads, describe_exit
from .protocol import (ADOPT, ERROR, METERS_WIDTH, OK, PULL, PUSH, READY, RESTORE, STATE, STOP, WEIGHTS, Buffers,
                       WorkerError, pacing_figures, shared, zeros)
from .stats import Measurements

# Seconds a worker gets, at least, to start (import torch, initialise CUDA) before its first message.
STARTUP_GRACE = 60.0


class Session(ConsistentCut):
    """One run of the local runtime (``LocalRuntime.run``): start, serve, stop."""

    def __init__(self, runtime, training: Training, resume: dict | None, seed: int = 0):
        self.rt, self.training, self.server = runtime, training, training.server
        self.factory = training.worker_factory
        self.algo = self.server.algorithm
        self.M = M = self.server.num_workers
        self.threads = runtime.threads_per_worker or default_threads(M)
        self.seed = seed
        self.profile = pacing.resolve(runtime.delay, runtime.step_time, self.factory, M,
                                      self.algo.steps_per_message, self.threads, cores())
        self.starting: list[int] | None = None if self.profile is None else []   # ready, waiting for the rest
        self.profile_started_s: float | None = None
        self.on_cpu = self.server.w.device.type == "cpu"
        # The saved workers' states; None for a worker lost before the checkpoint (it stays lost).
        self.saved: list[dict | None] | None = None
        if resume is not None:
            self.saved = list(resume["workers"])
            if len(self.saved) != M:
                raise ConfigError("workers", f"is {M}, but the checkpoint holds {len(self.saved)} workers' states")
        self.lost = 0 if self.saved is None else sum(st is None for st in self.saved)
        self.samples = int(resume.get("samples", 0)) if resume is not None else 0   # pushed, for the notes
        self._t0, self._offset = time.perf_counter(), float(resume["now"]) if resume is not None else 0.0
        self.procs: list = [None] * M
        self.conns: list = [None] * M
        self.live: set[int] = set()
        self.parked: list[int] = []               # synchronous rounds: pushed, waiting for the round to close
        self.pulled_at = [0] * M                  # the server's version at each worker's last pull
        self.holding: list[int] | None = None     # a checkpoint is gathering: the workers held so far
        self.asked = [0] * M                      # ("state",) requests not answered yet
        self.states: dict[int, dict] = {}
        self.final_saved = False
        self.evaluator: ProcessEvaluator | None = None
        self.adopt: dict[int, list] = {m: [] for m in range(M)}   # shard parts to send before the next message
        self.pools = None                         # each worker's shard, for reassigning a lost one's
        if self.factory.partition != "iid":
            if self.saved is None:
                self.pools = [self.factory.stream(m).pool for m in range(M)]
            else:
                self.pools = [st["stream"]["pool"].cpu() if st is not None else torch.zeros(0, dtype=torch.long)
                              for st in self.saved]
        self.bn_model = Buffers(self.factory.model.module)
        self.bn = zeros(max(1, self.bn_model.numel))
        if self.bn_model.numel:
            self.bn_model.write(self.bn)
        self.measure = Measurements(M, runtime.record_trace is not None)
        self.heard = [0.0] * M                    # time.monotonic() of the last message from or to each worker

    def now(self) -> float:
        """Wall seconds since the run started (its earlier part too, when resumed)."""
        return time.perf_counter() - self._t0 + self._offset

    def note(self, text: str, **figures) -> None:
        self.training.note(text, **figures)
        print(f"stalegrad: {text}", file=sys.stderr, flush=True)

    # ---- lifecycle ---------------------------------------------------------------------
    def execute(self) -> None:
        training = self.training
        threads = torch.get_num_threads()
        torch.set_num_threads(1)   # the server's vector updates are memory-bound; leave the cores to the workers
        ok = False
        try:
            self.start()
            self.serve(lambda: training.done)
            self.measure.sample(self.now(), self.meters, force=True)   # at the budget: the end
            if training.checkpoint_every:
                self.final_checkpoint()
            self.evaluator.drain()
            ok = True
        finally:
            try:
                self.stop(grace=self.rt.stop_timeout if ok else 0.5)
            finally:
                torch.set_num_threads(threads)
                if self.rt.record_trace is not None:
                    self.write_trace()
        if self.bn_model.numel:   # the workers' running statistics, for the final evaluation and model.pt
            self.bn_model.read(self.bn)
        self.rt.stats = stats = self.measure.collect(self.meters, self.server.w.numel(), self.threads, self.lost)
        training.note(workers_lost=self.lost, threads_per_worker=self.threads, transport=stats["transport"])
        if self.profile is not None:
            figures, text = self.profile.summary({m: pacing_figures(self.meters[m], m) for m in range(self.M)},
                                                 self.server, self.profile_started_s)
            self.rt.stats["pacing"] = figures
            training.note(text, pacing=figures)
            if text is not None:
                print(f"stalegrad: warning: {text}", file=sys.stderr, flush=True)

    def write_trace(self) -> None:
        """The order of pushes into ``record_trace``; if that fails now (disk full, directory removed),
        the run loses the trace only: a note and a warning, and its results are still written."""
        path = self.rt.record_trace
        try:
            self.measure.write_trace(path)
        except OSError as e:
            text = f"the trace could not be written to {path} ({e.strerror or e})"
            self.training.note(text)
            print(f"stalegrad: warning: {text}", file=sys.stderr, flush=True)

    def start(self) -> None:
        training, M = self.training, self.M
        ctx = context(self.rt.start_method)
        w = self.server.w.detach()
        numel = w.numel()
        device = self.training.worker_factory.device   # "cuda" (no index): workers spread over the GPUs
        blob = self.factory.module_blob()
        factory = self.factory.portable(shared(self.factory.x), shared(self.factory.y))
        w_cpu = w.cpu()
        self.pull_bufs = [zeros(numel).copy_(w_cpu) for _ in range(M)]
        self.push_bufs = [zeros(numel) for _ in range(M)]
        self.push_dev = None if self.on_cpu else [torch.empty_like(w) for _ in range(M)]
        self.meters = zeros(M, METERS_WIDTH, dtype=torch.float64)
        self.rt.pids = {"workers": [None] * M, "evaluator": None}
        t0 = time.time() - self._offset   # the profile's second 0 (a resumed run goes on from its own)
        for m in range(M):
            if self.saved is not None and self.saved[m] is None:
                continue   # lost before the checkpoint
            parent, child = ctx.Pipe()
            proc = ctx.Process(target=worker_main, name=f"stalegrad-worker-{m}", daemon=True,
                               args=(m, factory, blob, device, self.threads, self.pull_bufs[m], self.push_bufs[m],
                                     self.bn, self.meters[m], child,
                                     None if self.profile is None else self.profile.pacer(m, self.seed, t0)))
            self.procs[m], self.conns[m] = proc, parent
            proc.start()
            self.heard[m] = time.monotonic()
            child.close()
            self.live.add(m)
            self.rt.pids["workers"][m] = proc.pid
        self.evaluator = ProcessEvaluator(ctx, blob=blob, device=device, threads=self.threads,
                                          test_x=shared(training.test_data.x), test_y=shared(training.test_data.y),
                                          bn=self.bn, model=self.factory.model, test=training.test_data,
                                          note=self.note)
        self.rt.pids["evaluator"] = self.evaluator.proc.pid
        self.measure.started_at = self.now()

    def stop(self, grace: float) -> None:
        """Stop every process we started: ask, wait ``grace`` seconds, then terminate and kill."""
        procs = [p for p in self.procs if p is not None]
        for m in list(self.live):
            self.send(m, (STOP,), lose=False)
        if self.evaluator is not None:
            procs.append(self.evaluator.proc)
            self.evaluator.ask_stop()
        deadline = time.monotonic() + grace
        for p in procs:
            if p.pid is not None:
                p.join(max(0.0, deadline - time.monotonic()))
        for p in procs:
            if p.pid is not None and p.exitcode is None:
                p.terminate()
        for p in procs:
            if p.pid is not None:
                p.join(2.0)
                if p.exitcode is None:
                    p.kill()
                    p.join()
        for c in self.conns + ([self.evaluator.conn] if self.evaluator is not None else []):
            if c is not None:
                c.close()
        self.live.clear()

    # ---- the event loop ------------------------------------------------------------------
    def serve(self, until) -> None:
        """Handle messages and exits until ``until()``."""
        while not until():
            if not self.live:
                raise WorkerError(f"all {self.M} workers died; see the notes above")
            handles = {}
            for m in self.live:
                handles[self.conns[m]] = ("msg", m)
                handles[self.procs[m].sentinel] = ("exit", m)
            ev = self.evaluator
            if ev.alive:
                handles[ev.conn] = ("eval", None)
                handles[ev.proc.sentinel] = ("eval_exit", None)
            for obj in wait(list(handles), timeout=min(0.25, self.rt.worker_timeout / 4)):
                kind, m = handles[obj]
                if until():
                    break
                if kind == "msg" and m in self.live:
                    self.on_message(m)
                elif kind == "exit" and m in self.live:
                    # what it sent before it ended comes first: an ("error", ...) stops the run,
                    # a push whose buffer is complete still counts
                    while m in self.live and self.conns[m].poll():
                        self.on_message(m)
                    self.lose(m, describe_exit(self.procs[m]))
                elif kind == "eval" and ev.alive and ev.conn.poll():   # a checkpoint may have drained it
                    ev.on_ready()
                elif kind == "eval_exit" and ev.alive and not ev.conn.poll():
                    ev.lost(describe_exit(ev.proc))
            if not until():
                self.check_timeouts()
            self.measure.sample(self.now(), self.meters)

    def awaited(self, m: int) -> bool:
        """Whether the server waits for a message from worker m (else m waits for the server)."""
        return m in self.live and m not in self.parked and m not in self.states

    def check_timeouts(self) -> None:
        """Lose every awaited worker that has sent nothing for ``worker_timeout`` seconds
        (``STARTUP_GRACE`` at least before its first message) and is still alive."""
        limit, now = self.rt.worker_timeout, time.monotonic()
        for m in sorted(self.live):
            if not self.awaited(m):   # (lose() below may release or hold the others)
                continue
            allowed = limit if m in self.measure.ready_at else max(limit, STARTUP_GRACE)
            if now - self.heard[m] <= allowed:
                continue
            try:
                if self.conns[m].poll() or self.procs[m].exitcode is not None:
                    continue   # its message or its exit waits to be handled (the server was busy)
            except (OSError, EOFError):
                continue
            self.lose(m, f"no message for {allowed:g} s")

    def on_message(self, m: int) -> None:
        try:
            msg = self.conns[m].recv()
        except (EOFError, ConnectionError):
            self.lose(m, describe_exit(self.procs[m]))
            return
        self.heard[m] = time.monotonic()
        kind = msg[0]
        t0 = time.perf_counter()
        training = self.training
        if kind == PULL:
            if self.final_gathering() and self.algo.pull_before_compute and not self.algo.synchronous:
                self.hold(m)     # between two messages: it starts no new one
                return
            self.server.pull(m, out=self.pull_bufs[m])
            self.pulled_at[m] = self.server.version
            self.send(m, (WEIGHTS, self.server.version, training.lr))
            self.measure.handled("pull", time.perf_counter() - t0)
        elif kind == PUSH:
            self.on_push(m, msg[1], msg[2], msg[3])
            self.measure.handled("push", time.perf_counter() - t0)
        elif kind == READY:
            self.measure.ready_at[m] = self.now()
            if self.saved is not None:
                self.send(m, (RESTORE, to_device(self.saved[m], "cpu")))
            if self.final_gathering():
                self.hold(m)
            elif self.starting is not None:   # a speed profile: every worker starts at its second 0
                self.starting.append(m)
                self.start_together()
            else:
                self.send(m, (OK, training.lr))
        elif kind == STATE:
            self.asked[m] -= 1
            if self.asked[m] == 0:   # the answer to the last request (an earlier one may predate an adopt)
                self.states[m] = msg[1]
                self.maybe_checkpoint()
        elif kind == ERROR:
            raise WorkerError(f"worker {m} failed: {msg[1]}")

    def on_push(self, m: int, samples: int, loss: float, train_acc: float) -> None:
        training, server = self.training, self.server
        now = self.now()
        msg = self.push_bufs[m] if self.on_cpu else self.push_dev[m].copy_(self.push_bufs[m])
        self.measure.pushed(m, self.pulled_at[m], server.version, now)
        server.push(m, msg, training.lr)
        self.samples += samples
        training.after_push(samples, loss, now, evaluator=self.evaluator, train_acc=train_acc)
        if training.done and not training.checkpoint_every:
            return   # no answer: the run is over
        if self.holding is None and (training.done or training.checkpoint_due()):
            # Workers parked in a synchronous round are between messages too.
            self.holding, parked, self.parked = [], self.parked, []
            for p in parked:
                if p in self.live:
                    self.hold(p)
        if self.holding is not None:   # every worker stops after its push, then reports its state
            self.hold(m)
            return
        if not self.algo.synchronous:
            self.send(m, (OK, training.lr))
            return
        self.parked.append(m)
        self.release()

    def release(self) -> None:
        """The parked workers whose message no longer waits in an open synchronous round go on: the round
        closed, or the rule dropped the message (m-ssgd's late straggler, which starts again at once)."""
        parked, self.parked = self.parked, []
        for p in parked:
            if self.server.waiting(p):
                self.parked.append(p)
            elif p in self.live:
                self.send(p, (OK, self.training.lr))

    # ---- workers ---------------------------------------------------------------------------
    def send(self, m: int, msg: tuple, lose: bool = True) -> None:
        try:
            while self.adopt[m]:
                self.conns[m].send((ADOPT, self.adopt[m].pop(0)))
            self.conns[m].send(msg)
            self.heard[m] = time.monotonic()   # what it owes the server next is timed from now
        except (OSError, ValueError):
            if lose:
                self.lose(m, describe_exit(self.procs[m]))

    def start_together(self) -> None:
        """Under a speed profile, the workers wait for each other's start (importing torch takes each a
        different time): once every live one is ready, all start now, the profile's second 0."""
        if not self.live.issubset(self.starting):
            return
        starting, self.starting = self.starting, None
        self.profile_started_s = self.now()
        t0 = time.time() - self._offset   # (a resumed run goes on from its own second)
        for p in starting:
            if p in self.live:
                self.send(p, (OK, self.training.lr, t0))

    def lose(self, m: int, why: str) -> None:
        """Worker m is gone: forget it, give its shard to the survivors, go on."""
        if m not in self.live:
            return
        training, server = self.training, self.server
        self.live.discard(m)
        self.lost += 1
        proc = self.procs[m]
        if proc.exitcode is None:   # its pipe broke but it lingers: it is of no use any more
            proc.kill()
            proc.join(1.0)
        self.parked = [p for p in self.parked if p != m]
        server.remove_worker(m, training.lr)
        if self.holding is not None:   # a gathering checkpoint no longer waits for it
            self.holding = [p for p in self.holding if p != m]
            self.states.pop(m, None)
        survivors = sorted(self.live)
        text = (f"worker {m} lost at epoch {self.samples / self.factory.num_samples:.3f}, update {server.version} ({why}) "
                f"after {self.measure.pushes[m]} pushes")
        if self.pools is not None and survivors:
            pool = self.pools[m]
            for s, part in zip(survivors, pool.tensor_split(len(survivors))):
                self.pools[s] = torch.cat([self.pools[s], part])
                self.adopt[s].append(part.numpy())
                if self.holding is not None and s in self.holding:
                    self.states.pop(s, None)   # held: it adopts now, and reports its state again
                    self.hold(s)
            self.pools[m] = pool[:0]
            text += f"; its shard of {len(pool)} samples now goes to workers {', '.join(map(str, survivors))}"
        self.note(text, workers_lost=self.lost)
        if self.starting is not None and self.live:
            self.start_together()
        if self.algo.synchronous and self.parked:
            self.release()   # (the round may have closed without it)
        self.maybe_checkpoint()
