"""The staleness log: the tau of every update the parameter server applied, per worker and in order, and
each worker's messages that the rule refused (``Algorithm.admits``). ``ParameterServer.staleness`` keeps one;
so does the driver's ``ShardedServer``, its mirror of the shards'. Its ``summary()`` is staleness.json."""
from __future__ import annotations

from array import array
from collections import Counter


class StalenessLog:
    """tau of every applied update, per worker, in order (compact int arrays), and each worker's messages
    that the rule refused (``Algorithm.admits``: dropped)."""

    def __init__(self, num_workers: int):
        self.workers = array("i")
        self.taus = array("i")
        self.num_workers = num_workers
        self.dropped = [0] * num_workers

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
                       "tau_mean": total[m] / count[m] if count[m] else None, "tau_max": peak[m],
                       "dropped": self.dropped[m]}
                      for m in range(self.num_workers)]
        return {
            "updates": len(taus),
            "tau_mean": sum(taus) / len(taus) if taus else 0.0,
            "tau_max": max(taus) if taus else 0,
            "histogram": {str(t): hist[t] for t in sorted(hist)},
            "updates_dropped": sum(self.dropped),
            "per_worker": per_worker,
        }
