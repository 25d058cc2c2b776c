"""The driver's path of a Ray run: the asynchronous loop, in the style of Ray's parameter-server example
(runs with several shards, synchronous and elastic rules; one shard and an asynchronous rule that pulls
before computing take the direct path, ``direct.py``, a subclass).

    start every worker: step.remote(lr, *pulled slices)
    loop: ray.wait for whichever worker finishes first; push its message to the
          shards (prepare, commit); account; start it again (synchronous rules:
          when the round closes)

The training run (``Training``) stays in the driver. Its ``server`` is brought
up to date from the shards before an evaluation, a checkpoint and at the end
(``load_state_dict``, without the algorithm state for an evaluation).
The elastic rules (``pull_before_compute`` false) exchange with the centre
atomically: the driver pulls the centre for worker m only when m's local steps
are done and pushes m's message before any other, as the simulator does, so
that a recorded trace replays exactly (tau is 0 for them, as there).

Once the budget is spent no worker starts again; the messages still running
are pushed only when the run writes checkpoints (the final checkpoint must hold
workers between two messages), else dropped, as the local runtime does.

Faults: a worker actor that dies is restarted once if the cluster has room
within ``restart_timeout`` seconds, else dropped and its samples given to the
survivors; a shard that dies is restarted by Ray (``max_restarts``) and the
shards go back to the last checkpoint's server state, held in the driver
(``actors.ShardActor`` refuses every call until the driver has loaded it, so a
restart is noticed however quick it was).
"""
from __future__ import annotations

import sys
import time

import torch

from ...core.delays import write_trace
from ...errors import RunError
from ...core.server import NonFiniteError
from ...core.sharding import ShardedServer, merge_states, shard_bounds, split_state
from .actors import ShardActor, ShardRestarted, WorkerActor, to_numpy, to_torch
from .connect import shard_placement, wait_started
from .recovery import Recovery
from .reports import Reports


class ShardLost(Exception):
    pass


def _restarted(e: BaseException) -> bool:
    """Whether a Ray task error comes from a shard that was restarted (``ShardRestarted``)."""
    return isinstance(e, ShardRestarted) or isinstance(getattr(e, "cause", None), ShardRestarted)


class Driver(Recovery, Reports):
    # the actor classes (a subclass may time them: benchmarks/archive/bench_ray.py --profile)
    shard_actor, worker_actor = ShardActor, WorkerActor

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
        # object ref of a worker's meta -> (worker, message slice refs, kind, the pulled slices' refs)
        self.futures: dict = {}
        self.parked: list[int] = []
        self.live: set[int] = set(range(self.M))
        self.lost, self.updates_lost, self.pushes = 0, 0, [0] * self.M
        self.push_s: list[float] = []
        self.committed = None   # one shard: the verdict of the commit that prepare_commit already made
        self.pull_next = None   # the worker whose pull rides with the commit of the push under way
        self.prefetched = None  # (worker, its pulled slices' refs): that pull, for launch to take
        self.pulls_with_push = 0
        self.trace = [] if runtime.record_trace is not None else None
        self.profile = self.profile_t0 = self.profile_started_s = None   # a speed profile: reports.py
        self.snapshot: list[dict] | None = None   # the shards' state at the last checkpoint (or the resumed one)
        self.pools = [self.factory.stream(m).pool for m in range(self.M)]
        if resume:
            self.pools = [torch.as_tensor(s["stream"]["pool"]) if s is not None else None for s in resume["workers"]]
            self.live = {m for m in range(self.M) if resume["workers"][m] is not None}

    # ---- set-up and tear-down ------------------------------------------------------
    def start(self) -> None:
        ray, rt = self.ray, self.rt
        per_element = self.algo.per_element_state
        parts = split_state(self.server.state_dict(), self.bounds, per_element)
        shard_cls = ray.remote(num_cpus=0, max_restarts=rt.max_restarts, max_task_retries=0)(self.shard_actor)
        shard_cls = shard_cls.options(**shard_placement(ray, rt.shard_resources))
        self.shards = [shard_cls.remote(self.algo, b - a, self.M, self.server.on_nonfinite) for a, b in self.bounds]
        parts = [to_numpy(p) for p in parts]
        self.ray.get([s.load.remote(p) for s, p in zip(self.shards, parts)])
        if self.resume:   # the resumed state is a checkpoint: a shard that dies goes back to it
            self.snapshot = parts
        self.sharded = ShardedServer(self._call, self.K, self.M, self.algo.synchronous, algorithm=self.algo)
        self.sharded.version = self.server.version
        self.sharded.pulled_version = list(self.server.pulled_version)
        self.sharded.staleness.dropped = list(self.server.staleness.dropped)
        self.sharded.held = list(self.server.held)
        self.sharded.live = set(self.server.live) & self.live
        self.request = {"CPU": rt.cpus_per_worker, "GPU": rt.gpus_per_worker, **(rt.worker_resources or {})}
        self.worker_cls = ray.remote(num_cpus=rt.cpus_per_worker, num_gpus=rt.gpus_per_worker,
                                     max_restarts=0)(self.worker_actor)
        if rt.worker_resources:
            self.worker_cls = self.worker_cls.options(resources=dict(rt.worker_resources))
        self.blob = self.factory.module_blob()
        self.x = ray.put(self.factory.x.cpu().numpy())
        self.y = ray.put(self.factory.y.cpu().numpy())
        self.portable = self.factory.portable(None, None)
        self.threads = max(1, int(rt.cpus_per_worker))
        self.actors = {}
        states = self.resume["workers"] if self.resume else [None] * self.M
        for m in sorted(self.live):
            self.actors[m] = self._new_worker(m, to_numpy(states[m]))
        for m in wait_started(ray, self.shards, self.actors, self.request,
                              lambda text: print(f"stalegrad: {text}", file=sys.stderr)):
            self.replace_worker(m, launch=False)   # its node died as it started
        self.start_profile()   # every worker has started: the profile's second 0 is now

    def _new_worker(self, m: int, state=None, pool=None):
        device = self.factory.device
        if device == "cuda":
            device = "cuda:0"   # Ray sets CUDA_VISIBLE_DEVICES per actor: its GPU is device 0
        w0 = self.server.w.detach().cpu().numpy()
        return self.worker_cls.remote(m, self.portable, self.blob, self.x, self.y, w0, self.bounds, device,
                                      self.threads, state, pool, self.pacer(m))

    def stop(self) -> None:
        for actor in list(getattr(self, "actors", {}).values()) + list(getattr(self, "shards", [])):
            try:
                self.ray.kill(actor, no_restart=True)
            except Exception:
                pass

    # ---- transport ------------------------------------------------------------------
    def _call(self, method: str, args) -> list:
        if self.K == 1 and method == "commit" and self.committed is not None:
            applied, self.committed = self.committed, None   # (done by prepare_commit with the prepare)
            return [applied]
        if self.prefetched is not None:   # only launch's pull (or an evaluation's state) may follow it
            worker, refs = self.prefetched
            if method == "pull" and args[0][0] == worker:
                self.prefetched = None
                self.pulls_with_push += 1
                return refs        # (made by the shards right after the commit: see push)
            if method != "state":
                raise RuntimeError(f"the shards pulled for worker {worker} with its push, but the next call "
                                   f"is {method}{tuple(args[0])}: the shards' call order would differ")
        self.committed = None
        fused = self.K == 1 and method == "prepare"   # one shard: prepare and commit in one round trip
        name = "prepare_commit" if fused else method
        if self.pull_next is not None and name in ("prepare_commit", "commit"):
            # ... and the pull that launch would send next, in the same call (its second return)
            pairs = [getattr(s, name + "_pull").options(num_returns=2).remote(*a, self.pull_next)
                     for s, a in zip(self.shards, args)]
            refs = [p[0] for p in pairs]
            self.prefetched, self.pull_next = (self.pull_next, [p[1] for p in pairs]), None
        else:
            refs = [getattr(s, name).remote(*a) for s, a in zip(self.shards, args)]
        if method == "pull":
            return refs            # handed to the worker: the object store moves them, not the driver
        try:
            answers = self._get(refs)
        except BaseException:
            if self.prefetched is not None:   # (a failed push: nobody takes that pull)
                self.settle(self.prefetched[1], timeout=1.0)
                self.prefetched = None
            raise
        if fused:
            prepared, self.committed = answers[0]
            return [prepared]
        return answers

    def _get(self, refs: list) -> list:
        """The shards' answers, with their failures as ``NonFiniteError`` or ``ShardLost``."""
        try:
            return self.ray.get(refs)
        except self.ray.exceptions.RayTaskError as e:
            if isinstance(e.cause, NonFiniteError):
                raise NonFiniteError(str(e.cause)) from None
            if _restarted(e):
                raise ShardLost from None
            raise
        except self.ray.exceptions.RayActorError:
            raise ShardLost from None

    def shards_lost(self) -> bool:
        """Whether a shard died or was restarted (a worker's failed task may be a shard's failed pull)."""
        try:
            answers = self.ray.get([s.ping.remote() for s in self.shards], timeout=self.rt.restart_timeout)
        except (self.ray.exceptions.RayActorError, self.ray.exceptions.GetTimeoutError):
            return True
        return not all(loaded for _, loaded in answers)

    def launch(self, m: int) -> None:
        actor, lr = self.actors[m], self.training.lr
        if self.algo.pull_before_compute:
            pulled = self.sharded.pull(m)
            refs = actor.step.options(num_returns=1 + self.K).remote(lr, *pulled)
            self.futures[refs[0]] = (m, refs[1:], "step", pulled)
        else:
            ref = actor.compute.remote(lr)
            self.futures[ref] = (m, [], "compute", [])

    def give_samples(self, m: int, part: torch.Tensor) -> None:
        """Worker m adopts a lost worker's samples (after the message it is computing)."""
        self.actors[m].adopt.remote(part.numpy())

    def settle(self, refs: list, timeout: float | None = None) -> None:
        """Fetch (and drop) the results of abandoned refs: a failed one never fetched makes Ray
        print an "Unhandled error" with its traceback when it is freed, for a fault already handled."""
        ready, _ = self.ray.wait(refs, num_returns=len(refs), timeout=timeout) if refs else ([], [])
        for r in ready:
            try:
                self.ray.get(r)
            except Exception:
                pass

    # ---- the loop -------------------------------------------------------------------
    def run(self) -> None:
        training = self.training
        if not training.done:
            for m in sorted(self.live):
                self.launch(m)
        while not training.done:
            if not self.futures:
                raise RunError(f"all {self.M} workers were lost; see the notes above")
            try:
                m, meta, slices = self.next_message()
                if meta is not None:
                    self.on_message(m, meta, slices)
            except ShardLost:
                self.restore_shards()
        self.finish()

    def next_message(self, launch: bool = True):
        """Wait for whichever worker finishes first: (worker, meta, message slices); meta is None when
        that worker died (it was replaced or dropped; ``launch``: a replacement starts at once)."""
        ray = self.ray
        ready, _ = ray.wait(list(self.futures), num_returns=1)
        m, slices, kind, pulled = self.futures.pop(ready[0])
        refs = [ready[0], *slices, *pulled]
        try:
            meta = ray.get(ready[0])
            if kind == "compute":   # elastic rules: exchange with the centre now, before any other push
                pulled = self.sharded.pull(m)
                finished = self.actors[m].finish.options(num_returns=1 + self.K).remote(*pulled)
                refs = [*finished, *pulled]
                meta, slices = ray.get(finished[0]), finished[1:]
            self.held = ray.get(list(slices))   # pinned here: a message on a node that dies is not lost mid-push
        except (ray.exceptions.RayActorError, ray.exceptions.ObjectLostError):
            self.settle(refs, timeout=1.0)
            if self.shards_lost():    # a failed pull, not the worker
                raise ShardLost from None
            self.replace_worker(m, launch=launch)
            return m, None, None
        except ray.exceptions.RayTaskError as e:
            self.settle(refs, timeout=1.0)
            if _restarted(e):
                raise ShardLost from None
            raise RunError(f"worker {m} failed: {str(e.cause).splitlines()[0] if e.cause else e}") from None
        return m, meta, slices

    def relaunch_follows(self, m: int, samples: int) -> bool:
        """Whether, once this message of worker m is pushed, the next call to the shards is m's pull
        (``on_message``: an asynchronous rule that pulls before computing, with the budget not spent and
        no checkpoint due after the push, even if the update applies)."""
        algo, training = self.algo, self.training
        return (algo.pull_before_compute and not algo.synchronous and m in self.live
                and not training.done_after(samples) and not training.checkpoint_due(self.sharded.version + 1))

    def push(self, m: int, meta: tuple, slices: list, relaunch: bool = False) -> None:
        """Push worker m's message to the shards, record it and account for it (evaluating when due);
        ``relaunch``: m starts again right after, so its pull travels with the push (one round trip)."""
        loss, samples, finite, train_acc = meta
        training, sharded = self.training, self.sharded
        now = time.perf_counter() - self.t0
        pulled, version = sharded.pulled_version[m], sharded.version
        t = time.perf_counter()
        self.pull_next = m if relaunch and self.relaunch_follows(m, samples) else None
        try:
            sharded.push(m, slices, training.lr, finite)
        finally:
            self.pull_next = None
        self.held = None   # (no reference left to a message on a worker's node: its loss is nothing to recover)
        self.push_s.append(time.perf_counter() - t)
        self.server.version = sharded.version   # the training run's clock: checkpoint_due() reads it
        self.pushes[m] += 1
        if self.trace is not None:
            self.trace.append((m, pulled, version, now))
        if training.evaluation_due(samples):
            self.sync(algorithm_state=False)
        training.after_push(samples, loss, now, train_acc=train_acc)

    def on_message(self, m: int, meta: tuple, slices: list) -> None:
        training = self.training
        self.push(m, meta, slices, relaunch=True)
        if training.checkpoint_due() and not training.done:
            self.checkpoint(also_running=m)
            return
        self.continue_after_push(m)

    def continue_after_push(self, m: int) -> None:
        if self.training.done:     # the budget is spent: nobody starts again
            return
        if not self.algo.synchronous:
            self.launch(m)
            return
        self.parked.append(m)
        self.release()

    def release(self) -> None:
        """Synchronous rules: the parked workers whose message no longer waits in an open round (it closed, or
        the rule dropped the message: m-ssgd's late straggler) start again, in the order they were parked."""
        parked, self.parked = self.parked, []
        for p in parked:
            if self.sharded.waiting(p):
                self.parked.append(p)
            elif p in self.live:
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
            m, meta, slices = self.next_message(launch=False)
            if meta is not None:
                self.push(m, meta, slices)
            freed.append(m)          # (a worker that died: its replacement, if any)
        return freed

    def checkpoint(self, also_running: int | None = None) -> None:
        """A consistent cut: no message in flight, every worker between two messages."""
        freed = self.drain() + ([also_running] if also_running is not None else [])
        self.snapshot = self.sync(algorithm_state=True)
        self.save()
        if self.training.done:
            return
        if self.algo.synchronous:   # the round's members wait for it to close; the others owe it a message
            self.parked = [p for p in sorted(self.live) if p in self.sharded.round]
            freed = [p for p in self.live if p not in self.sharded.round]
        for m in sorted(set(freed)):
            if m in self.live and not any(entry[0] == m for entry in self.futures.values()):
                self.launch(m)

    def save(self) -> None:
        """Save a checkpoint with every worker's state (as tensors: a checkpoint is loaded with
        ``torch.load(weights_only=True)``, which refuses numpy arrays)."""
        names = sorted(self.actors)
        states = dict(zip(names, self.ray.get([self.actors[m].state.remote() for m in names])))
        workers = [to_torch(states[m]) if m in states else None for m in range(self.M)]
        self.training.save_checkpoint({"kind": "ray", "now": time.perf_counter() - self.t0, "workers": workers})

    def note(self, text: str) -> None:
        self.training.note(text)
        print(f"stalegrad: {text}", file=sys.stderr, flush=True)

    def finish(self) -> None:
        if self.training.checkpoint_every:   # the final checkpoint holds every worker between two messages
            try:
                self.drain()
            except ShardLost:
                self.restore_shards(launch=False)
        else:                                # messages that started before the budget was spent: dropped
            self.futures.clear()
        self.sync(algorithm_state=True)
        if self.training.checkpoint_every:
            self.save()
        if self.trace is not None:
            try:
                write_trace(self.rt.record_trace, self.trace)
            except OSError as e:
                self.note(f"the trace could not be written to {self.rt.record_trace} ({e.strerror})")
        self.training.note(workers_lost=self.lost, updates_lost=self.updates_lost, transport=self.transport())
        if self.profile is not None:
            self.report_pacing()
