"""Real asynchronous training on one machine (``--runtime local``).

The main process is the parameter server: it owns the ``TrainingRun`` and its
``ParameterServer`` and runs a single-threaded event loop over one pipe per
worker process. The M workers run the simulator's worker loop (``Worker``,
``FlatModel``, ``BatchStream``, built by ``TrainingRun.worker_spec``) at
their own pace; only the transport is new:

- weights move through shared memory: each worker has a pull buffer, which the
  server fills with one memory copy of its weights, and a push buffer, into
  which the worker copies its message; the pipes carry only tiny tuples;
- the training and test sets are in shared memory, mapped by every process;
- test-set evaluation runs in an evaluator process on a snapshot of the
  weights, so it never stalls an update;
- a worker that dies is removed from the server (synchronous rounds stop
  waiting for it), its shard goes to the survivors, and the run goes on.

Protocol. Worker -> server, and the server's answer:

    ("ready",)               -> ("ok", lr)                 the worker is built
    ("pull",)                -> ("w", version, lr)         the weights are in the pull buffer
    ("push", samples, loss)  -> ("ok", lr)                 the message in the push buffer was applied
                                                           (synchronous rules: the round closed)
    ("error", text)             a Python exception in the worker: the run stops with it

Before any answer the server may send ("adopt", indices): samples of a lost
worker's shard; instead of one, ("stop",).
"""
from __future__ import annotations

import copy
import csv
import ctypes
import os
import pickle
import signal
import sys
import time
import traceback
from collections import deque
from dataclasses import dataclass
from multiprocessing.connection import wait
from pathlib import Path

import torch
import torch.multiprocessing as mp
from torch import Tensor, nn

from ..server import to_device
from ..worker import FlatModel

START_METHODS = ("forkserver", "spawn")
_RING = 4096          # latencies kept per worker and kind (the most recent ones)
_PULL, _PUSH = 0, 1   # rows of a worker's latency ring


class WorkerError(RuntimeError):
    """A worker or the evaluator raised; the run was stopped."""


def default_threads(num_workers: int) -> int:
    return max(1, _cores() // num_workers)


def _cores() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:   # not Linux
        return os.cpu_count() or 1


@dataclass
class LocalRuntime:
    """M worker processes and a parameter server on this machine.

    ``threads_per_worker`` (default ``max(1, cores // M)``) is each worker's
    ``torch.set_num_threads``; ``record_trace`` a CSV file for the order of
    pushes (``worker,pulled,applied,wall_s``), which ``--runtime sim --delay
    trace:FILE`` replays. After a run, ``stats`` holds the measured transport
    figures and ``pids`` the processes it used.
    """
    threads_per_worker: int | None = None
    record_trace: str | os.PathLike | None = None
    start_method: str | None = None    # default: forkserver where there is one, else spawn
    stop_timeout: float = 2.0          # seconds a worker gets to finish its message at the end

    def __post_init__(self):
        if self.threads_per_worker is not None and (not isinstance(self.threads_per_worker, int)
                                                    or self.threads_per_worker < 1):
            raise ValueError(f"threads_per_worker must be a positive integer, got {self.threads_per_worker!r}")
        if self.start_method is not None and self.start_method not in START_METHODS:
            raise ValueError(f"start_method must be one of {', '.join(START_METHODS)}, got {self.start_method!r} "
                             "('fork' would copy the server's thread pools and CUDA state into the workers)")
        self.stats: dict = {}
        self.pids: dict = {"workers": [], "evaluator": None}

    def describe(self) -> dict:
        return {"name": "local", "threads_per_worker": self.threads_per_worker, "cores": _cores(),
                "start_method": self.start_method or _default_start_method(),
                "record_trace": str(self.record_trace) if self.record_trace is not None else None}

    def run(self, run, seed: int = 0, resume: dict | None = None) -> None:
        """Drive ``run`` to its sample budget with real worker processes."""
        if resume is not None and resume.get("kind") != "local":
            raise ValueError("the checkpoint was made by another runtime; resume it with that runtime")
        _Session(self, run, resumed=resume is not None).execute()


# ---- processes ------------------------------------------------------------------
# Workers are started with 'forkserver' where it exists (Linux, macOS), else
# 'spawn'. Both start from a clean interpreter: 'fork' from the server would
# copy its OpenMP thread pool (libgomp is not fork-safe: a child's first
# parallel op can hang) and any CUDA context (unusable after fork). The fork
# server imports torch and stalegrad once and never runs a torch op, so a
# worker forked from it starts in milliseconds, where 'spawn' spends ~2 s per
# process importing torch.
def _default_start_method() -> str:
    return "forkserver" if "forkserver" in mp.get_all_start_methods() else "spawn"


def _context(method: str | None):
    method = method or _default_start_method()
    ctx = mp.get_context(method)
    if method == "forkserver":
        ctx.set_forkserver_preload([__name__])
    return ctx


def _become_child(threads: int) -> None:
    # Ctrl-C in a terminal reaches the whole process group: the server alone
    # decides how to stop, and stops the workers itself.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    if sys.platform.startswith("linux"):   # die with our parent (the server, or the fork server, which dies with it)
        try:
            ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)   # PR_SET_PDEATHSIG
        except (OSError, AttributeError):
            pass
    torch.set_num_threads(threads)


def _shared(t: Tensor) -> Tensor:
    """A CPU shared-memory copy of ``t`` (its storage is passed to children as a file descriptor)."""
    t = t.detach()
    if t.device.type == "cpu" and t.is_shared() and t.is_contiguous():
        return t
    return torch.empty(t.shape, dtype=t.dtype).share_memory_().copy_(t)


def _zeros(*shape, dtype=torch.float32) -> Tensor:
    return torch.zeros(*shape, dtype=dtype).share_memory_()


def _module_blob(module: nn.Module) -> bytes:
    """The model, pickled for the worker processes (their FlatModel flattens it again)."""
    clone = copy.deepcopy(module).cpu()
    for p in clone.parameters():   # own storages: the run's parameters are views of one flat vector
        p.data = p.data.clone()
        p.grad = None
    try:
        return pickle.dumps(clone)
    except Exception as e:
        raise ValueError(f"the local runtime sends the model to its worker processes by pickling it, and "
                         f"{type(module).__name__} cannot be pickled ({e}); define its class at module level") from None


class _Buffers:
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


class _Stop(Exception):
    pass


def _worker_device(device: str, m: int) -> torch.device:
    """cuda without an index spreads the workers over the GPUs."""
    if device == "cuda" and torch.cuda.device_count() > 1:
        return torch.device("cuda", m % torch.cuda.device_count())
    return torch.device(device)


def _worker_main(m, spec, blob, device, threads, x, y, pull_buf, push_buf, bn_buf, meter, conn):
    """Worker m: the simulator's loop, with pulls and pushes through shared memory."""
    _become_child(threads)
    try:
        dev = _worker_device(device, m)
        on_cpu = dev.type == "cpu"
        model = FlatModel(pickle.loads(blob), dev)
        pulled = pull_buf if on_cpu else pull_buf.to(dev)
        worker = spec.build(m, model, x.to(dev), y.to(dev), pulled)
        buffers = _Buffers(model.module)
        algo = worker.algorithm
        steps = 0
        grad_fn = worker.grad_fn

        def counted(w):   # local steps, for the throughput the server measures
            nonlocal steps
            out = grad_fn(w)
            steps += 1
            meter[0] = steps
            return out
        worker.grad_fn = counted

        def ask(msg):
            conn.send(msg)
            while True:
                reply = conn.recv()
                if reply[0] == "adopt":
                    worker.stream.extend(torch.from_numpy(reply[1]))
                elif reply[0] == "state":     # a checkpoint: we are between two messages
                    conn.send(("state", {"state": worker.state, "pool": worker.stream.pool,
                                         "stream": worker.stream.state_dict(), "last_loss": worker.last_loss}))
                elif reply[0] == "restore":   # resuming: the state a checkpoint saved
                    st = reply[1]
                    worker.state = to_device(st["state"], dev)
                    worker.stream.pool = st["pool"]
                    worker.stream.load_state_dict(st["stream"])
                    worker.last_loss = float(st["last_loss"])
                elif reply[0] == "stop":
                    raise _Stop
                else:
                    return reply

        def pull() -> float:
            t0 = time.perf_counter()
            _, _, lr = ask(("pull",))
            if not on_cpu:
                pulled.copy_(pull_buf)
            n = int(meter[1])
            meter[3 + _PULL * _RING + n % _RING] = time.perf_counter() - t0
            meter[1] = n + 1
            return lr

        lr = ask(("ready",))[1]
        while True:
            if algo.pull_before_compute:
                lr = pull()
            computed = worker.compute(pulled, lr)
            if not algo.pull_before_compute:   # elastic averaging: the centre, after the local steps
                lr = pull()
            msg = worker.message(pulled, computed)
            t0 = time.perf_counter()
            push_buf.copy_(msg)
            if buffers.numel:
                buffers.write(bn_buf)
            lr = ask(("push", worker.samples_per_message, worker.last_loss))[1]
            n = int(meter[2])
            meter[3 + _PUSH * _RING + n % _RING] = time.perf_counter() - t0
            meter[2] = n + 1
    except (_Stop, EOFError, ConnectionError):
        pass   # told to stop, or the server is gone
    except BaseException as e:
        text = "".join(traceback.format_exception_only(type(e), e)).strip()
        print(f"stalegrad: worker {m} failed:\n{traceback.format_exc()}", file=sys.stderr, flush=True)
        try:
            conn.send(("error", text))
        except (OSError, ValueError):
            pass
        sys.exit(1)
    finally:
        conn.close()


def _evaluator_main(blob, device, threads, x, y, snap, bn_snap, conn):
    """Evaluate weight snapshots on the test set, one at a time, in order."""
    _become_child(threads)
    try:
        dev = torch.device(device)
        model = FlatModel(pickle.loads(blob), dev)
        buffers = _Buffers(model.module)
        x, y = x.to(dev), y.to(dev)
        w = snap if dev.type == "cpu" else torch.empty(snap.shape, device=dev)
        while conn.recv()[0] == "eval":
            if dev.type != "cpu":
                w.copy_(snap)
            if buffers.numel:
                buffers.read(bn_snap)
            conn.send(("result", *model.evaluate(w, x, y)))
    except (EOFError, ConnectionError):
        pass
    except BaseException as e:
        print(f"stalegrad: evaluator failed:\n{traceback.format_exc()}", file=sys.stderr, flush=True)
        try:
            conn.send(("error", "".join(traceback.format_exception_only(type(e), e)).strip()))
        except (OSError, ValueError):
            pass
        sys.exit(1)
    finally:
        conn.close()


# ---- the server side --------------------------------------------------------------
class _Evaluator:
    """What ``TrainingRun.evaluate`` hands snapshots to: one evaluator process, FIFO."""

    def __init__(self, session, ctx, blob, device, threads, test_x, test_y):
        self.session, self.run = session, session.run
        numel = session.run.server.w.numel()
        self.snap = _zeros(numel)
        self.bn_snap = _zeros(max(1, session.bn.numel()))
        self.conn, child = ctx.Pipe()
        self.proc = ctx.Process(target=_evaluator_main, name="stalegrad-evaluator", daemon=True,
                                args=(blob, device, threads, test_x, test_y, self.snap, self.bn_snap, child))
        self.proc.start()
        child.close()
        self.current: dict | None = None   # the record being evaluated
        self.queue: deque = deque()        # (record, weights, statistics) waiting for the process
        self.alive = True

    def submit(self, w: Tensor, record: dict) -> None:
        if self.current is None:
            self._send(record, w, self.session.bn)
        else:
            self.queue.append((record, w.detach().clone(), self.session.bn.clone()))

    def _send(self, record, w, bn) -> None:
        self.snap.copy_(w)
        self.bn_snap.copy_(bn)
        self.current = record
        if self.alive:
            try:
                self.conn.send(("eval",))
                return
            except (OSError, ValueError):
                self.lost("its pipe broke")
        self._evaluate_here()

    def on_ready(self) -> None:
        try:
            msg = self.conn.recv()
        except (EOFError, ConnectionError):
            self.lost(_describe_exit(self.proc))
            return
        if msg[0] == "error":
            raise WorkerError(f"the evaluator failed: {msg[1]}")
        record, self.current = self.current, None
        self.run.record_evaluation(record, msg[1], msg[2])
        if self.queue:
            self._send(*self.queue.popleft())

    def lost(self, why: str) -> None:
        """The evaluator died: evaluate in the server from now on (it stalls, but nothing is lost)."""
        if not self.alive:
            return
        self.alive = False
        self.session.note(f"the evaluator process died ({why}); evaluating in the server from now on")
        if self.current is not None:
            self._evaluate_here()

    def _evaluate_here(self) -> None:
        run = self.run
        while self.current is not None:
            if self.session.bn_server.numel:
                self.session.bn_server.read(self.bn_snap)
            loss, acc = run.model.evaluate(self.snap, run.test_x, run.test_y)
            record, self.current = self.current, None
            run.record_evaluation(record, loss, acc)
            if self.queue:
                record, w, bn = self.queue.popleft()
                self.snap.copy_(w)
                self.bn_snap.copy_(bn)
                self.current = record

    def drain(self) -> None:
        """Wait for every submitted evaluation."""
        while self.current is not None:
            ready = wait([self.conn, self.proc.sentinel], timeout=1.0)
            if self.conn in ready:
                self.on_ready()
            elif self.proc.sentinel in ready:
                self.lost(_describe_exit(self.proc))


def _describe_exit(proc) -> str:
    proc.join(timeout=0.5)
    code = proc.exitcode
    if code is None:
        return "its pipe closed"
    if code < 0:
        try:
            return f"killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"killed by signal {-code}"
    return f"exit code {code}"


class _Session:
    """One run of the local runtime: start, serve, stop."""

    def __init__(self, runtime: LocalRuntime, run, resumed: bool = False):
        self.rt, self.run, self.server = runtime, run, run.server
        self.resumed = resumed
        self.holding: list[int] | None = None    # a checkpoint is gathering: workers held after their push
        self.states: dict[int, dict] = {}
        self.algo = run.algorithm
        self.M = run.num_workers
        self.threads = runtime.threads_per_worker or default_threads(self.M)
        self.on_cpu = self.server.w.device.type == "cpu"
        self.procs: list = []
        self.conns: list = []
        self.live: set[int] = set()
        self.parked: list[int] = []
        self.evaluator: _Evaluator | None = None
        self.trace: list[tuple] | None = [] if runtime.record_trace is not None else None
        self.lost = 0
        self.pushes = [0] * self.M
        self.ready_at: dict[int, float] = {}
        self.timeline: list[tuple[float, int]] = []
        self.handling: dict[str, list[float]] = {"pull": [], "push": []}   # server seconds per request
        self._last_sample = 0.0
        self.adopt: dict[int, list] = {m: [] for m in range(self.M)}
        self.pools = [w.stream.pool for w in run.workers] if run.partition == "shard" else None
        self.bn_server = _Buffers(run.model.module)
        self.bn = _zeros(max(1, self.bn_server.numel))
        if self.bn_server.numel:
            self.bn_server.write(self.bn)

    def note(self, text: str) -> None:
        self.run.notes.append(text)
        print(f"stalegrad: {text}", file=sys.stderr, flush=True)

    # ---- lifecycle -------------------------------------------------------------
    def execute(self) -> None:
        run = self.run
        threads = torch.get_num_threads()
        torch.set_num_threads(1)   # the server's vector updates are memory-bound; leave the cores to the workers
        ok = False
        try:
            self.start()
            self.serve()
            self.timeline.append((run.wall_s(), int(self.meters[:, 0].sum())))   # at the budget: the end
            if self.evaluator is not None:
                self.evaluator.drain()
            ok = True
        finally:
            run.evaluator = None
            try:
                self.stop(grace=self.rt.stop_timeout if ok else 0.5)
            finally:
                torch.set_num_threads(threads)
                self.write_trace()
        if self.bn_server.numel:   # the workers' running statistics, for the final evaluation and model.pt
            self.bn_server.read(self.bn)
        self.collect_stats()

    def start(self) -> None:
        run, M = self.run, self.M
        ctx = _context(self.rt.start_method)
        w = self.server.w.detach()
        numel = w.numel()
        blob = _module_blob(run.model.module)
        x, y = _shared(run.train_data.x), _shared(run.train_data.y)
        tx, ty = _shared(run.test_data.x), _shared(run.test_data.y)
        w_cpu = w.cpu()
        self.pull_bufs = [_zeros(numel).copy_(w_cpu) for _ in range(M)]
        self.push_bufs = [_zeros(numel) for _ in range(M)]
        self.push_dev = None if self.on_cpu else [torch.empty_like(w) for _ in range(M)]
        self.meters = _zeros(M, 3 + 2 * _RING, dtype=torch.float64)
        self.numel = numel
        spec = run.worker_spec
        self.rt.pids = {"workers": [], "evaluator": None}
        for m in range(M):
            parent, child = ctx.Pipe()
            proc = ctx.Process(target=_worker_main, name=f"stalegrad-worker-{m}", daemon=True,
                               args=(m, spec, blob, run.device, self.threads, x, y, self.pull_bufs[m],
                                     self.push_bufs[m], self.bn, self.meters[m], child))
            self.procs.append(proc)
            self.conns.append(parent)
            proc.start()
            child.close()
            self.live.add(m)
            self.rt.pids["workers"].append(proc.pid)
        self.evaluator = _Evaluator(self, ctx, blob, run.device, self.threads, tx, ty)
        self.rt.pids["evaluator"] = self.evaluator.proc.pid
        run.evaluator = self.evaluator
        self.started = run.wall_s()

    def stop(self, grace: float) -> None:
        """Stop every process we started: ask, wait ``grace`` seconds, then terminate and kill."""
        procs = list(self.procs)
        for m in list(self.live):
            self.send(m, ("stop",), lose=False)
        if self.evaluator is not None:
            procs.append(self.evaluator.proc)
            try:
                self.evaluator.conn.send(("stop",))
            except (OSError, ValueError):
                pass
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
            c.close()
        self.live.clear()

    # ---- the event loop ----------------------------------------------------------
    def serve(self) -> None:
        run = self.run
        while not run.done:
            if not self.live:
                raise WorkerError(f"all {self.M} workers died; see the notes above")
            handles = {}
            for m in self.live:
                handles[self.conns[m]] = ("msg", m)
                handles[self.procs[m].sentinel] = ("exit", m)
            ev = self.evaluator
            if ev is not None and ev.alive:
                handles[ev.conn] = ("eval", None)
                handles[ev.proc.sentinel] = ("eval_exit", None)
            for obj in wait(list(handles), timeout=0.25):
                kind, m = handles[obj]
                if run.done:
                    break
                if kind == "msg" and m in self.live:
                    self.on_message(m)
                elif kind == "exit" and m in self.live:
                    # what it sent before it ended comes first: an ("error", ...) stops the run,
                    # a push whose buffer is complete still counts
                    while m in self.live and self.conns[m].poll():
                        self.on_message(m)
                    self.lose(m, _describe_exit(self.procs[m]))
                elif kind == "eval" and ev.alive and ev.conn.poll():   # a checkpoint may have drained it
                    ev.on_ready()
                elif kind == "eval_exit" and ev.alive and not ev.conn.poll():
                    ev.lost(_describe_exit(ev.proc))
            self.sample()

    def on_message(self, m: int) -> None:
        try:
            msg = self.conns[m].recv()
        except (EOFError, ConnectionError):
            self.lose(m, _describe_exit(self.procs[m]))
            return
        kind = msg[0]
        t0 = time.perf_counter()
        if kind == "pull":
            self.server.pull(m, out=self.pull_bufs[m])
            self.send(m, ("w", self.server.version, self.run.lr))
            self.handling["pull"].append(time.perf_counter() - t0)
        elif kind == "push":
            self.on_push(m, msg[1], msg[2])
            self.handling["push"].append(time.perf_counter() - t0)
        elif kind == "ready":
            self.ready_at[m] = self.run.wall_s()
            if self.resumed:
                w = self.run.workers[m]
                self.send(m, ("restore", {"state": w.state, "pool": w.stream.pool, "stream": w.stream.state_dict(),
                                          "last_loss": w.last_loss}))
            self.send(m, ("ok", self.run.lr))
        elif kind == "state":
            self.states[m] = msg[1]
            self.maybe_checkpoint()
        elif kind == "error":
            raise WorkerError(f"worker {m} failed: {msg[1]}")

    def on_push(self, m: int, samples: int, loss: float) -> None:
        run, server = self.run, self.server
        now = run.wall_s()
        msg = self.push_bufs[m] if self.on_cpu else self.push_dev[m].copy_(self.push_bufs[m])
        if self.trace is not None:
            self.trace.append((m, server.pulled_version[m], server.version, now))
        server.push(m, msg, run.lr)
        self.pushes[m] += 1
        run.after_push(samples, loss, now)
        if run.done:
            return
        if self.holding is None and run.checkpoint_due():
            # Workers parked in a synchronous round are between messages too.
            self.holding, parked, self.parked = [], self.parked, []
            for p in parked:
                if p in self.live:
                    self.holding.append(p)
                    self.send(p, ("state",))
        if self.holding is not None:       # every worker stops after its push, then reports its state
            self.holding.append(m)
            self.send(m, ("state",))
            return
        if not self.algo.synchronous:
            self.send(m, ("ok", run.lr))
            return
        self.parked.append(m)
        if not server.round_open:
            self.release()

    def maybe_checkpoint(self) -> None:
        """Once every live worker is held between two messages, save, then let them go on."""
        if self.holding is None or not self.live.issubset(self.states):
            return
        run = self.run
        for m, st in self.states.items():
            w = run.workers[m]
            w.state, w.stream.pool, w.last_loss = st["state"], st["pool"], float(st["last_loss"])
            w.stream.load_state_dict(st["stream"])
        if self.evaluator is not None:
            self.evaluator.drain()          # the metrics so far belong in the checkpoint
        run.save_checkpoint({"kind": "local"})
        held, self.holding, self.states = self.holding, None, {}
        if self.algo.synchronous:           # a round is open only if a worker died in it
            self.parked.extend(held)
            if not self.server.round_open:
                self.release()
        else:
            for p in held:
                if p in self.live:
                    self.send(p, ("ok", run.lr))

    def release(self) -> None:
        """A synchronous round closed: the parked workers go on."""
        parked, self.parked = self.parked, []
        for p in parked:
            if p in self.live:
                self.send(p, ("ok", self.run.lr))

    def send(self, m: int, msg: tuple, lose: bool = True) -> None:
        try:
            while self.adopt[m]:
                self.conns[m].send(("adopt", self.adopt[m].pop(0)))
            self.conns[m].send(msg)
        except (OSError, ValueError):
            if lose:
                self.lose(m, _describe_exit(self.procs[m]))

    def lose(self, m: int, why: str) -> None:
        """Worker m is gone: forget it, give its shard to the survivors, go on."""
        if m not in self.live:
            return
        run, server = self.run, self.server
        self.live.discard(m)
        self.lost += 1
        proc = self.procs[m]
        if proc.exitcode is None:   # its pipe broke but it lingers: it is of no use any more
            proc.kill()
            proc.join(1.0)
        self.parked = [p for p in self.parked if p != m]
        server.remove_worker(m, run.lr)
        if self.holding is not None:   # a gathering checkpoint no longer waits for it
            self.holding = [p for p in self.holding if p != m]
            self.states.pop(m, None)
        survivors = sorted(self.live)
        text = (f"worker {m} lost at epoch {run.epoch:.3f}, update {server.version} ({why}) "
                f"after {self.pushes[m]} pushes")
        if self.pools is not None and survivors:
            pool = self.pools[m]
            for s, part in zip(survivors, pool.tensor_split(len(survivors))):
                self.pools[s] = torch.cat([self.pools[s], part])
                self.adopt[s].append(part.numpy())
            self.pools[m] = pool[:0]
            text += f"; its shard of {len(pool)} samples now goes to workers {', '.join(map(str, survivors))}"
        self.note(text)
        if self.algo.synchronous and not server.round_open and self.parked:
            self.release()
        self.maybe_checkpoint()

    # ---- measurements -----------------------------------------------------------
    def sample(self) -> None:
        now = self.run.wall_s()
        if now - self._last_sample >= 0.2:
            self._last_sample = now
            self.timeline.append((now, int(self.meters[:, 0].sum())))

    def collect_stats(self) -> None:
        meters = self.meters
        pulls, pushes = [], []
        for m in range(self.M):
            n_pull, n_push = int(meters[m, 1]), int(meters[m, 2])
            pulls += meters[m, 3 + _PULL * _RING:3 + _PULL * _RING + min(n_pull, _RING)].tolist()
            pushes += meters[m, 3 + _PUSH * _RING:3 + _PUSH * _RING + min(n_push, _RING)].tolist()
        transport = {
            "pull_ms_median": _quantile_ms(pulls, 0.5), "pull_ms_p90": _quantile_ms(pulls, 0.9),
            "push_ms_median": _quantile_ms(pushes, 0.5), "push_ms_p90": _quantile_ms(pushes, 0.9),
            "weight_bytes_per_message": 2 * 4 * self.numel,   # one pull and one push of float32 weights
        }
        self.rt.stats = {
            "transport": transport, "pull_s": pulls, "push_s": pushes,
            "local_steps": [int(v) for v in meters[:, 0].tolist()], "pushes": list(self.pushes),
            "timeline": list(self.timeline), "ready_at": dict(self.ready_at), "started_at": self.started,
            "server_pull_ms_median": _quantile_ms(self.handling["pull"], 0.5),
            "server_push_ms_median": _quantile_ms(self.handling["push"], 0.5),
            "server_busy_s": sum(self.handling["pull"]) + sum(self.handling["push"]),
            "threads_per_worker": self.threads, "workers_lost": self.lost,
        }
        self.run.summary_extra.update({"workers_lost": self.lost, "threads_per_worker": self.threads,
                                       "transport": transport})

    def write_trace(self) -> None:
        if self.trace is None:
            return
        path = Path(self.rt.record_trace)
        tmp = path.with_name(f".{path.name}.tmp")
        with open(tmp, "w", newline="") as f:
            out = csv.writer(f)
            out.writerow(["worker", "pulled", "applied", "wall_s"])
            for m, pulled, applied, t in self.trace:
                out.writerow([m, pulled, applied, f"{t:.6f}"])
        os.replace(tmp, path)


def _quantile_ms(values: list[float], q: float) -> float | None:
    if not values:
        return None
    s = sorted(values)
    return round(1000 * s[min(len(s) - 1, int(q * len(s)))], 4)
