"""What runs inside the Ray actors: one server shard, one worker.

Both are plain classes (the driver wraps them with ``ray.remote``), so that
importing this module needs no Ray. Weights and messages cross actor
boundaries as numpy arrays, which Ray's object store hands to the receiver
without a copy; state dicts (checkpoints) travel the same way, never as
pickled torch tensors.
"""
from __future__ import annotations

import functools
import os
import pickle
import threading
import time
import warnings

import numpy as np
import torch

from ...core.server import NonFiniteError, ParameterServer
from ...core.worker import FlatModel
from .channel import MAX_BYTES, ChannelClosed, RemoteError, ShardListener, attempt, available
from .ledger import FAILED, GO, LOST, STALE, WAIT, Ledger


def to_numpy(obj):
    """The tensors of a nested structure as numpy arrays (CPU), for the object store."""
    if isinstance(obj, torch.Tensor):
        return obj.detach().cpu().numpy()
    if isinstance(obj, dict):
        return {k: to_numpy(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return type(obj)(to_numpy(v) for v in obj)
    return obj


def to_torch(obj, device="cpu"):
    """The inverse of ``to_numpy`` (copies: arrays from the object store are read-only)."""
    if isinstance(obj, np.ndarray):
        return torch.from_numpy(obj.copy()).to(device)
    if isinstance(obj, dict):
        return {k: to_torch(v, device) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return type(obj)(to_torch(v, device) for v in obj)
    return obj


def _quiet():
    torch.set_num_threads(1)
    # torch.from_numpy on the object store's read-only arrays warns; we never write to them
    warnings.filterwarnings("ignore", message="The given NumPy array is not writable")


class ShardRestarted(RuntimeError):
    """A call reached a shard that Ray restarted and the driver has not loaded yet."""


def _locked(method):
    """Under the shard's lock: its socket's threads (``channel.py``) call it beside Ray's."""
    @functools.wraps(method)
    def locked(self, *args, **kwargs):
        with self.lock:
            return method(self, *args, **kwargs)
    return locked


class ShardActor:
    """One contiguous slice of the weights, served by a ``ParameterServer`` (see ``sharding.py``).

    A shard serves nothing until the driver has loaded its state (``load``): after Ray restarts a
    dead shard, every call but ``ping`` and ``load`` raises ``ShardRestarted``, so that the
    driver notices even when the restart was quicker than its next call, and never mixes a
    fresh shard's zeros with the others' weights.
    """

    def __init__(self, algorithm, numel: int, num_workers: int, on_nonfinite: str):
        # Small arguments only: Ray runs this again when it restarts the actor; the driver then
        # loads the state of the last checkpoint (``load``).
        _quiet()
        self.server = ParameterServer(algorithm, torch.zeros(numel), num_workers, on_nonfinite=on_nonfinite)
        self.loaded = False
        self.ledger = None   # the direct path's (ledger.py), set by ``direct`` after every load
        self.lock = threading.RLock()
        self.listener = None  # the direct path's socket for workers on this machine (channel.py)

    def ping(self) -> tuple[int, bool]:
        """(process id, whether the shard holds the driver's state)."""
        return os.getpid(), self.loaded

    def _serving(self) -> ParameterServer:
        if not self.loaded:
            raise ShardRestarted("this server shard was restarted and holds no state yet")
        return self.server

    @_locked
    def pull(self, worker: int) -> np.ndarray:
        return self._serving().pull(worker).numpy()

    @_locked
    def prepare(self, worker: int, msg: np.ndarray, lr: float, message_finite: bool) -> tuple[bool, bool]:
        return self._serving().prepare(worker, torch.from_numpy(msg), lr, message_finite)

    @_locked
    def commit(self, apply: bool) -> bool:
        return self._serving().commit(apply)

    def prepare_commit(self, worker: int, msg: np.ndarray, lr: float, message_finite: bool) -> tuple:
        """``prepare`` and, when an update is pending, ``commit`` of its own verdict, in one call: what
        the two-phase push amounts to with a single shard (every slice is this one), one round trip
        fewer. Returns ((pending, finite), applied)."""
        pending, finite = self.prepare(worker, msg, lr, message_finite)
        return (pending, finite), (self.commit(finite) if pending else False)

    def prepare_commit_pull(self, worker: int, msg: np.ndarray, lr: float, message_finite: bool,
                            puller: int) -> tuple:
        """``prepare_commit`` and then ``pull(puller)``, in one call (``num_returns=2``): the driver's next
        two calls to this shard when it starts the pushing worker again at once. Returns
        (((pending, finite), applied), puller's weights)."""
        return self.prepare_commit(worker, msg, lr, message_finite), self.pull(puller)

    def commit_pull(self, apply: bool, puller: int) -> tuple:
        """``commit`` and then ``pull(puller)``, in one call (``num_returns=2``): the same with K shards."""
        return self.commit(apply), self.pull(puller)

    @_locked
    def prepare_removal(self, worker: int, lr: float) -> tuple[bool, bool]:
        return self._serving().prepare_removal(worker, lr)

    @_locked
    def state(self, algorithm_state: bool = True) -> dict:
        return to_numpy(self._serving().state_dict(algorithm_state))

    @_locked
    def load(self, state: dict) -> None:
        self.server.load_state_dict(to_torch(state))
        self.loaded = True
        self.ledger = None   # a worker still pushing to the state before gets STALE until ``direct``

    # ---- the direct path (ledger.py): the workers call these themselves --------------------------
    @_locked
    def direct(self, generation: int, count: int, t0: float, drain: bool, socket: bool = True):
        """A new ledger; returns the socket's (address, key) for workers on this machine, or None (not asked
        for, not Linux, or weights larger than ``channel.MAX_BYTES``)."""
        self.ledger = Ledger(self._serving(), generation, count, t0, drain)
        w = self.server.w
        if not (socket and available() and w.numel() * w.element_size() <= MAX_BYTES):
            return None
        if self.listener is None:
            self.listener = ShardListener(self._socket_call, self.lock)
        return self.listener.channel

    def _socket_call(self, op: str, *args) -> tuple:
        return self.push_direct(*args) if op == "push" else self.pull_direct(*args)

    def socket_trouble(self) -> str | None:
        """The first error that kept the socket from accepting a worker (``ShardListener.trouble``), or None."""
        return None if self.listener is None else self.listener.trouble

    @_locked
    def plan(self, *args, **kwargs) -> None:
        self._serving()
        self.ledger.plan(*args, **kwargs)

    @_locked
    def pull_direct(self, worker: int, generation: int) -> tuple:
        self._serving()
        return self.ledger.pull(worker, generation) if self.ledger is not None else (STALE,)

    @_locked
    def push_direct(self, worker: int, generation: int, meta: tuple, msg: np.ndarray, buffers) -> tuple:
        self._serving()
        return self.ledger.push(worker, generation, meta, msg, buffers) if self.ledger is not None else (STALE,)

    @_locked
    def adopt(self, worker: int, indices: np.ndarray) -> None:
        if self.ledger is not None:   # (else the driver sends it again with the next ledger)
            self.ledger.adopt(worker, indices)

    @_locked
    def poll(self, plan: dict | None = None) -> tuple:
        """The ledger's records since the last poll (``Ledger.poll``), after extending its plan, and the
        calls its socket answered since then."""
        self._serving()
        if plan is not None:
            self.ledger.plan(**plan)
        records, snapshots, delivered, pulls, mode = self.ledger.poll()
        served = self.listener.take_served() if self.listener is not None else 0
        return records, to_numpy(snapshots), delivered, pulls, mode, served


class WorkerActor:
    """Worker m: the same ``Worker`` as every runtime, pulling and pushing numpy slices."""

    def __init__(self, m: int, factory, blob: bytes, x: np.ndarray, y: np.ndarray, w0: np.ndarray,
                 bounds: list, device: str, threads: int, state: dict | None = None, pool=None, pacer=None):
        """``pacer``: a ``core.pacing.Pacer``, under a speed profile (each message lasts its drawn time)."""
        _quiet()
        self.pacer = pacer
        torch.set_num_threads(threads)
        dev = torch.device(device)
        model = FlatModel(pickle.loads(blob), dev)
        self.pulled = torch.from_numpy(w0.copy()).to(dev)
        built = factory.portable(torch.from_numpy(x), torch.from_numpy(y))
        self.worker = built.build(m, model=model, w0=self.pulled)
        if state is not None:
            self.worker.load_state_dict(to_torch(state))
        if pool is not None:   # a restarted worker keeps the samples its predecessor had
            self.worker.stream.pool = torch.as_tensor(pool)
        self.bounds = bounds
        self.on_cpu = dev.type == "cpu"
        self.host = self.pulled if self.on_cpu else torch.empty(self.pulled.shape)
        self.computed = None
        self.buffers = [b for b in model.module.buffers() if b.is_floating_point()]
        self.pending = None   # the direct path: (generation, meta, message, statistics) not taken yet (WAIT)
        self.latency = None   # the direct path: seconds of this worker's last push round trip
        self.socket = None    # the direct path: the connection to the shard's socket (channel.py), if any
        self.socket_for = None  # the address it was made for (or tried: None where none was reached)
        self.socket_problem = None  # why the shard's socket, there, did not take this worker (channel.attempt)

    def ping(self) -> int:
        return os.getpid()

    def _load(self, slices) -> None:
        for (a, b), part in zip(self.bounds, slices):
            self.host[a:b].copy_(torch.from_numpy(part))
        if not self.on_cpu:
            self.pulled.copy_(self.host)

    def _message(self, loss: float) -> tuple:
        msg = self.worker.message(self.pulled, self.computed)
        self.computed = None
        lo, hi = torch.aminmax(msg)
        finite = bool(torch.isfinite(lo) and torch.isfinite(hi))
        flat = msg.detach().cpu().numpy()
        meta = (loss, self.worker.samples_per_message, finite, self.worker.train_acc)
        return (meta, *[flat[a:b] for a, b in self.bounds])

    def _compute(self, pulled, lr: float) -> tuple:
        """The worker's computation, lasting its speed profile's drawn time if it has one."""
        if self.pacer is None:
            return self.worker.compute(pulled, lr)
        return self.pacer.run(self.worker.compute, pulled, lr)

    def start_profile(self, t0: float) -> None:
        """The speed profile's second 0 (``time.time()``), the same for every worker of the run."""
        self.pacer.t0 = t0

    def pacing(self) -> dict | None:
        """This worker's ``Pacer.figures()`` (None without a profile)."""
        return None if self.pacer is None else self.pacer.figures()

    def step(self, lr: float, *slices) -> tuple:
        """Pull (the slices), compute, and return (meta, *message slices); meta = (loss, samples, finite,
        train_acc)."""
        self._load(slices)
        loss, self.computed = self._compute(self.pulled, lr)
        return self._message(loss)

    def compute(self, lr: float) -> float:
        """Elastic rules: the local steps first; ``finish`` gets the centre afterwards."""
        self.loss, self.computed = self._compute(None, lr)
        return self.loss

    def finish(self, *slices) -> tuple:
        self._load(slices)
        return self._message(self.loss)

    def adopt(self, indices: np.ndarray) -> None:
        self.worker.stream.extend(torch.from_numpy(indices.copy()))

    def _caller(self, shard, channel):
        """``call(op, *args)`` to the shard: through its socket where this worker reaches it, else a Ray call."""
        if channel is not None and self.socket_for != channel[0]:
            if self.socket is not None:
                self.socket.close()
            (self.socket, self.socket_problem), self.socket_for = attempt(channel), channel[0]
        if channel is not None and self.socket is not None:
            return self.socket.call
        import ray
        methods = {"push": shard.push_direct, "pull": shard.pull_direct}
        return lambda op, *args: ray.get(methods[op].remote(*args))

    def run(self, shard, generation: int, channel: tuple | None = None) -> tuple:
        """The direct path (ledger.py): push to and pull from ``shard`` until it says otherwise, one round
        trip per message (the reply to a push is the next weights), through the shard's socket (``channel``,
        channel.py) where it reaches it, else as Ray calls. Returns (status, text): the ledger's HOLD, STOP,
        WAIT or STALE; LOST when the shard died or was restarted; FAILED with the server's NonFiniteError
        (``on_nonfinite`` "stop")."""
        import ray
        m = self.worker.id
        if self.pending is not None and self.pending[0] != generation:
            self.pending = None   # computed on the weights of a shard since restored: dropped, as in flight
        call = self._caller(shard, channel)
        try:
            reply = call("push", m, *self.pending) if self.pending is not None else call("pull", m, generation)
            while reply[0] == GO:
                self.pending = None
                _, lr, weights, adopted = reply
                for part in adopted:
                    self.adopt(part)
                self._load([weights])
                loss, self.computed = self._compute(self.pulled, lr)
                meta, msg = self._message(loss)
                self.pending = (generation, (*meta, self.latency), msg,
                                [b.detach().cpu().numpy() for b in self.buffers] if self.buffers else None)
                t = time.perf_counter()
                reply = call("push", m, *self.pending)
                self.latency = time.perf_counter() - t
        # Through the socket, as a Ray call's RayTaskError below (a shard that Ray restarted opens its socket
        # only once it is loaded again, so ShardRestarted never comes this way)
        except RemoteError as e:
            self.pending = None
            if e.kind == NonFiniteError.__name__:
                return FAILED, str(e)
            raise RuntimeError(f"the server shard failed: {e.kind}: {e}") from None
        except ChannelClosed:   # (the shard's process died: as RayActorError below)
            self.socket.close()
            self.pending, self.socket = None, None
            return LOST, ""
        except ray.exceptions.RayTaskError as e:
            self.pending = None
            if isinstance(e.cause, NonFiniteError):
                return FAILED, str(e.cause)
            if isinstance(e.cause, ShardRestarted):
                return LOST, ""
            raise
        except ray.exceptions.RayActorError:
            self.pending = None   # (computed on weights that the restored server no longer has)
            return LOST, ""
        if not (reply[0] == WAIT and not reply[1]):
            self.pending = None   # taken (or stale: computed on a server that is gone)
        return reply[0], ""

    def socket_status(self) -> str | None:
        """Why this worker makes Ray calls though the shard's socket is on its machine, or None."""
        return self.socket_problem

    def state(self) -> dict:
        return to_numpy(self.worker.state_dict())

    def statistics(self) -> list[np.ndarray]:
        """The model's floating-point buffers (BatchNorm running statistics)."""
        return [b.detach().cpu().numpy() for b in self.buffers]
