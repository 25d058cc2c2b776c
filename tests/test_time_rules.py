"""The rules that drop stale gradients (issue 41): Ringmaster ASGD, Rennala SGD, m-synchronous SGD.

Each against a float64 reference written here from its paper's rule, with its own count of versions:
through the public ParameterServer on random schedules (random worker order, pulls at random times, NaN
messages, a worker lost), on both kernel paths, and through the simulator with fixed uneven speeds, whose
schedule the reference replays with a heap of its own (finish time, start order, worker). Equal weights to
float32 tolerance, and exactly the same messages dropped.
"""
import heapq
import importlib.util
import io
import json
import math
import random

import numpy as np
import pytest
import torch

import stalegrad as sg
from stalegrad.algorithms import make_algorithm
from stalegrad.cli import main
from stalegrad.core.server import ParameterServer
from stalegrad.core.sharding import ShardedServer, local_shards, shard_bounds
from stalegrad.core.worker import BatchStream
from stalegrad.errors import ConfigError
from stalegrad.runtimes import Simulator

from helpers import TEST, TRAIN, cut, logreg_grad

KERNELS = ["torch", pytest.param("numba", marks=pytest.mark.skipif(
    importlib.util.find_spec("numba") is None, reason="the fused kernels need numba"))]


class Reference:
    """The three rules in float64, from the papers, with their own version count k and pulls.

    ringmaster: tau = k - pulled[m] >= R: ignored; else w <- w - lr*g, k += 1 (R = delay_threshold or M).
    rennala: tau > 0: ignored; else gathered; at the B-th, w <- w - lr*mean, k += 1 (B = rennala_batch or M).
    m-ssgd: tau > 0: ignored; else into the round; once min(m, live) of the live workers sent, w <- w -
    lr*mean of its finite gradients, k += 1 (m = quorum or max(1, M-1)).
    Momentum and weight decay: torch.optim.SGD's, on the applied direction.
    """

    def __init__(self, name, algo, w, M):
        self.name, self.algo, self.M = name, algo, M
        self.w, self.k, self.pulled = w.copy(), 0, [0] * M
        self.buf = np.zeros_like(w)
        self.gathered = []       # rennala: (worker, gradient) at the current point
        self.round = {}          # m-ssgd: worker -> gradient (None: NaN)
        self.live = set(range(M))
        self.log = []            # (worker, tau) of every message an applied update used, in order
        self.dropped = [0] * M
        self.nonfinite = 0

    def pull(self, m):
        self.pulled[m] = self.k
        return self.w.copy()

    def _step(self, d, lr):
        a = self.algo
        d = d + a.weight_decay * self.w
        self.buf = a.momentum * self.buf + d
        self.w = self.w - lr * (self.buf if a.momentum else d)
        self.k += 1

    def push(self, m, g, lr):
        """Returns whether the message was dropped."""
        tau = self.k - self.pulled[m]
        a, M = self.algo, self.M
        limit = (a.delay_threshold or M) if self.name == "ringmaster" else 1
        if tau >= limit:
            self.dropped[m] += 1
            return True
        finite = bool(np.isfinite(g).all())
        if self.name == "m-ssgd":
            if not finite:
                self.nonfinite += 1
            self.round[m] = g if finite else None
            self.close(lr)
        elif not finite:
            self.nonfinite += 1
        elif self.name == "ringmaster":
            self._step(g, lr)
            self.log.append((m, tau))
        else:
            self.gathered.append((m, g))
            if len(self.gathered) == (a.rennala_batch or M):
                self._step(sum(x for _, x in self.gathered) / len(self.gathered), lr)
                self.log += [(k, 0) for k, _ in self.gathered]
                self.gathered = []
        return False

    def close(self, lr):
        """m-ssgd: once min(m, live) live workers sent, the mean of the round's finite gradients, in worker order."""
        q = self.algo.quorum or max(1, self.M - 1)
        sent = len(self.live & set(self.round))
        if not self.live or sent < min(q, len(self.live)):
            return
        members = {m: g for m, g in sorted(self.round.items()) if g is not None}
        self.round = {}
        if members:
            self.log += [(m, self.k - self.pulled[m]) for m in members]
            self._step(sum(members.values()) / len(members), lr)

    def remove(self, m, lr):
        self.live.discard(m)
        self.round.pop(m, None)
        if self.name == "m-ssgd":
            self.close(lr)

    def waiting(self, m):
        return m in self.round


CASES = [
    ("ringmaster", {}), ("ringmaster", {"delay_threshold": 2}),
    ("ringmaster", {"delay_threshold": 3, "momentum": 0.9, "weight_decay": 0.01}),
    ("rennala", {}), ("rennala", {"rennala_batch": 2}), ("rennala", {"rennala_batch": 5, "momentum": 0.5,
                                                                     "weight_decay": 0.01}),
    ("m-ssgd", {}), ("m-ssgd", {"quorum": 2}), ("m-ssgd", {"quorum": 3, "momentum": 0.9, "weight_decay": 0.01}),
]


def random_schedule(name, algo, servers, ref, M=4, n=64, steps=240, seed=0, nan_every=23, remove_at=None,
                    on_step=None):
    """Push and pull at random through every server in ``servers`` (each: push(m, g, lr) -> bool, pull(m),
    waiting(m), last_dropped) and through ``ref``; check they agree after every call."""
    rng = random.Random(f"{name}{seed}")
    gen = torch.Generator().manual_seed(seed)
    synchronous = algo.synchronous
    live = list(range(M))
    parked = []   # synchronous: workers whose message waits in the open round
    for m in range(M):
        for s in servers:
            s.pull(m)
        ref.pull(m)
    dropped_at, taus = [], set()
    for step in range(steps):
        m = rng.choice([k for k in live if k not in parked])
        g = torch.randn(n, generator=gen)
        if step % nan_every == nan_every - 1:
            g[rng.randrange(n)] = float("nan")
        lr = 0.05 if step < steps // 2 else 0.02
        taus.add(ref.k - ref.pulled[m])
        for s in servers:
            s.push(m, g, lr)
        dropped = ref.push(m, g.double().numpy(), lr)
        assert [s.last_dropped for s in servers] == [dropped] * len(servers), step
        if dropped:
            dropped_at.append(step)
        if synchronous:
            parked.append(m)
            expected = [ref.waiting(p) for p in parked]
            assert [[s.waiting(p) for p in parked] for s in servers] == [expected] * len(servers)
            for p in [p for p in parked if not ref.waiting(p)]:   # the round closed, or p's message was dropped
                parked.remove(p)
                for s in servers:
                    s.pull(p)
                ref.pull(p)
        elif rng.random() < 0.7:   # asynchronous: the pusher mostly pulls at once, else later
            for s in servers:
                s.pull(m)
            ref.pull(m)
        if rng.random() < 0.3:     # someone else pulls now: its computation so far is lost, a new one starts
            k = rng.choice([k for k in live if k not in parked])
            for s in servers:
                s.pull(k)
            ref.pull(k)
        if step == remove_at:
            gone = next(k for k in reversed(live) if k not in parked)
            live.remove(gone)
            for s in servers:
                s.remove_worker(gone, lr)
            ref.remove(gone, lr)
            for p in [p for p in parked if not ref.waiting(p)]:
                parked.remove(p)
                for s in servers:
                    s.pull(p)
                ref.pull(p)
        for s in servers:
            assert s.version == ref.k, step
        if on_step is not None:
            on_step(step)
    return dropped_at, taus


@pytest.mark.parametrize("kernels", KERNELS)
@pytest.mark.parametrize("name,params", CASES)
def test_random_schedules_through_the_server_match_the_float64_reference(name, params, kernels):
    M, n = 4, 64
    algo = make_algorithm(name, **params)
    w0 = torch.randn(n, generator=torch.Generator().manual_seed(7))
    server = ParameterServer(algo, w0, M, kernels=kernels)
    assert server.kernels == kernels
    ref = Reference(name, algo, w0.double().numpy(), M)
    state = {}

    def check(step):
        np.testing.assert_allclose(server.w.double().numpy(), ref.w, rtol=1e-4, atol=1e-5)
        if step == 120:   # a server restored from state_dict() (as a checkpoint holds it) continues alike
            saved = io.BytesIO()
            torch.save(server.state_dict(), saved)
            saved.seek(0)
            state["resumed"] = resumed = ParameterServer(algo, torch.zeros(n), M, kernels=kernels)
            resumed.load_state_dict(torch.load(saved, weights_only=True))
            servers.append(resumed)
    servers = [server]
    dropped_at, taus = random_schedule(name, algo, servers, ref, M=M, n=n, remove_at=150, on_step=check)
    resumed = state["resumed"]
    assert torch.equal(resumed.w, server.w)
    for s in (server, resumed):
        assert list(zip(s.staleness.workers, s.staleness.taus)) == ref.log
        assert s.staleness.dropped == ref.dropped and s.updates_dropped == len(dropped_at)
        assert s.nonfinite_skipped == ref.nonfinite
    # every assertion could fail: the schedule dropped messages, applied others, and mixed staleness values
    assert dropped_at and server.version > 20 and ref.nonfinite > 0 and len(taus) > 2
    if name == "rennala":   # several gradients of one worker at one point, and a batch held at a state_dict
        assert any(ref.log[i][0] == ref.log[i + 1][0] for i in range(len(ref.log) - 1))


@pytest.mark.parametrize("name,params", CASES)
def test_shards_drop_hold_and_close_rounds_as_one_server(name, params):
    """K shards and one server, the same random calls (NaN messages, a worker lost): equal everything."""
    M, n = 4, 50
    algo = make_algorithm(name, **params)
    w0 = torch.randn(n, generator=torch.Generator().manual_seed(3))
    one = ParameterServer(algo, w0, M)
    shards, call = local_shards(ParameterServer(algo, w0, M), 3)
    sharded = ShardedServer(call, 3, M, algo.synchronous, algorithm=algo)
    bounds = shard_bounds(n, 3)

    class Split:   # the sharded server, called as one server is
        def __getattr__(self, attr):
            return getattr(sharded, attr)

        def push(self, m, g, lr):
            return sharded.push(m, [g[a:b] for a, b in bounds], lr, bool(torch.isfinite(g).all()))

    ref = Reference(name, algo, w0.double().numpy(), M)

    def check(step):
        assert torch.equal(torch.cat([s.w for s in shards]), one.w), step
        for s in shards:
            assert (s.version, s.pulled_version, s.held, dict.fromkeys(s.round)) == \
                (one.version, one.pulled_version, one.held, dict.fromkeys(one.round))
            assert list(s.staleness.taus) == list(one.staleness.taus) and s.staleness.dropped == one.staleness.dropped
            assert s.nonfinite_skipped == one.nonfinite_skipped
        assert sharded.version == one.version and sharded.held == one.held and set(sharded.round) == set(one.round)
        assert list(sharded.staleness.workers) == list(one.staleness.workers)
        assert list(sharded.staleness.taus) == list(one.staleness.taus)
        assert sharded.staleness.dropped == one.staleness.dropped
    dropped_at, _ = random_schedule(name, algo, [one, Split()], ref, M=M, n=n, remove_at=150, on_step=check)
    assert dropped_at and one.version > 20 and one.nonfinite_skipped > 0


def test_the_rules_drop_and_hold_by_hand():
    lr = 0.5
    # ringmaster, R = 2: tau 0 and 1 applied as asgd, tau 2 dropped whole
    s = ParameterServer(make_algorithm("ringmaster", delay_threshold=2), torch.tensor([0.0]), 3)
    for m in range(3):
        s.pull(m)
    assert s.push(0, torch.tensor([1.0]), lr) and s.push(1, torch.tensor([1.0]), lr)    # tau 0, 1
    assert not s.push(2, torch.tensor([100.0]), lr) and s.last_dropped                  # tau 2
    assert s.w.item() == -1.0 and s.version == 2 and s.staleness.dropped == [0, 0, 1]
    # rennala, B = 3: two held (no version: the next gradient at the same point still has tau 0), one of a
    # fast worker among them, then the step on the mean of three; a gradient of the old point dropped
    s = ParameterServer(make_algorithm("rennala", rennala_batch=3), torch.tensor([0.0]), 2)
    s.pull(0), s.pull(1)
    assert not s.push(0, torch.tensor([1.0]), lr) and not s.last_dropped and s.version == 0
    s.pull(0)
    assert not s.push(0, torch.tensor([2.0]), lr) and s.version == 0 and s.held == [(0, 0), (0, 0)]
    s.pull(0)
    assert s.push(1, torch.tensor([6.0]), lr) and s.version == 1 and s.w.item() == -1.5   # -0.5*(1+2+6)/3
    assert not s.push(0, torch.tensor([9.0]), lr) and s.last_dropped and s.w.item() == -1.5
    assert list(s.staleness.workers) == [0, 0, 1] and s.staleness.dropped == [1, 0]
    # m-ssgd, m = 2 of 3: the round closes at two; the straggler's gradient (tau 1) is dropped and not waiting
    s = ParameterServer(make_algorithm("m-ssgd"), torch.tensor([0.0]), 3)
    for m in range(3):
        s.pull(m)
    assert not s.push(2, torch.tensor([4.0]), lr) and s.waiting(2) and s.round_open
    assert s.push(0, torch.tensor([2.0]), lr) and not s.waiting(2) and s.w.item() == -1.5
    assert not s.push(1, torch.tensor([50.0]), lr) and s.last_dropped and not s.waiting(1)
    assert s.w.item() == -1.5 and s.staleness.summary()["updates_dropped"] == 1
    # ssgd: one push of each worker, as before (round_complete's default is every live worker)
    s = ParameterServer(make_algorithm("ssgd"), torch.tensor([0.0]), 3)
    for m in range(3):
        s.pull(m)
    assert not s.push(0, torch.tensor([1.0]), lr) and not s.push(1, torch.tensor([1.0]), lr)
    assert s.push(2, torch.tensor([1.0]), lr) and s.updates_dropped == 0


def test_parameters_are_checked():
    for name, key in (("ringmaster", "delay_threshold"), ("rennala", "rennala_batch"), ("m-ssgd", "quorum")):
        for bad in (-1, 1.5, True):
            with pytest.raises(ConfigError, match=key):
                make_algorithm(name, **{key: bad})
        with pytest.raises(ConfigError, match="stops"):
            make_algorithm(name, stops="maybe")
    with pytest.raises(ConfigError, match="quorum is 5, more than the 4 workers"):
        make_algorithm("m-ssgd", quorum=5).check_workers(4)
    assert make_algorithm("m-ssgd").m(4) == 3 and make_algorithm("m-ssgd").m(1) == 1
    assert make_algorithm("ringmaster").threshold(6) == 6 and make_algorithm("rennala").batch(6) == 6
    assert make_algorithm("ringmaster", stops="on").stop_threshold(6) == 6
    assert make_algorithm("rennala").stop_threshold(6) is None


def test_an_old_checkpoint_without_the_counts_still_loads():
    algo = make_algorithm("rennala", rennala_batch=2)
    s = ParameterServer(algo, torch.zeros(3), 2)
    s.pull(0), s.pull(1)
    s.push(0, torch.ones(3), 0.1)
    sd = s.state_dict()
    del sd["staleness"]["dropped"], sd["held"]   # as saved before issue 41
    fresh = ParameterServer(algo, torch.zeros(3), 2)
    fresh.load_state_dict(sd)
    assert fresh.staleness.dropped == [0, 0] and fresh.held == []


# ---- the simulator against the reference --------------------------------------------------------------
X = TRAIN.x.double().numpy()
Y = TRAIN.y.numpy()
C, D = 3, X.shape[1]


grad = logreg_grad(X, Y, C)


def reference_run(name, algo, M, w0, streams, messages, lr):
    """The event loop of a fixed computation model, in a few lines: worker m takes sqrt(m + 1) seconds a
    gradient (heterogeneous:sqrt), ties broken by start order; an asynchronous worker starts again after its
    push, a synchronous one once its message no longer waits in a round; with stops, a worker whose pulled
    point falls the threshold behind starts again at once (its computation never finished)."""
    ref = Reference(name, algo, w0, M)
    heap, seq, now, at, parked = [], 0, 0.0, [None] * M, []
    stops = None if algo.stops == "off" else (algo.delay_threshold or M) if name == "ringmaster" else 1
    stopped = [0] * M

    def start(m):
        nonlocal seq
        at[m] = ref.pull(m)
        heapq.heappush(heap, (now + math.sqrt(m + 1), seq, m))
        seq += 1

    for m in range(M):
        start(m)
    for _ in range(messages):
        now, _, m = heapq.heappop(heap)
        ref.push(m, grad(at[m], streams[m].next().numpy()), lr)
        if algo.synchronous:
            parked.append(m)
            for p in [p for p in parked if not ref.waiting(p)]:
                parked.remove(p)
                start(p)
        else:
            start(m)
        if stops is not None:
            stale = sorted({k for _, _, k in heap if ref.k - ref.pulled[k] >= stops})
            heap = [e for e in heap if e[2] not in stale]
            heapq.heapify(heap)
            for k in stale:
                stopped[k] += 1
                start(k)
    return ref, stopped


SIM_CASES = [
    ("ringmaster", {}), ("ringmaster", {"delay_threshold": 2}), ("ringmaster", {"delay_threshold": 2, "stops": "on"}),
    ("rennala", {}), ("rennala", {"rennala_batch": 3, "stops": "on"}), ("rennala", {"rennala_batch": 6}),
    ("m-ssgd", {}), ("m-ssgd", {"quorum": 2, "stops": "on"}), ("m-ssgd", {"quorum": 2, "momentum": 0.9}),
]


def sim_run(algo, M, B=8, lr=0.1, seed=3, **kw):
    torch.manual_seed(seed)
    model = torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(D, C))
    w0 = torch.cat([p.detach().reshape(-1) for p in model.parameters()]).double().numpy()
    res = sg.train(model, TRAIN, TEST, algo, M, Simulator(delay="heterogeneous:sqrt", **kw), epochs=3, batch_size=B,
                   lr=lr, seed=seed)
    return res, w0, [BatchStream(len(Y), m, M, B, "shard", seed) for m in range(M)]


@pytest.mark.parametrize("name,params", SIM_CASES)
def test_the_simulator_matches_the_reference_under_uneven_speeds(name, params):
    M, B, lr = 4, 8, 0.1
    algo = make_algorithm(name, **params)
    res, w0, streams = sim_run(algo, M, B, lr)
    messages = res.summary["samples"] // B
    ref, stopped = reference_run(name, algo, M, w0, streams, messages, lr)
    np.testing.assert_allclose(res.weights.double().numpy(), ref.w, rtol=1e-4, atol=1e-5)
    assert res.update_log() == ref.log and res.summary["updates"] == ref.k
    assert [w["dropped"] for w in res.staleness["per_worker"]] == ref.dropped
    assert res.summary["updates_dropped"] == sum(ref.dropped)
    assert res.summary["samples"] == messages * B   # a dropped message's samples count: the work was done
    if algo.stops == "on":   # nothing arrives late: it was stopped instead
        assert res.summary["updates_dropped"] == 0 and res.summary["computations_stopped"] == sum(stopped) > 0
        assert res.summary["computations_stopped_per_worker"] == stopped
    else:
        assert sum(ref.dropped) > 0 and "computations_stopped" not in res.summary
    vectorised, *_ = sim_run(algo, M, B, lr, vectorised=True)
    if algo.stops == "on":
        assert any("vectorised simulation not used" in n for n in vectorised.summary["notes"])
    assert vectorised.update_log() == res.update_log()
    assert torch.allclose(vectorised.weights, res.weights, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("delay", ["gamma:2", "straggler:3"])
def test_m_ssgd_with_a_quorum_of_every_worker_is_ssgd_bit_for_bit(delay):
    runs = [sg.train("logreg", TRAIN, TEST, algo, 3, Simulator(delay=delay), epochs=2, batch_size=8, seed=1)
            for algo in (make_algorithm("ssgd"), make_algorithm("m-ssgd", quorum=3))]
    assert runs[0].summary["weights_sha256"] == runs[1].summary["weights_sha256"]
    assert runs[0].update_log() == runs[1].update_log() and runs[1].summary["updates_dropped"] == 0
    fewer = sg.train("logreg", TRAIN, TEST, make_algorithm("m-ssgd", quorum=2), 3, Simulator(delay=delay), epochs=2,
                     batch_size=8, seed=1)
    assert fewer.summary["updates_dropped"] > 0 and fewer.summary["weights_sha256"] != runs[0].summary["weights_sha256"]


def test_stops_need_the_simulator_and_no_trace(tmp_path):
    algo = make_algorithm("ringmaster", stops="on")
    with pytest.raises(ConfigError, match="stops is on, which needs the simulator"):
        sg.train("logreg", TRAIN, TEST, algo, 2, sg.LocalRuntime(), epochs=0.1, batch_size=8)
    trace = tmp_path / "t.csv"
    trace.write_text("worker,pulled,applied,wall_s\n0,0,0,1.0\n1,0,1,2.0\n")
    with pytest.raises(ConfigError, match="trace replay"):
        sg.train("logreg", TRAIN, TEST, algo, 2, Simulator(delay=f"trace:{trace}"), epochs=0.1, batch_size=8)


# ---- run files and checkpoints ------------------------------------------------------------------------
def test_updates_dropped_is_in_summary_and_staleness_json(tmp_path, capsys):
    out = tmp_path / "run"
    assert main(["train", "--algo", "rennala", "--workers", "4", "--dataset", "synthetic", "--model", "logreg",
                 "--epochs", "2", "--batch-size", "16", "--rennala-batch", "3", "--quiet", "--out", str(out)]) == 0
    capsys.readouterr()
    summary = json.loads((out / "summary.json").read_text())
    staleness = json.loads((out / "staleness.json").read_text())
    messages = (out / "messages.jsonl").read_text().splitlines()
    per = [w["dropped"] for w in staleness["per_worker"]]
    assert summary["updates_dropped"] == staleness["updates_dropped"] == sum(per) > 0
    # every message is a line of messages.jsonl: dropped, or one of B = 3 gradients of an update (or of the last,
    # unfinished batch); the samples of all of them count
    assert 0 <= len(messages) - summary["updates_dropped"] - 3 * summary["updates"] < 3
    assert summary["samples"] == 16 * len(messages)
    assert staleness["updates"] == 3 * summary["updates"]


@pytest.mark.parametrize("name,params,delay", [("rennala", {"rennala_batch": 2}, "gamma:2"),
                                               ("m-ssgd", {}, "straggler:3"),
                                               ("ringmaster", {"delay_threshold": 2, "stops": "on"}, "gamma:2")])
def test_resumed_run_equals_uninterrupted_run(tmp_path, monkeypatch, name, params, delay):
    def train(path, resume=None):
        torch.manual_seed(0)
        return sg.train("mlp", TRAIN, TEST, make_algorithm(name, **params), 3, Simulator(delay=delay), epochs=2,
                        batch_size=8, seed=5, eval_every=0.5, checkpoint_every=7, checkpoint_path=path, resume=resume)
    full = train(tmp_path / "full.pt")
    cut(train, tmp_path / "cut.pt", monkeypatch, at_version=10)
    saved = torch.load(tmp_path / "cut.pt", weights_only=True)
    assert saved["run"]["server"]["version"] == 7
    resumed = train(tmp_path / "cut.pt", resume=tmp_path / "cut.pt")
    assert resumed.summary["weights_sha256"] == full.summary["weights_sha256"]
    assert resumed.update_log() == full.update_log() and resumed.staleness == full.staleness
    assert full.summary["updates_dropped"] + full.summary.get("computations_stopped", 0) > 0
    for key in ("updates_dropped", "computations_stopped", "samples"):
        assert resumed.summary.get(key) == full.summary.get(key)


def test_the_algorithms_command_lists_the_rules(capsys):
    assert main(["algorithms"]) == 0
    out = capsys.readouterr().out
    for name, flag in (("ringmaster", "--delay-threshold"), ("rennala", "--rennala-batch"), ("m-ssgd", "--quorum")):
        assert f"{name}  (" in out and flag in out
    assert "m-ssgd  (synchronous)" in out and "rennala  (asynchronous)" in out and "--stops" in out


# ---- the local and Ray runtimes -------------------------------------------------------------------------
def accounted(res, name, M, B):
    """Every message is dropped, or one of the messages an update used (or of the last, unfinished update)."""
    s, st = res.summary, res.staleness
    per_update = {"rennala": B, "m-ssgd": M - 1}.get(name, 1)
    messages = s["samples"] // 8
    assert s["updates_dropped"] == st["updates_dropped"] == sum(w["dropped"] for w in st["per_worker"])
    assert st["updates"] == per_update * s["updates"] and sum(w["updates"] for w in st["per_worker"]) == st["updates"]
    assert 0 <= messages - s["updates_dropped"] - per_update * s["updates"] < (per_update if name == "rennala" else M)
    assert s["final_test_acc"] > 0.8   # three well-separated blobs: chance is 1/3


@pytest.mark.parametrize("name", ["ringmaster", "rennala", "m-ssgd"])
def test_the_local_runtime_drops_and_counts(name):
    params = {"ringmaster": {"delay_threshold": 2}}.get(name, {})
    res = sg.train("logreg", TRAIN, TEST, make_algorithm(name, **params), 3, sg.LocalRuntime(), epochs=6,
                   batch_size=8, seed=2)
    accounted(res, name, 3, 3)
    assert res.summary["workers_lost"] == 0 and res.config["runtime"]["name"] == "local"


@pytest.mark.parametrize("name,shards", [("ringmaster", 1), ("rennala", 1), ("rennala", 2), ("m-ssgd", 2)])
def test_ray_drops_and_counts_on_the_direct_and_the_driver_path(name, shards):
    ray = pytest.importorskip("ray", reason="Ray is an optional extra")
    if ray.is_initialized():
        ray.shutdown()
    ray.init(address="local", num_cpus=4, include_dashboard=False, log_to_driver=False)
    try:
        params = {"ringmaster": {"delay_threshold": 2}}.get(name, {})
        res = sg.train("logreg", TRAIN, TEST, make_algorithm(name, **params), 3, sg.RayRuntime(ps_shards=shards),
                       epochs=6, batch_size=8, seed=2)
    finally:
        ray.shutdown()
    accounted(res, name, 3, 3)
    transport = res.summary["transport"]
    assert transport["shards"] == shards and transport.get("path") == ("direct" if shards == 1 and name != "m-ssgd"
                                                                      else None)
