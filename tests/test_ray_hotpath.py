"""The Ray runtime's direct path (issue 33): workers push to and pull from the server shard themselves.

The ledger (``runtimes/ray/ledger.py``) and the plan (``TrainingRun.ahead``) are pure and tested without
Ray; then, on one local Ray instance: one worker gives the simulator's and the driver path's bits, a
forced order (a recorded trace) the same tau and weights across a learning-rate milestone, the driver
stays off the per-update path, and a NaN under ``on_nonfinite="stop"`` stops the run with the server's
one-line error, as on the driver's path.
"""
import random
from types import SimpleNamespace

import pytest
import torch

import stalegrad as sg
from stalegrad.algorithms import make_algorithm
from stalegrad.core.server import NonFiniteError, ParameterServer
from stalegrad.run.config import RunConfig
from stalegrad.run.training import TrainingRun
from stalegrad.runtimes.ray.ledger import GO, HOLD, STALE, STOP, WAIT, Ledger

from helpers import TEST, TRAIN

N = 20


def meta(loss=0.5):
    return (loss, 16, True, 0.9, None)


# ---- the ledger, without Ray -------------------------------------------------------------------
def test_the_ledger_applies_what_one_server_applies_and_stops_where_the_plan_says():
    algo = make_algorithm("dcasgd-a")
    w0 = torch.randn(N, generator=torch.Generator().manual_seed(0))
    one, led = ParameterServer(algo, w0, 2), Ledger(ParameterServer(algo, w0, 2), 1, 0, 0.0, drain=False)
    lrs = [0.1, 0.1, 0.1, 0.05, 0.05, 0.05]
    led.plan(0, lrs[:4], evaluate=[2], last=5, checkpoint=None)
    assert led.pull(0, generation=2) == (STALE,)           # a loop of a generation before
    pulled = {m: one.pull(m) for m in (0, 1)}
    for m in (0, 1):
        status, lr, weights, adopted = led.pull(m, 1)
        assert status == GO and lr == 0.1 and torch.equal(torch.from_numpy(weights), pulled[m]) and adopted == []
    led.adopt(1, "some samples")
    rng = random.Random(0)
    for j, m in enumerate([0, 1, 1, 0]):
        g = torch.randn(N, generator=torch.Generator().manual_seed(rng.randrange(99)))
        one.push(m, g, lrs[j])
        reply = led.push(m, 1, meta(), g.numpy(), None)
        # the rate of the next message with the next weights; after message 3 none is planned
        assert (reply[0] == GO and reply[1] == lrs[j + 1]) if j < 3 else reply == (WAIT, True)
        if j < 3:   # the reply is the next pull
            assert torch.equal(torch.from_numpy(reply[2]), one.pull(m))
            assert reply[3] == (["some samples"] if j == 1 else [])   # worker 1 adopts with its next weights
        if j == 2:
            assert torch.equal(led.snapshots[2]["state"]["w"], one.w)   # the weights after message 2, kept
    g = torch.randn(N)
    assert led.push(0, 1, meta(), g.numpy(), None) == (WAIT, False)   # message 4 is not planned yet
    assert led.server.version == one.version == 4
    led.plan(4, lrs[4:], evaluate=[], last=5, checkpoint=None)
    one.push(0, g, lrs[4])
    assert led.push(0, 1, meta(), g.numpy(), None)[0] == GO
    one.push(1, g, lrs[5])
    assert led.push(1, 1, meta(), g.numpy(), None) == (STOP,)        # message 5 spends the budget
    assert led.push(0, 1, meta(), g.numpy(), None) == (STOP,)        # dropped (no checkpoints)
    assert led.pull(1, 1) == (STOP,)
    records, snapshots, delivered, pulls, mode = led.poll()
    assert [r[:4] for r in records] == [(m, pulled, version, True) for (m, pulled, version) in
                                        [(0, 0, 0), (1, 0, 1), (1, 2, 2), (0, 1, 3), (0, 1, 4), (1, 3, 5)]]
    assert list(snapshots) == [2] and delivered == [1] and pulls == 4 and mode == "done"
    assert torch.equal(led.server.w, one.w) and list(led.server.staleness.taus) == list(one.staleness.taus)
    assert led.poll()[0] == []


def test_the_ledger_holds_every_worker_for_a_checkpoint_and_drains_after_the_budget():
    algo = make_algorithm("asgd")
    led = Ledger(ParameterServer(algo, torch.zeros(N), 2), 0, 10, 0.0, drain=True)
    led.plan(10, [0.1] * 6, evaluate=[], last=14, checkpoint=2)
    led.pull(0, 0), led.pull(1, 0)
    assert led.push(0, 0, meta(), torch.ones(N).numpy(), None)[0] == GO
    assert led.push(1, 0, meta(), torch.ones(N).numpy(), None) == (HOLD,)   # version 2: a checkpoint is due
    assert led.push(0, 0, meta(), torch.ones(N).numpy(), None) == (HOLD,)   # applied (the drain), then held
    assert led.pull(1, 0) == (HOLD,) and led.server.version == 3
    led.plan(16, [0.1], evaluate=[], last=None, checkpoint=6, resume=True)
    assert led.pull(1, 0)[0] == GO and led.pull(0, 0)[0] == GO
    assert led.push(1, 0, meta(), torch.ones(N).numpy(), None)[0] == GO     # message 13
    assert led.push(0, 0, meta(), torch.ones(N).numpy(), None) == (STOP,)   # 14 spends the budget
    assert led.push(1, 0, meta(), torch.ones(N).numpy(), None) == (STOP,)   # applied: the run checkpoints
    assert led.server.version == 6 and [r[0] for r in led.poll()[0]] == [0, 1, 0, 1, 0, 1]


def test_a_message_that_would_stop_the_run_stops_every_worker():
    led = Ledger(ParameterServer(make_algorithm("asgd"), torch.zeros(N), 2, on_nonfinite="stop"), 0, 0, 0.0, False)
    led.plan(0, [0.1] * 4, evaluate=[], last=None, checkpoint=None)
    led.pull(0, 0), led.pull(1, 0)
    with pytest.raises(NonFiniteError):
        led.push(0, 0, meta(), torch.full((N,), float("nan")).numpy(), None)
    assert led.push(1, 0, meta(), torch.ones(N).numpy(), None) == (STOP,) and led.server.version == 0


def test_the_plan_ahead_is_what_the_run_counts():
    config = RunConfig(workers=2, batch_size=16, epochs=3, eval_every=0.3, lr=0.1, lr_milestones=(1.0, 2.0),
                       checkpoint_every=5).validate()
    run = TrainingRun(torch.nn.Linear(8, 3), TRAIN, TEST, config, checkpoint_path="unused.pt")
    run.evaluate()                      # as train() does before the runtime starts
    s = 16
    plan = run.ahead(s, 60)
    assert plan["checkpoint"] == 5 and len(set(plan["lr"])) == 3 and plan["evaluate"] and plan["last"] is not None
    for k in range(60):
        if k == 20:                     # planned again from here: the same tail
            again = run.ahead(s, 40)
            assert again["lr"] == plan["lr"][20:] and [k + 20 for k in again["evaluate"]] == \
                [e for e in plan["evaluate"] if e >= 20] and again["last"] + 20 == plan["last"]
        assert run.lr == plan["lr"][k]
        assert run.evaluation_due(s) == (k in plan["evaluate"])
        assert run.done_after(s) == (k >= plan["last"])
        run.after_push(s, 0.5, float(k))
    assert len(run.metrics) == 1 + len(plan["evaluate"])


# ---- on Ray ------------------------------------------------------------------------------------
ray = pytest.importorskip("ray", reason="Ray is an optional extra (pip install 'ray>=2.9')")
from stalegrad.runtimes import RayRuntime, Simulator  # noqa: E402
from stalegrad.runtimes.ray.actors import ShardActor  # noqa: E402
from stalegrad.runtimes.ray.direct import DirectDriver  # noqa: E402
from stalegrad.runtimes.ray.driver import Driver, ShardLost  # noqa: E402


def test_a_shard_that_dies_while_every_worker_is_held_for_a_checkpoint_is_restored():
    # (the loop without Ray: every worker held, the checkpoint's first call finds the shard restarted)
    calls, training = [], SimpleNamespace(done=False, checkpoint_every=5, checkpoint_due=lambda: True)
    d = object.__new__(DirectDriver)
    d.training, d.loops, d.live, d.mode, d.polls, d.M = training, {}, {0, 1}, "hold", 3, 2

    def checkpoint():
        calls.append("checkpoint")
        raise ShardLost

    def restore_shards():
        calls.append("restore")
        training.done = True

    d.launch, d.checkpoint, d.restore_shards, d.finish = (lambda m: None), checkpoint, restore_shards, \
        (lambda: calls.append("finish"))
    d.run()
    assert calls == ["checkpoint", "restore", "finish"]


@pytest.fixture(scope="module")
def ray_session():
    if ray.is_initialized():
        ray.shutdown()
    ray.init(address="local", num_cpus=4, include_dashboard=False, log_to_driver=False)
    yield
    ray.shutdown()


class DriverPath(RayRuntime):
    def make_driver(self, training, resume):
        return Driver(self, training, resume)


def counting_shard():
    """A shard that counts the calls of each of its methods (``counts``); made in a function, so that Ray
    sends the class by value (the actors cannot import this test module)."""
    class CountingShard(ShardActor):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            self.calls = {}

        def counts(self):
            return self.calls

    def counted(name):
        def method(self, *args, **kwargs):
            self.calls[name] = self.calls.get(name, 0) + 1
            return getattr(ShardActor, name)(self, *args, **kwargs)
        return method
    for name, value in vars(ShardActor).items():
        if not name.startswith("_") and callable(value):
            setattr(CountingShard, name, counted(name))
    return CountingShard


class Counted(RayRuntime):
    """The direct path with a driver that reads the shard once a second, and a shard that counts its calls."""

    def make_driver(self, training, resume):
        runtime = self

        class Slow(DirectDriver):
            shard_actor, poll_s = counting_shard(), 1.0

            def finish(self):
                runtime.counts = ray.get(self.shards[0].counts.remote())
                super().finish()
        return Slow(self, training, resume)


def elsewhere_shard():
    """A shard whose socket no worker reaches, as from another machine: they fall back to Ray calls."""
    class Elsewhere(ShardActor):
        def direct(self, *args):
            _, key = ShardActor.direct(self, *args)
            return "\0stalegrad-shard-on-another-machine", key
    return Elsewhere


class Far(RayRuntime):
    def make_driver(self, training, resume):
        class FarDriver(DirectDriver):
            shard_actor = elsewhere_shard()
        return FarDriver(self, training, resume)


def starved_shard():
    """A shard whose socket's accept fails for good as a process out of descriptors does (EMFILE): the kernel
    queues a worker's connection, and nothing takes it. (Lowering the actor's RLIMIT_NOFILE would starve Ray's
    own connections to it as well, and the run could not fall back.)"""
    class Starved(ShardActor):
        def direct(self, *args):
            import errno
            import os
            import time
            from stalegrad.runtimes.ray import channel
            real = channel.Listener

            class Full(real):
                def accept(self):
                    time.sleep(0.05)
                    raise OSError(errno.EMFILE, os.strerror(errno.EMFILE))
            channel.Listener = Full   # (in this actor's process only)
            try:
                return ShardActor.direct(self, *args)
            finally:
                channel.Listener = real
    return Starved


class Starved(RayRuntime):
    def make_driver(self, training, resume):
        class StarvedDriver(DirectDriver):
            shard_actor = starved_shard()
        return StarvedDriver(self, training, resume)


def run(runtime, workers=1, **kw):
    options = dict(epochs=2, batch_size=16, eval_every=0.5, seed=5, lr=0.05, lr_milestones=(1.0,), lr_gamma=0.5)
    return sg.train("mlp", TRAIN, TEST, "dcasgd-a", workers, runtime, **{**options, **kw})


def test_one_worker_gives_the_simulators_bits_on_either_path(ray_session, tmp_path):
    kw = dict(checkpoint_every=7)       # held for a checkpoint every 7 updates, with a milestone at epoch 1
    direct = run(RayRuntime(), checkpoint_path=tmp_path / "a.pt", **kw)
    by_ray_calls = run(RayRuntime(same_node_socket=False), checkpoint_path=tmp_path / "d.pt", **kw)
    far = run(Far(), checkpoint_path=tmp_path / "e.pt", **kw)
    driver = run(DriverPath(), checkpoint_path=tmp_path / "b.pt", **kw)
    sim = run(Simulator(delay="round-robin"), checkpoint_path=tmp_path / "c.pt", **kw)
    assert direct.summary["transport"]["path"] == "direct" and "path" not in driver.summary["transport"]
    # the worker pushed through the shard's socket (every push, and a pull at each start after a checkpoint)
    assert direct.summary["transport"]["socket_calls"] > direct.summary["updates"]
    assert by_ray_calls.summary["transport"]["socket_calls"] == far.summary["transport"]["socket_calls"] == 0
    for other in (by_ray_calls, far, driver, sim):
        assert direct.summary["weights_sha256"] == other.summary["weights_sha256"]
        assert direct.update_log() == other.update_log()
        assert [(m["updates"], m["lr"], m["test_acc"]) for m in direct.metrics] == \
            [(m["updates"], m["lr"], m["test_acc"]) for m in other.metrics]
    assert {m["lr"] for m in direct.metrics} == {0.05, 0.025}
    assert torch.load(tmp_path / "a.pt", weights_only=True)["run"]["server"]["version"] == direct.summary["updates"]


def test_the_driver_stays_off_the_per_update_path_and_a_forced_order_replays(ray_session, tmp_path):
    path = tmp_path / "trace.csv"
    rt = Counted(record_trace=path)
    real = run(rt, workers=3, epochs=10, eval_every=2.0, lr_milestones=(5.0,))
    replay = run(Simulator(delay=f"trace:{path}"), workers=3, epochs=10, eval_every=2.0, lr_milestones=(5.0,))
    updates = real.summary["updates"]
    assert real.staleness["tau_max"] >= 1 and updates >= 160     # workers overlapped
    assert replay.update_log() == real.update_log()              # every push saw the recorded tau and rate
    assert replay.summary["weights_sha256"] == real.summary["weights_sha256"]
    # every evaluation saw the weights after its message, though the driver read them up to a second later
    assert [(m["updates"], m["lr"], m["test_acc"]) for m in real.metrics] == \
        [(m["updates"], m["lr"], m["test_acc"]) for m in replay.metrics]
    # the workers called the shard once per message; the driver a few times in the whole run
    counts = rt.counts
    assert counts["push_direct"] >= updates and counts["pull_direct"] == 3
    by_driver = sum(n for name, n in counts.items() if name not in ("push_direct", "pull_direct"))
    # (set-up: load, ping, direct, plan; the end: state; in between one poll a second or when a worker stops)
    assert by_driver <= 8 + real.summary["wall_s"], counts
    assert by_driver < updates / 4, counts


def test_a_nan_under_on_nonfinite_stop_stops_the_run(ray_session):
    # the first update applies and makes the weights huge; the next message or update is not finite
    with pytest.raises(NonFiniteError, match=r"^(update|message) from worker \d contains NaN or Inf \(version \d\)"):
        run(RayRuntime(), workers=2, lr=1e38, lr_milestones=(), on_nonfinite="stop")


def test_a_run_whose_shard_socket_is_out_of_descriptors_finishes_on_ray_calls_and_says_so_once(ray_session, tmp_path,
                                                                                                capsys):
    path = tmp_path / "trace.csv"
    starved = run(Starved(record_trace=path), workers=2, epochs=0.5, lr_milestones=())
    transport = starved.summary["transport"]
    assert transport["path"] == "direct" and transport["socket_calls"] == 0 and transport["socket_fallbacks"] == 2
    said = [n for n in starved.summary["notes"] if "socket" in n]
    assert said == ["2 of 2 workers could not use the server shard's socket on their machine (it could not accept "
                    "them: Too many open files) and made their calls through Ray instead: the same bits, more time "
                    "a message"]
    assert capsys.readouterr().err.count("socket") == 1   # one line, not one a worker or a message
    # the same bits as the simulator replaying the run's order
    replay = run(Simulator(delay=f"trace:{path}"), workers=2, epochs=0.5, lr_milestones=())
    assert starved.summary["updates"] == replay.summary["updates"] == 256 // 2 // 16   # half of TRAIN
    assert replay.summary["weights_sha256"] == starved.summary["weights_sha256"]
