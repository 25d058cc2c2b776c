"""The parameter server: state only, no transport.

It holds the flat weights, a version counter (one per applied update), the
version each worker last pulled, the per-algorithm state (per-worker snapshots,
MeanSquare, momentum buffers), and the staleness log. Every runtime, simulated
or real, drives the same two calls: ``pull(worker)`` and ``push(worker, msg)``.
"""
from __future__ import annotations

import math
import struct
from array import array

import torch
from torch import Tensor

from . import server_checks as check
from ..algorithms import Algorithm, fused
from ..algorithms.base import HELD
from ..errors import ConfigError, RunError, UsageError
from .options import ON_NONFINITE
from .staleness import StalenessLog
from .transaction import Pending, Undo
from .state_checks import server_damage

# Element-wise rules (see algorithms.base.elementwise) on vectors of at least
# CHUNK_ABOVE elements run on the CPU in chunks of CHUNK elements (1 MiB of
# float32): the intermediate results of a chunk, and its NaN/Inf check, stay
# in cache, where a whole-vector rule makes one pass over main memory per
# tensor operation (and allocates its temporaries whole). Below CHUNK_ABOVE
# (16 MiB) the vectors share the L3 cache anyway and one call per operation is
# cheaper. Measured by benchmarks/archive/chunk_sweep.py, see docs/performance.md.
CHUNK = 1 << 18
CHUNK_ABOVE = 1 << 22


class NonFiniteError(RunError):
    """A NaN or Inf message or update under ``on_nonfinite='stop'``."""


class ParameterServer:
    """The state every runtime drives through ``pull(worker)`` and ``push(worker, msg, lr)``: the flat weights ``w``,
    the ``version`` (one per applied update), each worker's pulled version (tau counts the versions since), the rule's
    state and the ``staleness`` log. ``w0`` is copied. ``on_nonfinite``: a NaN/Inf message or update is counted and
    undone whole ("skip") or raises ``NonFiniteError`` ("stop"). ``kernels``: "numba" (``algorithms.fused``), "torch"
    or "auto"; default: STALEGRAD_KERNELS, else "auto" (numba if installed and the weights are float32 on the CPU)."""
    def __init__(self, algorithm: Algorithm, w0: Tensor, num_workers: int, *, on_nonfinite: str = "skip",
                 kernels: str | None = None):
        if on_nonfinite not in ON_NONFINITE:
            raise ConfigError("on_nonfinite", f"must be one of {', '.join(ON_NONFINITE)}, got {on_nonfinite!r}")
        if isinstance(num_workers, bool) or not isinstance(num_workers, int) or num_workers < 1:
            raise UsageError(f"ParameterServer: num_workers must be an integer >= 1, got {num_workers!r}")
        self.kernels = fused.choose(w0.device.type, w0.dtype == torch.float32, kernels)
        self.algorithm = algorithm
        self.num_workers = num_workers
        self.on_nonfinite = on_nonfinite
        self.w = w0.detach().clone().contiguous()   # never replaced, only written in place
        # what every message must match (the boundary checks of pull and push)
        self._shape, self._dtype, self._device = self.w.shape, self.w.dtype, self.w.device
        self._on_cpu = self._device.type == "cpu"   # msg.is_cpu is cheaper than comparing devices
        self.version = 0
        self.pulled_version = [0] * num_workers
        self.state = algorithm.server_init(self.w, num_workers)
        self.live = set(range(num_workers))
        self.round: dict[int, Tensor | None] = {}   # synchronous algorithms: this round's messages
        self.staleness = StalenessLog(num_workers)
        self.nonfinite_skipped = 0
        self.last_dropped = False   # whether the last push was refused by the rule (Algorithm.admits)
        # the rule's admission, or None when it takes every message (one call fewer on the hot path)
        self._admits = None if type(algorithm).admits is Algorithm.admits else algorithm.admits
        self.held: list[tuple[int, int]] = []   # (worker, tau) of messages a rule took in, logged with its step
        self._delta = torch.empty_like(self.w)
        self._undo = Undo(algorithm, self.w)   # what an update changes, put back if it is not finite
        self._pending: Pending | None = None   # the update between prepare and commit

    # ---- the two calls every runtime makes ---------------------------------
    def pull(self, worker: int, out: Tensor | None = None) -> Tensor:
        """The weights ``worker`` computes at, copied into ``out`` if given: the current weights, or
        what the algorithm's ``on_pull`` sends instead. A worker id outside 0..M-1, or an ``out`` not
        shaped like the weights, is a UsageError (nothing changes)."""
        if worker.__class__ is not int or not 0 <= worker < self.num_workers:
            worker = check.worker_id(worker, self.num_workers, "ParameterServer.pull")
        if out is not None and not (isinstance(out, Tensor) and out.shape == self._shape):
            check.message(out, self.w, "ParameterServer.pull", "out")
        self.pulled_version[worker] = self.version
        sent = self.algorithm.on_pull(self.state, worker, self.w)   # DANA sends a look-ahead, not w
        sent = self.w if sent is None else sent
        return sent.clone() if out is None else out.copy_(sent)

    def push(self, worker: int, msg: Tensor, lr: float) -> bool:
        """Apply (or, for synchronous algorithms, buffer) one message.

        Returns True when the weights changed. A message or an update with a
        NaN/Inf is never applied: it is counted, or raises NonFiniteError, and the
        rule's state is as it was (``core/transaction.py``). A wrong call
        (``prepare``'s checks) is a UsageError, and nothing changes.
        """
        self.prepare(worker, msg, lr)
        return self.commit()

    def remove_worker(self, worker: int, lr: float = 0.0) -> bool:
        """A worker is gone: synchronous rounds stop waiting for it (which may close one). A worker id
        outside 0..M-1 is a UsageError."""
        self.prepare_removal(worker, lr)
        return self.commit()

    # ---- the same in two phases, for a server split into shards --------------------
    # A push is prepare (compute the update, check it) then commit (add it, count the
    # version). Shards of one vector (runtimes/ray) each prepare their slice, and commit
    # with apply = "every shard's slice is finite", so that an update is applied whole or
    # not at all and every shard counts the same versions, hence the same tau.
    def prepare(self, worker: int, msg: Tensor, lr: float, message_finite: bool | None = None) -> tuple[bool, bool]:
        """Phase one of ``push``: returns (pending, finite), whether an update (or a message the rule
        holds for a later step) now waits for ``commit`` (not when a synchronous round stays open, or
        the message was dropped as non-finite) and whether it is finite. ``message_finite`` is the whole
        message's finiteness, given by whoever saw all of it (a shard sees only its slice).

        The boundary, checked on every call before anything changes, in both kernel paths (a few
        comparisons; ``server_checks`` says what is wrong): ``worker`` in 0..M-1, ``lr`` a finite
        float > 0, ``msg`` a tensor of the weights' shape, dtype and device. A wrong call is a
        one-line UsageError, never a write past the weights or a partial update counted as a version."""
        if not (worker.__class__ is int and 0 <= worker < self.num_workers and lr.__class__ is float
                and 0.0 < lr < math.inf and msg.__class__ is Tensor and msg.shape == self._shape
                and msg.dtype is self._dtype and (msg.is_cpu if self._on_cpu else msg.device == self._device)):
            worker, lr = check.push(worker, msg, lr, self.w, self.num_workers, "ParameterServer.push")
        self._pending = None
        tau = self.version - self.pulled_version[worker]
        if self._admits is not None and not self._admits(worker, tau, self.num_workers):
            self.last_dropped = True   # refused whole: nothing changes but the count
            self.staleness.dropped[worker] += 1
            return False, False
        self.last_dropped = False
        span = self._extremes(msg)
        finite = math.isfinite(span[0]) and math.isfinite(span[1])
        if message_finite is not None:
            finite = finite and message_finite
        if not finite:
            self._nonfinite(f"message from worker {worker}")
        if self.algorithm.synchronous:
            # Kept until the round closes, so copied: the sender may reuse its buffer.
            self.round[worker] = msg.clone() if finite else None
            return self._prepare_round(lr)
        if not finite:
            return False, False
        if self.kernels == "numba" and self._prepare_fused(worker, msg, tau, lr):
            return True, self._pending.finite
        rule = self.algorithm.server_delta
        ok = self._prepare_update(lambda state, w, g, out: rule(state, w, worker, g, tau, lr, out),
                                  getattr(rule, "elementwise", False), msg, span, f"update from worker {worker}",
                                  [(worker, tau)], worker)
        return True, ok

    def prepare_removal(self, worker: int, lr: float = 0.0) -> tuple[bool, bool]:
        """Phase one of ``remove_worker``: (pending, finite) as ``prepare``."""
        worker = check.worker_id(worker, self.num_workers, "ParameterServer.remove_worker")
        self._pending = None
        self.last_dropped = False
        self.live.discard(worker)
        self.round.pop(worker, None)
        return self._prepare_round(lr) if self.algorithm.synchronous else (False, False)

    def commit(self, apply: bool | None = None) -> bool:
        """Phase two: add the pending update (``apply``: default, whether it is finite).
        Not applied, it is counted as non-finite (or raises NonFiniteError), and what its
        prepare changed (the rule's state; a fused kernel's weights) is put back. A held
        message is kept for the rule's next step. True when ``w`` changed."""
        pending, self._pending = self._pending, None
        if pending is None:
            return False
        records = pending.records
        if not (pending.finite if apply is None else apply):
            # (prepare undid a non-finite update itself): a finite one not applied, as another shard's was not finite
            if pending.finite and pending.undo.restore():
                self.held = []
            return self._nonfinite(pending.what)
        if pending.steps is None:   # the rule holds the message: logged with the step that uses it
            self.held.extend(records)
            return False
        if self.held:
            records, self.held = self.held + records, []
        w = self.w
        for a, b, t, s in pending.steps:
            target = w if a is None else w[a:b]
            target.add_(t) if s == 1.0 else target.add_(t, alpha=s)
        for m, tau in records:
            self.staleness.record(m, tau)
        self.version += 1
        return True

    def kernels_info(self) -> dict:
        """Which path applies the updates, for summary.json: the kernels, and with numba
        the seconds their loading took in this process (compiling, or reading numba's cache)."""
        info = {"server_kernels": self.kernels}
        if self.kernels == "numba":   # (0 when the rule needed no kernel: numba was never loaded)
            info["server_kernels_load_s"] = round(fused.load_seconds, 3)
        return info

    @property
    def round_open(self) -> bool:
        return bool(self.round)

    def waiting(self, worker: int) -> bool:
        """Whether ``worker``'s message sits in the open synchronous round: it waits for the round to close
        (one the rule dropped, e.g. m-ssgd's late straggler, does not: it starts again at once)."""
        return worker in self.round

    @property
    def updates_dropped(self) -> int:
        """Messages the rule refused (``Algorithm.admits``), all workers; ``staleness.dropped``: per worker."""
        return sum(self.staleness.dropped)

    # ---- checkpoints ------------------------------------------------------------
    def state_dict(self, algorithm_state: bool = True) -> dict:
        """Everything needed to continue exactly where the server is; without the (large)
        algorithm state and round buffers when ``algorithm_state`` is False."""
        sd = {
            "w": self.w, "version": self.version, "pulled_version": list(self.pulled_version),
            "live": sorted(self.live),
            "staleness": {"workers": torch.tensor(self.staleness.workers, dtype=torch.int32),
                          "taus": torch.tensor(self.staleness.taus, dtype=torch.int32),
                          "dropped": torch.tensor(self.staleness.dropped, dtype=torch.int64)},
            "nonfinite_skipped": self.nonfinite_skipped,
        }
        if algorithm_state:
            sd.update(state=self.state.to_dict(), round=dict(self.round), held=[list(r) for r in self.held])
        return sd

    def load_state_dict(self, sd: dict, strict: bool = True) -> None:
        """Load a ``state_dict``; with ``strict=False`` the parts it lacks (the algorithm state,
        the round) stay as they are: a runtime that keeps the server elsewhere mirrors it so. A state that does not
        fit this server (``state_checks.server_damage``) is one ``UsageError``, and nothing changes."""
        if problem := server_damage(sd, self.state_dict(), self.num_workers, "sd", strict):
            raise UsageError(f"load_state_dict: {problem}; pass a state_dict() of a server of this model, algorithm "
                             f"and {self.num_workers} workers")
        device = self.w.device
        self.w.copy_(sd["w"])
        self.version = int(sd["version"])
        self.pulled_version = [int(v) for v in sd["pulled_version"]]
        self.live = set(sd["live"])
        self.staleness.workers = array("i", sd["staleness"]["workers"].tolist())
        self.staleness.taus = array("i", sd["staleness"]["taus"].tolist())
        dropped = sd["staleness"].get("dropped")   # (an older checkpoint has none: no rule dropped messages then)
        self.staleness.dropped = [0] * self.num_workers if dropped is None else [int(d) for d in dropped.tolist()]
        self.nonfinite_skipped = int(sd["nonfinite_skipped"])
        if strict or "state" in sd:
            self.state = self.algorithm.State.from_dict(to_device(sd["state"], device))
        if strict or "round" in sd:
            self.round = {int(m): (None if g is None else g.to(device)) for m, g in sd["round"].items()}
            self.held = [(int(m), int(tau)) for m, tau in sd.get("held", [])]

    # ---- internals ------------------------------------------------------------
    def _prepare_fused(self, worker: int, msg: Tensor, tau: int, lr: float) -> bool:
        """The fused kernel of the rule, if it has one: it adds the update to ``w`` at once,
        keeping the old ``w`` in ``_delta`` and the old state in the undo's buffers; a non-finite
        update is undone here, and an update that ``commit`` is told not to apply (another shard's
        slice was not finite) there."""
        if not math.isfinite(_float32(lr)):
            return False   # the torch path counts it as non-finite
        undo = self._undo.begin(self.state, worker)
        finite = self.algorithm.fused_apply(self.state, self.w, worker, msg, tau, lr, self._delta,
                                            keep=undo.keep(self.w, self._delta))
        if finite is None:
            return False
        if not finite and undo.restore():
            self.held = []
        self._pending = Pending([], finite, f"update from worker {worker}", [(worker, tau)], undo)
        return True

    def _prepare_round(self, lr: float) -> tuple[bool, bool]:
        live = self.live
        if not live or not self.algorithm.round_complete(len(live.intersection(self.round)), len(live),
                                                          self.num_workers):
            return False, False
        msgs = {m: g for m, g in sorted(self.round.items()) if g is not None}
        self.round.clear()
        if not msgs:
            return False, False
        rule = self.algorithm.round_delta
        records = [(m, self.version - self.pulled_version[m]) for m in msgs]
        ok = self._prepare_update(lambda state, w, gs, out: rule(state, w, gs, lr, out),
                                  getattr(rule, "elementwise", False), msgs, None, "synchronous round update", records,
                                  None)
        return True, ok

    def _prepare_update(self, rule, elementwise: bool, msg, span, what: str, records: list, worker) -> bool:
        """Run ``rule(state, w, msg, out)`` and check the update and the state it wrote; keep it for ``commit``.

        The rule writes the update into ``out`` (and returns None) or returns
        ``(t, s)`` for the update ``s*t``. ``msg`` is the message (or the dict
        of a round's messages, ``worker`` None); ``span`` its (min, max), known finite,
        when it is one tensor. Returns whether the update is finite. A rule that is not
        element-wise may return ``HELD``: it took the message into its state (checked as an
        update's), and ``commit`` keeps the message's records for its step.

        The old values of what the rule writes are kept first (``transaction.Undo``) and put
        back when the update, or the state it wrote, is not finite. An element-wise rule on
        the CPU runs on chunks of ``CHUNK`` elements of everything (weights, messages, state,
        ``out``), each chunk's state kept just before and its result checked while still in
        cache; ``commit`` adds the chunks once all of them are known finite, so that an
        update is applied whole or not at all, and the state of the chunks already written
        is put back when a later one is not finite.
        """
        delta, w = self._delta, self.w
        n = delta.numel()
        undo = self._undo.begin(self.state, worker)
        if not elementwise or delta.device.type != "cpu" or delta.dim() != 1 or n < CHUNK_ABOVE:
            undo.save()
            result = rule(self.state, w, msg, delta)
            if result is HELD:
                steps, finite = None, undo.state_finite(None, self._extremes)
            else:
                t, s = self._step(result, delta)
                steps = [(None, None, t, s)]
                finite = self._scaled_finite(t, s, span if t is msg else None) and \
                    undo.state_finite(t, self._extremes)
        else:
            steps, finite = [], True
            one = isinstance(msg, Tensor)
            whole = {"msg", "out"}   # the whole update is s*msg or s*out: add it in one call
            for a in range(0, n, CHUNK):
                b = min(a + CHUNK, n)
                m = msg[a:b] if one else {k: g[a:b] for k, g in msg.items()}
                out = delta[a:b]
                undo.save(a, b)
                t, s = self._step(rule(self.state.chunk(a, b), w[a:b], m, out), out)
                finite = self._scaled_finite(t, s, span if t is m else None) and \
                    undo.state_finite(t, self._extremes, a, b)
                if not finite:   # the chunks after it are not run: nothing of theirs to put back
                    break
                whole &= {"msg" if t is m else "out" if t is out else None}
                steps.append((a, b, t, s))
            if finite and whole and len({s for *_, s in steps}) == 1:
                steps = [(None, None, msg if whole == {"msg"} else delta, steps[0][3])]
        if not finite and undo.restore():   # (Rennala: the batch dropped, its held messages too)
            self.held = []
        self._pending = Pending(steps, finite, what, records, undo)
        return finite

    @staticmethod
    def _step(result, out: Tensor) -> tuple[Tensor, float]:
        return (out, 1.0) if result is None else (result[0], float(result[1]))

    def _extremes(self, t: Tensor) -> tuple[float, float]:
        """(min, max) of t, or (-max|t|, max|t|), which the checks use alike; NaN propagates."""
        if (self.kernels == "numba" and t.dtype == torch.float32 and t.dim() == 1 and t.is_contiguous()
                and fused.in_use()):
            top = fused.max_abs(t)   # one integer pass, cheaper than aminmax in cache, once numba is loaded
            return -top, top
        # min and max propagate NaN and Inf, and one fused pass over t is ~10x
        # cheaper than materialising isfinite(t).
        lo, hi = torch.aminmax(t)
        return lo.item(), hi.item()

    def _scaled_finite(self, t: Tensor, s: float, span: tuple[float, float] | None) -> bool:
        """Whether s*t, rounded to float32, is finite everywhere (``span``: t's min and max, if known)."""
        lo, hi = self._extremes(t) if span is None else span
        if not (math.isfinite(lo) and math.isfinite(hi)):
            return False
        if s == 1.0:
            return True
        s32 = _float32(s)
        if not math.isfinite(s32):
            return False
        # float32 products are exact in double; they round to inf from (2 - 2**-24) * 2**127 up
        return max(abs(s32 * lo), abs(s32 * hi)) < _F32_OVERFLOW

    def _nonfinite(self, what: str) -> bool:
        if self.on_nonfinite == "stop":
            raise NonFiniteError(f"{what} contains NaN or Inf (version {self.version}); "
                                 "lower --lr, or pass --on-nonfinite skip to drop such updates")
        self.nonfinite_skipped += 1
        return False


_F32_OVERFLOW = (2 - 2 ** -24) * 2.0 ** 127


def _float32(x: float) -> float:
    """x rounded to float32, as tensor arithmetic rounds a Python scalar."""
    try:
        return struct.unpack("f", struct.pack("f", x))[0]
    except OverflowError:
        return math.copysign(math.inf, x)


def to_device(obj, device):
    """Move the tensors of a nested dict/list structure to ``device``."""
    if isinstance(obj, Tensor):
        return obj.to(device)
    if isinstance(obj, dict):
        return {k: to_device(v, device) for k, v in obj.items()}
    if isinstance(obj, list):
        return [to_device(v, device) for v in obj]
    return obj
