"""The parameter server: state only, no transport.

It holds the flat weights, a version counter (one per applied update), the
version each worker last pulled, the per-algorithm state (per-worker snapshots,
MeanSquare, momentum buffers), and the staleness log. Every runtime, simulated
or real, drives the same two calls: ``pull(worker)`` and ``push(worker, msg)``.
"""
from __future__ import annotations

from array import array
from collections import Counter

import torch
from torch import Tensor

from .algorithms import Algorithm

ON_NONFINITE = ("skip", "stop")


class NonFiniteError(RuntimeError):
    """A NaN or Inf message or update under ``on_nonfinite='stop'``."""


class StalenessLog:
    """tau of every applied update, per worker, in order (compact int arrays)."""

    def __init__(self, num_workers: int):
        self.workers = array("i")
        self.taus = array("i")
        self.num_workers = num_workers

    def record(self, worker: int, tau: int) -> None:
        self.workers.append(worker)
        self.taus.append(tau)

    @property
    def mean(self) -> float:
        return sum(self.taus) / len(self.taus) if self.taus else 0.0

    def summary(self) -> dict:
        taus, workers = self.taus, self.workers
        hist = Counter(taus)
        count = [0] * self.num_workers
        total = [0] * self.num_workers
        peak: list[int | None] = [None] * self.num_workers
        for w, t in zip(workers, taus):
            count[w] += 1
            total[w] += t
            peak[w] = t if peak[w] is None or t > peak[w] else peak[w]
        per_worker = [{"worker": m, "updates": count[m],
                       "tau_mean": total[m] / count[m] if count[m] else None, "tau_max": peak[m]}
                      for m in range(self.num_workers)]
        return {
            "updates": len(taus),
            "tau_mean": sum(taus) / len(taus) if taus else 0.0,
            "tau_max": max(taus) if taus else 0,
            "histogram": {str(t): hist[t] for t in sorted(hist)},
            "per_worker": per_worker,
        }


class ParameterServer:
    def __init__(self, algorithm: Algorithm, w0: Tensor, num_workers: int, *, on_nonfinite: str = "skip"):
        if on_nonfinite not in ON_NONFINITE:
            raise ValueError(f"on_nonfinite must be one of {', '.join(ON_NONFINITE)}, got {on_nonfinite!r}")
        self.algorithm = algorithm
        self.num_workers = num_workers
        self.on_nonfinite = on_nonfinite
        self.w = w0.detach().clone().contiguous()
        self.version = 0
        self.pulled_version = [0] * num_workers
        self.state = algorithm.server_init(self.w, num_workers)
        self.live = set(range(num_workers))
        self.round: dict[int, Tensor | None] = {}   # synchronous algorithms: this round's messages
        self.staleness = StalenessLog(num_workers)
        self.nonfinite_skipped = 0
        self._delta = torch.empty_like(self.w)

    # ---- the two calls every runtime makes ---------------------------------
    def pull(self, worker: int, out: Tensor | None = None) -> Tensor:
        """The current weights for ``worker``, copied into ``out`` if given."""
        self.pulled_version[worker] = self.version
        self.algorithm.on_pull(self.state, worker, self.w)
        return self.w.clone() if out is None else out.copy_(self.w)

    def push(self, worker: int, msg: Tensor, lr: float) -> bool:
        """Apply (or, for synchronous algorithms, buffer) one message.

        Returns True when the weights changed. A message or an update with a
        NaN/Inf is never applied: it is counted, or raises NonFiniteError.
        """
        tau = self.version - self.pulled_version[worker]
        finite = self._check_finite(msg, f"message from worker {worker}")
        if self.algorithm.synchronous:
            self.round[worker] = msg if finite else None
            return self._maybe_close_round(lr)
        if not finite:
            return False
        self.algorithm.server_delta(self.state, self.w, worker, msg, tau, lr, self._delta)
        if not self._check_finite(self._delta, f"update from worker {worker}"):
            return False
        self.w.add_(self._delta)
        self.version += 1
        self.staleness.record(worker, tau)
        return True

    def remove_worker(self, worker: int, lr: float = 0.0) -> bool:
        """A worker is gone: synchronous rounds stop waiting for it."""
        self.live.discard(worker)
        self.round.pop(worker, None)
        return self._maybe_close_round(lr) if self.algorithm.synchronous else False

    @property
    def round_open(self) -> bool:
        return bool(self.round)

    # ---- checkpoints ------------------------------------------------------------
    def state_dict(self) -> dict:
        """Everything needed to continue exactly where the server is."""
        return {
            "w": self.w, "version": self.version, "pulled_version": list(self.pulled_version),
            "state": self.state, "live": sorted(self.live), "round": dict(self.round),
            "staleness": {"workers": torch.tensor(self.staleness.workers, dtype=torch.int32),
                          "taus": torch.tensor(self.staleness.taus, dtype=torch.int32)},
            "nonfinite_skipped": self.nonfinite_skipped,
        }

    def load_state_dict(self, sd: dict) -> None:
        if sd["w"].shape != self.w.shape:
            raise ValueError(f"the checkpoint holds {sd['w'].numel()} weights, this model has {self.w.numel()}")
        device = self.w.device
        self.w.copy_(sd["w"])
        self.version = int(sd["version"])
        self.pulled_version = [int(v) for v in sd["pulled_version"]]
        self.state = to_device(sd["state"], device)
        self.live = set(sd["live"])
        self.round = {int(m): (None if g is None else g.to(device)) for m, g in sd["round"].items()}
        self.staleness.workers = array("i", sd["staleness"]["workers"].tolist())
        self.staleness.taus = array("i", sd["staleness"]["taus"].tolist())
        self.nonfinite_skipped = int(sd["nonfinite_skipped"])

    # ---- internals ------------------------------------------------------------
    def _maybe_close_round(self, lr: float) -> bool:
        if not self.live or not self.live.issubset(self.round):
            return False
        msgs = {m: g for m, g in sorted(self.round.items()) if g is not None}
        self.round.clear()
        if not msgs:
            return False
        self.algorithm.round_delta(self.state, self.w, msgs, lr, self._delta)
        if not self._check_finite(self._delta, "synchronous round update"):
            return False
        self.w.add_(self._delta)
        for m in msgs:
            self.staleness.record(m, self.version - self.pulled_version[m])
        self.version += 1
        return True

    def _check_finite(self, t: Tensor, what: str) -> bool:
        # min and max propagate NaN and Inf, and one fused pass over t is ~10x
        # cheaper than materialising isfinite(t).
        lo, hi = torch.aminmax(t)
        if bool(torch.isfinite(lo) & torch.isfinite(hi)):
            return True
        if self.on_nonfinite == "stop":
            raise NonFiniteError(f"{what} contains NaN or Inf (version {self.version}); "
                                 "lower --lr, or pass --on-nonfinite skip to drop such updates")
        self.nonfinite_skipped += 1
        return False



def to_device(obj, device):
    """Move the tensors of a nested dict/list structure to ``device``."""
    if isinstance(obj, Tensor):
        return obj.to(device)
    if isinstance(obj, dict):
        return {k: to_device(v, device) for k, v in obj.items()}
    if isinstance(obj, list):
        return [to_device(v, device) for v in obj]
    return obj
