"""The driver's answers to faults: a dead server shard (back to the last checkpoint) and a dead worker
(replaced, or dropped and its samples given to the others). A mixin of ``driver.Driver``."""
from __future__ import annotations

import time

import torch

from ...errors import RunError
from .connect import room_for


class Recovery:
    def restore_shards(self, launch: bool = True) -> None:
        """A shard died: Ray restarts it; every shard goes back to the last checkpoint."""
        if self.snapshot is None:
            raise RunError("a parameter-server shard died and the run has no checkpoint to restore it from; "
                           "run with --checkpoint-every N so that the server can recover")
        deadline = time.monotonic() + self.rt.restart_timeout
        while True:
            try:
                self.ray.get([s.ping.remote() for s in self.shards], timeout=self.rt.restart_timeout)
                break
            except (self.ray.exceptions.RayActorError, self.ray.exceptions.GetTimeoutError):
                if time.monotonic() > deadline:
                    raise RunError("a parameter-server shard died and was not restarted in "
                                   f"{self.rt.restart_timeout:g} s; the run stopped (on a loaded machine Ray may take "
                                   "minutes: give --restart-timeout SECONDS, e.g. 120)") from None
                time.sleep(0.5)
        before = self.sharded.version
        self.ray.get([s.load.remote(p) for s, p in zip(self.shards, self.snapshot)])
        first = self.snapshot[0]
        self.sharded.version = int(first["version"])
        self.sharded.pulled_version = [int(v) for v in first["pulled_version"]]
        self.sharded.round = {}
        self.sharded.held = [(int(m), int(tau)) for m, tau in first.get("held", [])]
        dropped = first["staleness"].get("dropped")
        self.sharded.staleness.dropped = [0] * self.M if dropped is None else [int(d) for d in dropped]
        self.sharded.live = {int(m) for m in first["live"]}
        for m in sorted(self.sharded.live - self.live):   # lost since the checkpoint: lost again
            self.sharded.remove_worker(m, self.training.lr)
        self.server.version = self.sharded.version
        self.updates_lost += before - self.sharded.version
        self.note(f"a parameter-server shard died at update {before}; the server went back to the checkpoint "
                  f"at update {self.sharded.version} ({before - self.sharded.version} updates lost)")
        # messages computed on weights the server no longer has (fetched, so that Ray does not
        # report their errors as unhandled)
        self.settle([r for ref, (_, slices, _, pulled) in self.futures.items() for r in (ref, *slices, *pulled)]
                    + (self.prefetched[1] if self.prefetched else []), timeout=self.rt.restart_timeout)
        self.prefetched = None
        self.futures.clear()
        self.parked = []
        if launch and not self.training.done:
            for m in sorted(self.live):
                self.launch(m)

    def replace_worker(self, m: int, launch: bool = True) -> None:
        """Worker m died (or its node): a new actor if the cluster has room, else its samples to the others."""
        self.ray.kill(self.actors[m], no_restart=True)
        actor = self._new_worker(m, pool=self.pools[m].numpy())
        try:   # no room left: given up at once; else a replacement has restart_timeout seconds to start
            wait = self.rt.restart_timeout if room_for(self.ray, self.request) else 0
            self.ray.get(actor.ping.remote(), timeout=wait)
            self.actors[m] = actor
            self.note(f"worker {m} died at update {self.sharded.version}; a new one took its place")
            if launch and not self.training.done:   # (a synchronous round waits for its message too)
                self.launch(m)
            return
        except (self.ray.exceptions.GetTimeoutError, self.ray.exceptions.RayActorError):
            self.ray.kill(actor, no_restart=True)
        self.live.discard(m)
        del self.actors[m]
        self.lost += 1
        self.sharded.remove_worker(m, self.training.lr)   # (may close a synchronous round)
        self.server.version = self.sharded.version
        survivors = sorted(self.live)
        text = f"worker {m} lost at update {self.sharded.version} and not replaced (no room in the cluster)"
        if survivors and self.factory.partition != "iid":
            for s, part in zip(survivors, self.pools[m].tensor_split(len(survivors))):
                self.pools[s] = torch.cat([self.pools[s], part])
                self.give_samples(s, part)
            text += f"; its {len(self.pools[m])} samples now go to workers {', '.join(map(str, survivors))}"
            self.pools[m] = self.pools[m][:0]
        self.note(text)
        if self.algo.synchronous and self.parked:
            self.release()   # (the round may have closed without it)
