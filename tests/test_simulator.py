"""The deterministic simulator: staleness patterns, determinism, virtual time."""

import pytest
import torch

import stalegrad as sg
from stalegrad.algorithms import ALGORITHMS, make_algorithm
from stalegrad.runtimes import Simulator

from helpers import TEST, TRAIN, write_trace


def run(algo="asgd", workers=4, delay="round-robin", epochs=1.0, seed=0, batch_size=8, lr=None, **kw):
    algorithm = make_algorithm(algo, **kw) if isinstance(algo, str) else algo
    return sg.train("logreg", TRAIN, TEST, algorithm, workers, Simulator(delay=delay),
                    epochs=epochs, batch_size=batch_size, lr=lr, seed=seed)


def test_round_robin_staleness_is_exactly_m_minus_one_once_warm():
    for M in (1, 3, 8):
        res = run("asgd", workers=M, epochs=2, batch_size=4)
        hist = res.staleness["histogram"]
        # warm-up pushes see 0..M-1 once each; every later push sees exactly M-1
        updates = res.summary["updates"]
        expected = {str(t): 1 for t in range(M - 1)}
        expected[str(M - 1)] = updates - (M - 1)
        assert hist == expected
        assert res.staleness["tau_max"] == M - 1


def test_round_robin_pushes_in_a_fixed_cycle():
    res = run("asgd", workers=3, epochs=0.5, batch_size=8)
    counts = [w["updates"] for w in res.staleness["per_worker"]]
    assert max(counts) - min(counts) <= 1


def test_same_seed_same_weights_other_seed_different():
    a = run("dcasgd-a", workers=4, delay="gamma:2", seed=7)
    b = run("dcasgd-a", workers=4, delay="gamma:2", seed=7)
    c = run("dcasgd-a", workers=4, delay="gamma:2", seed=8)
    assert a.summary["weights_sha256"] == b.summary["weights_sha256"]
    assert torch.equal(a.weights, b.weights)
    assert a.staleness == b.staleness
    assert a.summary["weights_sha256"] != c.summary["weights_sha256"]


def test_heterogeneous_linear_speeds():
    res = run("asgd", workers=3, delay="heterogeneous:linear", epochs=2, batch_size=4)
    counts = [w["updates"] for w in res.staleness["per_worker"]]
    # step times 1, 2, 3: update counts in the ratio 6:3:2 (up to the run's edges)
    assert counts[0] > counts[1] > counts[2]
    assert counts[0] / counts[2] == pytest.approx(3.0, rel=0.1)


def test_straggler_is_slow_and_sees_large_staleness():
    res = run("asgd", workers=4, delay="straggler:10", epochs=2, batch_size=4)
    per = res.staleness["per_worker"]
    assert per[3]["updates"] < per[0]["updates"] / 5
    assert per[3]["tau_mean"] > 10 * per[0]["tau_mean"]


@pytest.mark.parametrize("algo", ["ssgd", "easgd"])
def test_synchronous_rounds_wait_for_the_slowest(algo):
    kw = {} if algo == "ssgd" else {"window": 1}
    fast = run(algo, workers=4, delay="round-robin", epochs=1, batch_size=4, **kw)
    slow = run(algo, workers=4, delay="straggler:5", epochs=1, batch_size=4, **kw)
    rounds = fast.summary["updates"]
    assert rounds == slow.summary["updates"] == fast.summary["samples"] // (4 * 4)
    assert fast.staleness["tau_max"] == 0
    assert fast.summary["virtual_s"] == pytest.approx(rounds * 1.0)
    assert slow.summary["virtual_s"] == pytest.approx(rounds * 5.0)


def test_asgd_does_not_wait_for_the_straggler():
    res = run("asgd", workers=4, delay="straggler:5", epochs=1, batch_size=4)
    # 3 fast workers do ~3 pushes per virtual second
    assert res.summary["virtual_s"] < res.summary["updates"] / 2.5


def test_virtual_time_scales_with_step_time_and_window():
    algorithm = make_algorithm("agn", window=4)
    res = sg.train("logreg", TRAIN, TEST, algorithm, 2, Simulator(delay="round-robin", step_time=0.5), epochs=1,
                   batch_size=8)
    # round robin, 2 workers, each message = 4 steps of 0.5 s: two messages every 2 virtual seconds
    assert res.summary["virtual_s"] == pytest.approx(res.summary["updates"] / 2 * 2.0)


def test_trace_replay_reproduces_the_recorded_staleness(tmp_path):
    # Record a schedule from a gamma run (applied version i was pulled at i - tau),
    # then replay it as a trace with another seed: the tau sequence is identical.
    recorded = _log_of(make_algorithm("asgd"), 4, "gamma:1", seed=3)
    assert len({tau for _, tau in recorded}) > 2          # a genuinely irregular schedule
    trace = tmp_path / "trace.csv"
    write_trace(trace, [(w, i - tau, i, float(i)) for i, (w, tau) in enumerate(recorded)])
    assert _log_of(make_algorithm("asgd"), 4, f"trace:{trace}", seed=99) == recorded


def test_trace_with_late_pulls_is_replayed_exactly(tmp_path):
    # worker 0 pulls again only after worker 1's second push: tau sequence 0,1,0,2,...
    rows = [(0, 0, 0, 1.0), (1, 0, 1, 2.0), (1, 2, 2, 3.0), (0, 3, 3, 4.0), (1, 3, 4, 5.0), (0, 4, 5, 6.0)]
    trace = tmp_path / "t.csv"
    write_trace(trace, rows)
    log = _log_of(make_algorithm("asgd"), 2, f"trace:{trace}", seed=0, limit=len(rows))
    assert log == [(w, a - p) for w, p, a, _ in rows]


def test_trace_of_bare_worker_ids(tmp_path):
    trace = tmp_path / "ids.txt"
    trace.write_text("0\n0\n1\n0\n1\n1\n")
    log = _log_of(make_algorithm("asgd"), 2, f"trace:{trace}", seed=0, limit=6)
    # each worker pulls right after its own push
    assert log == [(0, 0), (0, 0), (1, 2), (0, 1), (1, 1), (1, 0)]


def _log_of(algorithm, workers, delay, seed, limit=None):
    res = sg.train("logreg", TRAIN, TEST, algorithm, workers, Simulator(delay=delay), epochs=1,
                   batch_size=4, seed=seed)
    return res.update_log()[:limit]


@pytest.mark.parametrize("algo", list(ALGORITHMS))
@pytest.mark.parametrize("delay", ["round-robin", "gamma:2", "exponential", "heterogeneous:sqrt", "straggler:3"])
def test_every_algorithm_under_every_delay_model(algo, delay):
    workers = 1 if algo == "sgd" else 3
    kw = {"window": 2} if "window" in {f.name for f in ALGORITHMS[algo].hyperparameters()} else {}
    res = run(algo, workers=workers, delay=delay, epochs=0.5, batch_size=8, **kw)
    assert torch.isfinite(res.weights).all()
    assert res.summary["samples"] >= 0.5 * len(TRAIN.y)
    assert res.metrics[0]["epoch"] == 0 and res.metrics[-1]["samples"] == res.summary["samples"]
    assert sum(w["updates"] for w in res.staleness["per_worker"]) == res.staleness["updates"]


def test_learning_reduces_test_loss():
    res = run("dcasgd-a", workers=4, epochs=3, batch_size=8, lr=0.1)
    assert res.metrics[-1]["test_loss"] < 0.5 * res.metrics[0]["test_loss"]
    assert res.summary["final_test_acc"] > 0.9


def test_one_asynchronous_worker_is_sequential_sgd():
    a = run("sgd", workers=1, epochs=1, seed=4)
    b = run("asgd", workers=1, epochs=1, seed=4)
    c = run("dcasgd-a", workers=1, epochs=1, seed=4)   # tau is always 0: no correction
    assert a.summary["weights_sha256"] == b.summary["weights_sha256"] == c.summary["weights_sha256"]
    assert a.staleness["tau_max"] == 0


def test_ssgd_with_one_worker_is_sequential_sgd():
    a = run("sgd", workers=1, epochs=1, seed=4)
    b = run("ssgd", workers=1, epochs=1, seed=4)
    assert torch.allclose(a.weights, b.weights)


def test_agn_window_one_with_local_sgd_is_asgd():
    # The thesis: "if lambda = 1, AGN is in essence equivalent to DOWNPOUR" (and to ASGD with local SGD).
    a = run("asgd", workers=3, epochs=1, seed=2, lr=0.05)
    b = run("agn", workers=3, epochs=1, seed=2, lr=0.05, window=1, local_opt="sgd")
    assert torch.allclose(a.weights, b.weights, atol=1e-6)


def test_lr_schedule_steps_down_at_milestones():
    algorithm = make_algorithm("asgd")
    res = sg.train("logreg", TRAIN, TEST, algorithm, 2, Simulator(), epochs=4, batch_size=8, lr=0.2,
                   lr_milestones=(2, 3), lr_gamma=0.5, eval_every=1)
    assert [m["lr"] for m in res.metrics] == pytest.approx([0.2, 0.2, 0.1, 0.05, 0.05])


def test_eval_every_sets_the_evaluation_points():
    res = run("asgd", workers=2, epochs=1, batch_size=8)
    half = sg.train("logreg", TRAIN, TEST, make_algorithm("asgd"), 2, Simulator(), epochs=1, batch_size=8,
                    eval_every=0.25)
    assert len(res.metrics) == 2                 # epoch 0 and the end
    assert [round(m["epoch"], 2) for m in half.metrics] == [0, 0.25, 0.5, 0.75, 1.0]


def test_shards_are_disjoint_and_cover_the_data():
    from stalegrad.core.worker import BatchStream
    streams = [BatchStream(100, m, 4, 5, "shard", seed=1) for m in range(4)]
    pools = [set(s.pool.tolist()) for s in streams]
    assert sum(len(p) for p in pools) == 100 and set().union(*pools) == set(range(100))
    for s, pool in zip(streams, pools):
        seen = [i for _ in range(10) for i in s.next().tolist()]
        assert set(seen) <= pool
        assert sorted(seen[:25]) == sorted(pool)    # one pass visits each sample of the shard once
    iid = BatchStream(100, 0, 4, 10, "iid", seed=1)
    assert len({i for _ in range(10) for i in iid.next().tolist()}) == 100


def test_trace_delay_runs_every_algorithm(tmp_path):
    trace = tmp_path / "t.csv"
    write_trace(trace, [(i % 3, max(0, i - 2), i, float(i)) for i in range(30)])
    for algo in ALGORITHMS:
        if algo == "sgd":
            continue
        kw = {"window": 2} if "window" in {f.name for f in ALGORITHMS[algo].hyperparameters()} else {}
        res = run(algo, workers=3, delay=f"trace:{trace}", epochs=0.5, batch_size=8, **kw)
        assert torch.isfinite(res.weights).all() and res.summary["samples"] >= 128


def test_bad_delay_specs():
    for spec, needle in [("gamma:0", "SHAPE"), ("heterogeneous:cubic", "sqrt or linear"), ("straggler:x", "K"),
                         ("zipf", "not a delay model"), ("trace:", "needs a file")]:
        with pytest.raises(ValueError, match=needle):
            run("asgd", workers=2, delay=spec)
