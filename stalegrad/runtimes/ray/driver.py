"""The driver of a Ray run: the asynchronous loop, in the style of Ray's parameter-server example.

    start every worker: step.remote(lr, *pulled slices)
    loop: ray.wait for whichever worker finishes first; push its message to the
          shards (prepare, commit); account; start it again (synchronous rules:
          when the round closes)

The training run (``Training``) stays in the driver. Its ``server`` is brought
up to date from the shards before an evaluation, a checkpoint and at the end
(``load_state_dict``, without the algorithm state for an evaluation).
Faults: a worker actor that dies is restarted once if the cluster has room
within ``restart_timeout`` seconds, else dropped and its samples given to the
survivors; a shard that dies is restarted by Ray (``max_restarts``) and the
shards go back to the last checkpoint's server state, held in the driver.
"""
from __future__ import annotations

import sys
import time

import torch

from ...delays import write_trace
from ...errors import RunError
from ...server import NonFiniteError
from ...sharding import ShardedServer, merge_states, shard_bounds, split_state
from .actors import ShardActor, WorkerActor, to_numpy, to_torch


class ShardLost(Exception):
    pass


class Driver:
    def __init__(self, runtime, training, resume: dict | None):
        import ray
        self.ray, self.rt, self.training = ray, runtime, training
        self.server = training.server
        self.algo = self.server.algorithm
        self.M = self.server.num_workers
        self.factory = training.worker_factory
        n = self.server.w.numel()
        self.K = min(runtime.ps_shards, n)
        self.bounds = shard_bounds(n, self.K)
        self.resume = resume
        self.t0 = time.perf_counter() - (float(resume["now"]) if resume else 0.0)
        self.futures: dict = {}          # object ref of a worker's meta -> (worker, message slice refs)
        self.parked: list[int] = []
        self.live: set[int] = set(range(self.M))
        self.lost, self.updates_lost, self.pushes = 0, 0, [0] * self.M
        self.push_s: list[float] = []
        self.trace = [] if runtime.record_trace is not None else None
        self.snapshot: list[dict] | None = None   # the shards' state at the last checkpoint
        self.pools = [self.factory.stream(m).pool for m in range(self.M)]
        if resume:
            self.pools = [torch.as_tensor(s["stream"]["pool"]) if s is not None else None for s in resume["workers"]]
            self.live = {m for m in range(self.M) if resume["workers"][m] is not None}

    # ---- set-up and tear-down ------------------------------------------------------
    def start(self) -> None:
        ray, rt = self.ray, self.rt
        per_element = self.algo.per_element_state
        parts = split_state(self.server.state_dict(), self.bounds, per_element)
        shard_cls = ray.remote(num_cpus=0, max_restarts=rt.max_restarts, max_task_retries=0)(ShardActor)
        self.shards = [shard_cls.remote(self.algo, b - a, self.M, self.server.on_nonfinite) for a, b in self.bounds]
        self.ray.get([s.load.remote(to_numpy(p)) for s, p in zip(self.shards, parts)])
        self.sharded = ShardedServer(self._call, self.K, self.M, self.algo.synchronous)
        self.sharded.version = self.server.version
        self.sharded.pulled_version = list(self.server.pulled_version)
        self.sharded.live = set(self.server.live) & self.live
        self.worker_cls = ray.remote(num_cpus=rt.cpus_per_worker, num_gpus=rt.gpus_per_worker,
                                     max_restarts=0)(WorkerActor)
        from ..local.processes import module_blob
        self.blob = module_blob(self.factory.model.module)
        self.x = ray.put(self.factory.x.cpu().numpy())
        self.y = ray.put(self.factory.y.cpu().numpy())
        self.portable = self.factory.portable(None, None)
        self.threads = max(1, int(rt.cpus_per_worker))
        self.actors = {}
        states = self.resume["workers"] if self.resume else [None] * self.M
        for m in sorted(self.live):
            self.actors[m] = self._new_worker(m, states[m])
        ray.get([s.ping.remote() for s in self.shards] + [a.ping.remote() for a in self.actors.values()])

    def _new_worker(self, m: int, state=None, pool=None):
        device = self.factory.device
        if device == "cuda":
            device = "cuda:0"   # Ray sets CUDA_VISIBLE_DEVICES per actor: its GPU is device 0
        w0 = self.server.w.detach().cpu().numpy()
        return self.worker_cls.remote(m, self.portable, self.blob, self.x, self.y, w0, self.bounds, device,
                                      self.threads, state, pool)

    def stop(self) -> None:
        for actor in list(getattr(self, "actors", {}).values()) + list(getattr(self, "shards", [])):
            try:
                self.ray.kill(actor, no_restart=True)
            except Exception:
                pass

    # ---- transport ------------------------------------------------------------------
    def _call(self, method: str, args) -> list:
        refs = [getattr(s, method).remote(*a) for s, a in zip(self.shards, args)]
        if method == "pull":
            return refs            # handed to the worker: the object store moves them, not the driver
        try:
            return self.ray.get(refs)
        except self.ray.exceptions.RayTaskError as e:
            if isinstance(e.cause, NonFiniteError):
                raise NonFiniteError(str(e.cause)) from None
            raise
        except self.ray.exceptions.RayActorError:
            raise ShardLost from None

    def launch(self, m: int) -> None:
        actor, lr = self.actors[m], self.training.lr
        if self.algo.pull_before_compute:
            refs = actor.step.options(num_returns=1 + self.K).remote(lr, *self.sharded.pull(m))
            self.futures[refs[0]] = (m, refs[1:], "step")
        else:
            ref = actor.compute.remote(lr)
            self.futures[ref] = (m, None, "compute")

    # ---- the loop -------------------------------------------------------------------
    def run(self) -> None:
        training = self.training
        for m in sorted(self.live):
            self.launch(m)
        while not training.done:
            if not self.futures:
                raise RunError(f"all {self.M} workers were lost; see the notes above")
            ready, _ = self.ray.wait(list(self.futures), num_returns=1)
            m, slices, kind = self.futures.pop(ready[0])
            try:
                meta = self.ray.get(ready[0])
            except self.ray.exceptions.RayActorError:
                self.replace_worker(m)
                continue
            except self.ray.exceptions.RayTaskError as e:
                raise RunError(f"worker {m} failed: {str(e.cause).splitlines()[0] if e.cause else e}") from None
            if kind == "compute":     # elastic rules: the centre after the local steps
                refs = self.actors[m].finish.options(num_returns=1 + self.K).remote(*self.sharded.pull(m))
                self.futures[refs[0]] = (m, refs[1:], "finish")
                continue
            try:
                self.on_message(m, meta, slices)
            except ShardLost:
                self.restore_shards()
        self.finish()

    def on_message(self, m: int, meta: tuple, slices: list) -> None:
        loss, samples, finite = meta
        training, sharded = self.training, self.sharded
        now = time.perf_counter() - self.t0
        pulled, version = sharded.pulled_version[m], sharded.version
        t = time.perf_counter()
        sharded.push(m, slices, training.lr, finite)
        self.push_s.append(time.perf_counter() - t)
        self.pushes[m] += 1
        if self.trace is not None:
            self.trace.append((m, pulled, version, now))
        if training.evaluation_due(samples):
            self.sync(algorithm_state=False)
        training.after_push(samples, loss, now)
        if training.checkpoint_due() and not training.done:
            self.checkpoint(also_running=m)
            return
        self.continue_after_push(m)

    def continue_after_push(self, m: int) -> None:
        if not self.algo.synchronous:
            self.launch(m)
            return
        self.parked.append(m)
        if not self.sharded.round_open:
            parked, self.parked = self.parked, []
            for p in parked:
                if p in self.live:
                    self.launch(p)

    # ---- state ------------------------------------------------------------------------
    def sync(self, algorithm_state: bool) -> list[dict]:
        """Bring ``training.server`` (and the model's BatchNorm statistics) up to date from the shards."""
        parts = self._call("state", [(algorithm_state,)] * self.K)
        tensors = [to_torch(p) for p in parts]
        merged = merge_states(tensors, self.algo.per_element_state) if algorithm_state else \
            dict(tensors[0], w=torch.cat([p["w"] for p in tensors]))
        self.server.load_state_dict(merged, strict=algorithm_state)
        buffers = [b for b in self.factory.model.module.buffers() if b.is_floating_point()]
        if buffers and self.live:
            stats = self.ray.get(self.actors[min(self.live)].statistics.remote())
            for b, v in zip(buffers, stats):
                b.copy_(torch.from_numpy(v.copy()))
        return parts

    def drain(self) -> list[int]:
        """Let every running message finish and be pushed; the workers it frees, to start again."""
        freed = []
        while self.futures:
            ready, _ = self.ray.wait(list(self.futures), num_returns=1)
            m, slices, kind = self.futures.pop(ready[0])
            try:
                meta = self.ray.get(ready[0])
            except self.ray.exceptions.RayActorError:
                self.replace_worker(m, launch=False)
                freed.append(m)
                continue
            if kind == "compute":
                refs = self.actors[m].finish.options(num_returns=1 + self.K).remote(*self.sharded.pull(m))
                self.futures[refs[0]] = (m, refs[1:], "finish")
                continue
            loss, samples, finite = meta
            self.sharded.push(m, slices, self.training.lr, finite)
            self.pushes[m] += 1
            self.training.after_push(samples, loss, time.perf_counter() - self.t0)
            freed.append(m)
        return freed

    def checkpoint(self, also_running: int | None = None) -> None:
        """A consistent cut: no message in flight, every worker between two messages."""
        freed = self.drain() + ([also_running] if also_running is not None else [])
        self.snapshot = self.sync(algorithm_state=True)
        names = sorted(self.actors)
        states = dict(zip(names, self.ray.get([self.actors[m].state.remote() for m in names])))
        workers = [states.get(m) for m in range(self.M)]
        self.training.save_checkpoint({"kind": "ray", "now": time.perf_counter() - self.t0, "workers": workers})
        if self.training.done:
            return
        if self.algo.synchronous:
            self.parked = [p for p in self.parked if p in self.live]
            if not self.sharded.round_open:
                self.parked = []
                freed = sorted(self.live)
        for m in sorted(set(freed)):
            if m in self.live and (not self.algo.synchronous or not self.sharded.round_open):
                self.launch(m)

    def restore_shards(self) -> None:
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
                                   f"{self.rt.restart_timeout:g} s; the run stopped") from None
                time.sleep(0.5)
        before = self.sharded.version
        self.ray.get([s.load.remote(p) for s, p in zip(self.shards, self.snapshot)])
        first = self.snapshot[0]
        self.sharded.version = int(first["version"])
        self.sharded.pulled_version = [int(v) for v in first["pulled_version"]]
        self.sharded.round = {}
        self.updates_lost += before - self.sharded.version
        self.note(f"a parameter-server shard died at update {before}; the server went back to the checkpoint "
                  f"at update {self.sharded.version} ({before - self.sharded.version} updates lost)")
        self.futures.clear()      # messages computed on weights the server no longer has
        self.parked = []
        for m in sorted(self.live):
            self.launch(m)

    def replace_worker(self, m: int, launch: bool = True) -> None:
        """Worker m died (or its node): a new actor if the cluster has room, else its samples to the others."""
        self.ray.kill(self.actors[m], no_restart=True)
        actor = self._new_worker(m, pool=self.pools[m].numpy())
        try:
            self.ray.get(actor.ping.remote(), timeout=self.rt.restart_timeout)
            self.actors[m] = actor
            self.note(f"worker {m} died at update {self.sharded.version}; a new one took its place")
            if launch:
                self.sharded.pull(m)
                self.launch(m)
            return
        except (self.ray.exceptions.GetTimeoutError, self.ray.exceptions.RayActorError):
            self.ray.kill(actor, no_restart=True)
        self.live.discard(m)
        del self.actors[m]
        self.lost += 1
        self.sharded.remove_worker(m, self.training.lr)
        survivors = sorted(self.live)
        text = f"worker {m} lost at update {self.sharded.version} and not replaced (no room in the cluster)"
        if survivors and self.factory.partition == "shard":
            for s, part in zip(survivors, self.pools[m].tensor_split(len(survivors))):
                self.pools[s] = torch.cat([self.pools[s], part])
                self.actors[s].adopt.remote(part.numpy())
            text += f"; its {len(self.pools[m])} samples now go to workers {', '.join(map(str, survivors))}"
            self.pools[m] = self.pools[m][:0]
        self.note(text)
        if self.algo.synchronous and not self.sharded.round_open and self.parked:
            parked, self.parked = self.parked, []
            for p in parked:
                self.launch(p)

    def note(self, text: str) -> None:
        self.training.note(text)
        print(f"stalegrad: {text}", file=sys.stderr, flush=True)

    def finish(self) -> None:
        self.drain()
        self.sync(algorithm_state=True)
        if self.training.checkpoint_every:
            names = sorted(self.actors)
            states = dict(zip(names, self.ray.get([self.actors[m].state.remote() for m in names])))
            self.training.save_checkpoint({"kind": "ray", "now": time.perf_counter() - self.t0,
                                           "workers": [states.get(m) for m in range(self.M)]})
        if self.trace is not None:
            try:
                write_trace(self.rt.record_trace, self.trace)
            except OSError as e:
                self.note(f"the trace could not be written to {self.rt.record_trace} ({e.strerror})")
        s = sorted(self.push_s)
        transport = {"push_ms_median": round(1000 * s[len(s) // 2], 4) if s else None,
                     "push_ms_p90": round(1000 * s[int(0.9 * len(s))], 4) if s else None,
                     "weight_bytes_per_message": 2 * 4 * int(self.server.w.numel()),
                     "shards": self.K}
        self.training.note(workers_lost=self.lost, updates_lost=self.updates_lost, transport=transport)
