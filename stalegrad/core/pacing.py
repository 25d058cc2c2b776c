"""A speed profile made real: each worker waits out its message's drawn time beyond its compute.

The simulator reads a delay model (``core/delays.py``) as its virtual clock. The local and Ray runtimes give
each worker a ``Pacer`` over the same model: when the worker starts a message it draws the message's duration
(``model.duration(worker, rng, now, step_time x local steps)``, ``now`` the second of the run), computes, and
sleeps for whatever the computation left of it. A profile is thereby one repeatable cluster on one machine:
``--delay straggler:5 --runtime local`` is four real processes of which the last pushes a fifth as often.

A worker whose computation takes longer than the drawn time cannot keep to the profile: the message ends
late (no wait), and the pacer counts it, with the time it lacked, so that the run names the worker rather
than hiding the difference (``summary.json``'s ``pacing``). Draws come from a generator of the worker's own,
seeded by the run's seed and the worker's id, so the draws of each worker repeat from run to run whatever the
order in which the workers happen to run.

Without a profile (the default of the local and Ray runtimes) no pacer exists and the workers run as fast as
their cores allow.
"""
from __future__ import annotations

import random
import time
from dataclasses import dataclass, field

from .delays import DelayModel

# An automatic step time keeps the profile's demand to a quarter of the machine's cores: the rest absorbs the
# server, the evaluator, the transport, and a worker's computation stretched by the others on shared cores
# (measured alone it took 1.1 ms a step, 1.7 ms in a run of 4 workers on 2 cores; at half the cores the fast
# workers of straggler:5 overran 6-11% of their messages, other work beside: docs/delays.md, Speed profiles).
HEADROOM = 4.0
# A worker kept to its profile when its overruns added less than this share to its paced time (compute and
# waits): a first message that pays one-off allocations, or a few late by a fraction of a millisecond, do not
# change what the profile means; more than that, and the run names the worker.
LATE_SHARE = 0.01


@dataclass
class Pacer:
    """Worker ``worker``'s clock under ``delay``: ``step_time`` seconds per local step of a speed-1 worker,
    ``steps`` local steps per message; ``t0`` the run's second 0 as ``time.time()`` (shared by every process
    of the run, on one machine or a cluster with synchronised clocks)."""
    delay: DelayModel
    step_time: float
    steps: int
    worker: int
    seed: int
    t0: float
    messages: int = 0
    compute_s: float = 0.0
    waited_s: float = 0.0
    overruns: int = 0
    late_s: float = 0.0        # the seconds the overrun messages lacked, summed
    rng: random.Random = field(init=False, repr=False)
    # the clocks, replaceable in tests: the message's seconds, its sleep, and the run's wall-clock second
    clock = staticmethod(time.perf_counter)
    sleep = staticmethod(time.sleep)
    wall = staticmethod(time.time)

    def __post_init__(self):
        self.rng = random.Random(f"stalegrad-pace/{self.seed}/{self.worker}")   # str seeds hash: stable

    def run(self, compute, *args):
        """``compute(*args)``, then sleep until the message's drawn duration has passed; returns its result."""
        start = self.clock()
        drawn = self.delay.duration(self.worker, self.rng, self.wall() - self.t0, self.step_time * self.steps)
        out = compute(*args)
        spent = self.clock() - start
        self.messages += 1
        self.compute_s += spent
        rest = drawn - spent
        if rest > 0:
            self.sleep(rest)
            self.waited_s += rest
        else:
            self.overruns += 1
            self.late_s -= rest
        return out

    def figures(self) -> dict:
        """This worker's line of ``summary.json``'s ``pacing.per_worker``."""
        return {"worker": self.worker, "messages": self.messages, "compute_s": round(self.compute_s, 6),
                "waited_s": round(self.waited_s, 6), "overruns": self.overruns, "late_s": round(self.late_s, 6)}


def automatic_step_time(delay: DelayModel, num_workers: int, measured_step_s: float, cores: int) -> float:
    """The step time at which the profile's workers, at their fastest, ask for 1/HEADROOM of ``cores``: a
    speed-1 worker computes ``measured_step_s`` per local step, and a worker of factor f asks for 1/f of a core
    at step time ``measured_step_s``. Never below HEADROOM x ``measured_step_s``."""
    demand = sum(1.0 / max(delay.fastest(m), 1e-12) for m in range(num_workers))
    return measured_step_s * HEADROOM * max(1.0, demand / max(1, cores))


def measure_step(factory, threads: int, repeats: int = 7) -> float:
    """The median seconds of one local step (forward and backward on one mini-batch) of ``factory``'s model,
    at ``threads`` torch threads, on a copy of the model and a batch of the training set (no worker's
    mini-batch stream or random state is touched)."""
    import copy
    import statistics

    import torch

    from .worker import FlatModel
    model = FlatModel(copy.deepcopy(factory.model.module), factory.model.flat.device)
    batch = torch.arange(min(factory.batch_size, len(factory.y)))
    x, y = factory.x[batch].to(model.flat.device), factory.y[batch].to(model.flat.device)
    w = factory.w0.clone().to(model.flat.device)
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        with torch.random.fork_rng(devices=[]):
            times = []
            for i in range(repeats + 2):   # two warm-ups
                t = time.perf_counter()
                model.loss_and_grad(w, x, y)
                if model.flat.device.type == "cuda":
                    torch.cuda.synchronize()
                if i >= 2:
                    times.append(time.perf_counter() - t)
    finally:
        torch.set_num_threads(before)
    return statistics.median(times)


@dataclass
class Profile:
    """A run's resolved speed profile: the model, the step time in seconds and where it came from
    ("given", or "auto": ``automatic_step_time`` from ``measured_step_s``)."""
    delay: DelayModel
    step_time: float
    steps: int
    source: str
    measured_step_s: float | None

    def pacer(self, worker: int, seed: int, t0: float) -> Pacer:
        return Pacer(self.delay, self.step_time, self.steps, worker, seed, t0)

    def summary(self, by_worker: dict[int, dict], server, started_s: float | None) -> tuple[dict, str | None]:
        """``summary.json``'s ``pacing`` and a one-line note naming the workers that did not keep to the
        profile (None when every one did): ``by_worker`` the workers' ``Pacer.figures()`` (a worker missing
        from it, lost with its process, counts zeros), ``server`` the run's (each worker's applied updates:
        its staleness log), ``started_s`` the run's second at which the profile's second 0 fell."""
        empty = {"messages": 0, "compute_s": 0.0, "waited_s": 0.0, "overruns": 0, "late_s": 0.0}
        applied = server.staleness.summary()["per_worker"]
        per_worker = [{"worker": m, "updates": applied[m]["updates"],
                       **{k: v for k, v in (by_worker.get(m) or empty).items() if k != "worker"}}
                      for m in range(server.num_workers)]
        late = [f for f in per_worker if f["late_s"] > LATE_SHARE * (f["compute_s"] + f["waited_s"])]
        spec = self.delay.spec or type(self.delay).__name__
        figures = {"delay": spec, "step_time": self.step_time, "step_time_source": self.source,
                   "measured_step_s": self.measured_step_s, "per_worker": per_worker,
                   "overrun_workers": [f["worker"] for f in late], "started_s": started_s}
        if not late:
            return figures, None
        named = ", ".join(f"worker {f['worker']} ({f['overruns']} of {f['messages']} messages late, by "
                          f"{f['late_s'] / f['overruns'] * 1000:.1f} ms on average)" for f in late)
        return figures, (f"speed profile {spec!r} not kept: {named} computed longer than the drawn time; raise "
                         f"--step-time (now {self.step_time:.4g} s) or give the workers more cores")


def check(delay, step_time, num_workers: int, steps: int) -> DelayModel | None:
    """A runtime's ``check``: parse the profile and bound its clock (ConfigError naming the option)."""
    from ..errors import ConfigError, check_finite_positive
    from .delays import check_clock, parse_delay
    if delay is None:
        if step_time is not None:
            raise ConfigError("step_time", "paces the workers of a speed profile: give one with --delay "
                                           "(e.g. --delay straggler:5), or leave --step-time out")
        return None
    model = parse_delay(delay, num_workers) if isinstance(delay, str) else delay
    if step_time is not None:
        check_finite_positive("step_time", step_time)
        check_clock(model, step_time, steps, num_workers)
    return model


def check_run(delay, step_time, config) -> None:
    """``check`` for a run's ``RunConfig`` (resolved here if its algorithm is still a name); nothing to check
    without a profile or a step time."""
    if delay is None and step_time is None:
        return
    if isinstance(config.algorithm, str):
        config = config.validate()
    check(delay, step_time, config.workers, config.algorithm.steps_per_message)


def resolve(delay, step_time, factory, num_workers: int, steps: int, threads: int, cores: int) -> Profile | None:
    """The profile a real runtime paces its workers by (None without ``delay``): the step time as given, else
    sized by ``automatic_step_time`` from one local step measured here."""
    model = check(delay, step_time, num_workers, steps)
    if model is None:
        return None
    measured = measure_step(factory, threads)
    if step_time is None:
        return Profile(model, automatic_step_time(model, num_workers, measured, cores), steps, "auto", measured)
    return Profile(model, float(step_time), steps, "given", measured)


def profile_description(delay, step_time) -> dict:
    """What a real runtime's ``describe()`` (config.json) says of its profile: nothing without one, so that
    a run without a profile records what it always did."""
    if delay is None:
        return {}
    return {"delay": delay if isinstance(delay, str) else delay.spec, "step_time": step_time}
