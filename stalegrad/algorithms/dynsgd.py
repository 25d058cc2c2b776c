"""DynSGD (Jiang et al., SIGMOD 2017): staleness-scaled accumulated commits.

Workers commit un-normalised accumulated updates, as in DOWNPOUR. The server
scales each commit by 1/(tau+1), tau being the number of server updates since
that worker's last pull (dist-keras: ``du = num_updates - last_update + 1``);
an outer optimizer (``agn.AccumulatedCommit``) then steps on the scaled commit.
"""
from __future__ import annotations

from dataclasses import dataclass

from .agn import AccumulatedCommit
from .base import elementwise


@dataclass(frozen=True)
class DynSGD(AccumulatedCommit):
    name = "dynsgd"
    summary = "DynSGD (Jiang et al. 2017): the server scales each accumulated commit by 1/(tau+1)"
    rule = "worker: as downpour;  server: w <- w + commit/(tau+1)"

    @elementwise
    def server_delta(self, state, w, worker, msg, tau, lr, out):
        # w + commit/(tau+1), in one fused pass over the commit (outer sgd at outer-lr 1)
        return self.outer_step(state, msg, 1.0 / (tau + 1), out)
