"""Speed profiles (issue 41): one delay model for the simulator's clock and for the real runtimes, where each
worker waits out its message's drawn time (core/pacing.py). Durations against hand values, the pacer against a
fake clock, and real runs whose shares of the updates follow the profile."""
import json
import math
import random
import statistics

import pytest

import stalegrad as sg
from stalegrad.cli import main
from stalegrad.core import pacing
from stalegrad.core.delays import LogNormal, Pause, Slowdown, parse_delay
from stalegrad.errors import ConfigError
from stalegrad.runtimes import Simulator

from helpers import TEST, TRAIN


# ---- the models ------------------------------------------------------------------------------
def test_slowdown_changes_the_last_worker_from_second_t():
    model = parse_delay("slowdown:4@30", 3)
    assert isinstance(model, Slowdown) and (model.slowdown, model.at) == (4.0, 30.0)
    rng = random.Random(0)
    assert model.duration(2, rng, 29.99, 0.5) == 0.5
    assert model.duration(2, rng, 30.0, 0.5) == 2.0
    assert model.duration(1, rng, 100.0, 0.5) == 0.5     # not the last worker
    assert model.fastest(2) == 1.0                        # it starts at full speed


def test_pause_stops_the_last_worker_for_d_seconds_at_t():
    model = parse_delay("pause:10@30", 4)
    assert isinstance(model, Pause)
    rng = random.Random(0)
    assert model.duration(3, rng, 20.0, 1.0) == 1.0       # ends before the pause
    assert model.duration(3, rng, 29.5, 1.0) == 11.0      # under way at 30: ends 10 s later, at 40.5
    assert model.duration(3, rng, 30.0, 1.0) == 11.0      # starts in the pause: at 40, ends at 41
    assert model.duration(3, rng, 35.0, 1.0) == 6.0       # likewise: 35 + 6 = 41
    assert model.duration(3, rng, 40.0, 1.0) == 1.0       # after it
    assert model.duration(0, rng, 30.0, 1.0) == 1.0       # another worker


def test_lognormal_has_mean_one_and_the_median_of_its_sigma():
    model = parse_delay("lognormal:1", 2)
    assert isinstance(model, LogNormal)
    rng = random.Random(7)
    draws = [model.duration(0, rng, 0.0, 1.0) for _ in range(200_000)]
    assert statistics.fmean(draws) == pytest.approx(1.0, rel=0.02)
    assert statistics.median(draws) == pytest.approx(math.exp(-0.5), rel=0.02)
    assert max(draws) < model.longest(2)


def test_the_old_models_draw_exactly_as_before():
    """duration() scales base by factor(): the simulator's clock (and so weights_sha256) is unchanged."""
    for spec in ("gamma:2", "exponential", "heterogeneous:sqrt", "straggler:10", "round-robin"):
        model = parse_delay(spec, 4)
        a, b = random.Random(3), random.Random(3)
        for m in (0, 3, 1, 2):
            assert model.duration(m, a, 5.0, 0.25 * 3) == 0.25 * 3 * model.factor(m, b)


@pytest.mark.parametrize("spec, message", [
    ("lognormal:9", "SIGMA must be a number from 0.01 to 3, e.g. lognormal:1"),
    ("slowdown:4", "slowdown takes K@T (T in seconds), e.g. slowdown:4@30"),
    ("slowdown:0.5@3", "K must be a number from 1 to 1e+12"),
    ("pause:10@x", "T must be a number from 0 to 1e+12"),
    ("pause:nan@3", "D must be a number from 0 to 1e+12"),
])
def test_bad_profiles_name_the_fix(spec, message):
    with pytest.raises(ConfigError, match=message.replace("+", r"\+").replace("(", r"\(").replace(")", r"\)")):
        parse_delay(spec, 4)


# ---- the pacer ---------------------------------------------------------------------------------
class FakeTime:
    """A clock that a computation advances by what it says it took, and a sleep that advances it."""

    def __init__(self):
        self.now = 0.0
        self.slept = []

    def sleep(self, s):
        self.slept.append(s)
        self.now += s

    def work(self, seconds):
        self.now += seconds
        return seconds


def fake_pacer(spec, worker, step_time, M=4, steps=1):
    t = FakeTime()
    p = pacing.Pacer(parse_delay(spec, M), step_time, steps, worker, seed=0, t0=0.0)
    p.clock = p.wall = lambda: t.now
    p.sleep = t.sleep
    return p, t


def test_a_worker_sleeps_what_its_computation_leaves_of_the_drawn_time():
    p, t = fake_pacer("straggler:5", worker=3, step_time=0.01, steps=2)   # drawn: 0.01 x 2 x 5 = 0.1 s
    assert p.run(t.work, 0.03) == 0.03
    assert t.slept == [pytest.approx(0.07)] and t.now == pytest.approx(0.1)
    p.run(t.work, 0.04)
    assert t.now == pytest.approx(0.2)
    f = p.figures()
    assert (f["messages"], f["overruns"], f["late_s"]) == (2, 0, 0.0)
    assert f["compute_s"] == pytest.approx(0.07) and f["waited_s"] == pytest.approx(0.13)


def test_a_worker_slower_than_its_profile_is_counted_and_named():
    p, t = fake_pacer("round-robin", worker=1, step_time=0.01)
    for compute in (0.004, 0.015, 0.005, 0.012):
        p.run(t.work, compute)
    f = p.figures()
    assert (f["messages"], f["overruns"]) == (4, 2)
    assert f["late_s"] == pytest.approx(0.005 + 0.002)
    assert f["waited_s"] == pytest.approx(0.006 + 0.005)
    quiet = {"worker": 0, "messages": 4, "compute_s": 0.02, "waited_s": 0.02, "overruns": 0, "late_s": 0.0}
    from stalegrad.core.staleness import StalenessLog
    server = type("Server", (), {"num_workers": 2, "staleness": StalenessLog(2)})()
    for m in (0, 1, 0, 1, 0, 1, 0):   # 4 and 3 applied updates
        server.staleness.record(m, 1)
    profile = pacing.Profile(parse_delay("round-robin", 2), 0.01, 1, "given", None)
    report, text = profile.summary({0: quiet, 1: f}, server, 0.5)
    assert report["overrun_workers"] == [1] and report["per_worker"][1]["updates"] == 3
    assert report["per_worker"][0]["updates"] == 4 and report["started_s"] == 0.5
    assert "worker 1 (2 of 4 messages late, by 3.5 ms on average)" in text and "\n" not in text
    assert "raise --step-time" in text
    # late by 1% of its paced time or less: kept (a first message's allocations)
    barely = {**quiet, "worker": 1, "overruns": 1, "late_s": 0.0004}
    assert profile.summary({0: quiet, 1: barely}, server, 0.5)[1] is None
    # a worker without figures (lost with its process) counts zeros
    assert profile.summary({0: quiet}, server, 0.5)[0]["per_worker"][1]["messages"] == 0


def test_a_time_changing_profile_reads_the_run_s_second():
    p, t = fake_pacer("slowdown:3@1", worker=3, step_time=0.25)
    while t.now < 2.0:
        p.run(t.work, 0.01)
    # 4 messages of 0.25 s up to second 1, then 0.75 s each
    assert t.now == pytest.approx(1.0 + 2 * 0.75)
    assert p.messages == 6


def test_each_worker_draws_from_its_own_stream_whatever_the_order():
    a = [pacing.Pacer(parse_delay("gamma:2", 3), 1.0, 1, m, seed=5, t0=0.0) for m in range(3)]
    b = [pacing.Pacer(parse_delay("gamma:2", 3), 1.0, 1, m, seed=5, t0=0.0) for m in range(3)]
    first = [[p.delay.duration(p.worker, p.rng, 0.0, 1.0) for _ in range(3)] for p in a]
    second = [[p.delay.duration(p.worker, p.rng, 0.0, 1.0) for _ in range(3)] for p in reversed(b)][::-1]
    assert first == second and first[0] != first[1]
    other_seed = pacing.Pacer(parse_delay("gamma:2", 3), 1.0, 1, 0, seed=6, t0=0.0)
    assert other_seed.delay.duration(0, other_seed.rng, 0.0, 1.0) != first[0][0]


def test_the_automatic_step_time_asks_for_a_quarter_of_the_cores():
    # four speed-1 workers of 2 ms a step on 2 cores: 4 cores' demand at 2 ms, so 4 x 2 ms x 4 / 2 = 16 ms
    assert pacing.automatic_step_time(parse_delay("round-robin", 4), 4, 0.002, 2) == pytest.approx(0.016)
    # straggler:5: the demand is 3 + 1/5 = 3.2 cores' worth
    assert pacing.automatic_step_time(parse_delay("straggler:5", 4), 4, 0.002, 2) == pytest.approx(0.0128)
    # heterogeneous:sqrt: 1 + 1/sqrt(2) + 1/sqrt(3)
    demand = 1 + 1 / math.sqrt(2) + 1 / math.sqrt(3)
    assert pacing.automatic_step_time(parse_delay("heterogeneous:sqrt", 3), 3, 0.002, 1) == \
        pytest.approx(0.008 * demand)
    # more cores than demand: never below four times the measured step
    assert pacing.automatic_step_time(parse_delay("round-robin", 2), 2, 0.002, 64) == pytest.approx(0.008)


# ---- the simulator reads the same models -------------------------------------------------------
def test_the_simulator_runs_a_pause_on_its_clock():
    """round-robin speeds, step 1 s, but the last of 3 workers pauses 20 virtual s at second 10; 128 messages.
    By hand: 3 a second up to t = 10 (30), the last worker's next message starts in the pause and ends at 31;
    t = 11..30 two a second (70); t = 31 three (73), the paused worker first from now on (its entry in the
    heap is the oldest at each tie); t = 32..49 three a second (127); t = 50 the paused worker's: 128."""
    def pushes(delay):
        res = sg.train("logreg", TRAIN, TEST, "asgd", 3, Simulator(delay=delay, step_time=1.0), epochs=4,
                       batch_size=8, seed=1)
        return [w["updates"] for w in res.staleness["per_worker"]], res.summary["virtual_s"]
    assert pushes("round-robin") == ([43, 43, 42], 43.0)
    assert pushes("pause:20@10") == ([10 + 20 + 1 + 18, 10 + 20 + 1 + 18, 10 + 1 + 18 + 1], 50.0)


# ---- real runs ------------------------------------------------------------------------------------
def shares(run_dir) -> list[float]:
    per = json.loads((run_dir / "staleness.json").read_text())["per_worker"]
    total = sum(w["updates"] for w in per)
    return [w["updates"] / total for w in per]


def test_local_straggler_gets_a_fifth_of_a_fast_worker_s_updates_as_in_the_simulator(tmp_path):
    common = ["--workers", "4", "--delay", "straggler:5", "--step-time", "0.01", "--dataset", "digits",
              "--model", "mlp", "--epochs", "8", "--seed", "2", "-q"]
    assert main(["train", "--runtime", "local", *common, "--out", str(tmp_path / "local")]) == 0
    assert main(["train", "--runtime", "sim", *common, "--out", str(tmp_path / "sim")]) == 0
    summary = json.loads((tmp_path / "local" / "summary.json").read_text())
    pace = summary["pacing"]
    assert pace["delay"] == "straggler:5" and pace["step_time"] == 0.01 and pace["step_time_source"] == "given"
    per = pace["per_worker"]
    assert [f["worker"] for f in per] == [0, 1, 2, 3]
    fast = statistics.fmean(f["updates"] for f in per[:3])
    assert 0.12 < per[3]["updates"] / fast < 0.3             # a fifth, and the simulator's
    # the straggler waits about 4/5 of each message (0.05 s drawn, about 2 ms of compute)
    assert per[3]["waited_s"] > 3 * per[3]["compute_s"]
    assert per[3]["waited_s"] == pytest.approx(0.05 * per[3]["messages"] - per[3]["compute_s"], rel=0.1)
    real, simulated = shares(tmp_path / "local"), shares(tmp_path / "sim")
    assert real[3] == pytest.approx(simulated[3], rel=0.35) and real[0] == pytest.approx(simulated[0], rel=0.1)
    config = json.loads((tmp_path / "local" / "config.json").read_text())
    assert config["runtime"]["delay"] == "straggler:5" and config["runtime"]["step_time"] == 0.01


def test_local_without_a_profile_records_none_and_paces_nothing(tmp_path):
    assert main(["train", "--runtime", "local", "--workers", "2", "--dataset", "digits", "--model", "logreg",
                 "--epochs", "1", "-q", "--out", str(tmp_path / "run")]) == 0
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    config = json.loads((tmp_path / "run" / "config.json").read_text())
    assert "pacing" not in summary and "delay" not in config["runtime"] and "step_time" not in config["runtime"]


def test_the_automatic_step_time_is_measured_and_recorded(tmp_path):
    assert main(["train", "--runtime", "local", "--workers", "2", "--delay", "heterogeneous:linear", "--dataset",
                 "digits", "--model", "logreg", "--epochs", "8", "-q", "--out", str(tmp_path / "run")]) == 0
    pace = json.loads((tmp_path / "run" / "summary.json").read_text())["pacing"]
    assert pace["step_time_source"] == "auto" and pace["measured_step_s"] > 0
    cores = __import__("os").cpu_count()
    expected = pacing.automatic_step_time(parse_delay("heterogeneous:linear", 2), 2, pace["measured_step_s"], cores)
    assert pace["step_time"] == pytest.approx(expected)
    per = pace["per_worker"]
    assert per[1]["messages"] < per[0]["messages"]              # worker 1 is twice as slow


# ---- the simulator's model of a real run's transport (--message-time, --pull) ------------------------
def reference_taus(M, seed, median, separate, updates):
    """An independent event loop: each message's transport drawn from an exponential of ``median``, the
    worker's next computation (round-robin: 1 s) after it; its pull at the push (``separate`` False) or when
    its transport ends, after every push that came before then."""
    import heapq
    rng = random.Random(seed)
    version, pulled, heap, pulls, seq, taus = 0, [0] * M, [], [], 0, []

    def start(m, now, first):
        nonlocal seq
        lag = rng.expovariate(math.log(2) / median)
        if separate and not first:
            heapq.heappush(pulls, (now + lag, seq, m))
        else:
            pulled[m] = version
        heapq.heappush(heap, (now + 1.0 + lag, seq, m))
        seq += 1
    for m in range(M):
        start(m, 0.0, True)
    for _ in range(updates):
        t, _, m = heapq.heappop(heap)
        while pulls and pulls[0][0] <= t:
            pulled[heapq.heappop(pulls)[2]] = version
        taus.append((m, version - pulled[m]))
        version += 1
        start(m, t, False)
    return taus


@pytest.mark.parametrize("pull", ["with-push", "separate"])
def test_the_simulated_transport_equals_an_independent_event_loop(pull):
    sim = Simulator(delay="round-robin", step_time=1.0, message_time=0.4, pull=pull)
    res = sg.train("logreg", TRAIN, TEST, "asgd", 3, sim, epochs=2, batch_size=8, seed=4)
    taus = reference_taus(3, 4, 0.4, pull == "separate", res.summary["updates"])
    hist = {}
    for _, t in taus:
        hist[str(t)] = hist.get(str(t), 0) + 1
    assert res.staleness["histogram"] == dict(sorted(hist.items(), key=lambda kv: int(kv[0])))
    assert [w["updates"] for w in res.staleness["per_worker"]] == [sum(m == k for m, _ in taus) for k in range(3)]
    assert res.config["runtime"]["message_time"] == 0.4 and res.config["runtime"]["pull"] == pull


def test_a_separate_pull_sees_the_pushes_of_its_transport():
    """Against the pull at push time, a pull a transport later has seen more pushes: lower tau."""
    def mean_tau(pull):
        sim = Simulator(delay="round-robin", step_time=1.0, message_time=0.5, pull=pull)
        return sg.train("logreg", TRAIN, TEST, "asgd", 4, sim, epochs=2, batch_size=8, seed=1).staleness["tau_mean"]
    assert mean_tau("separate") < mean_tau("with-push") - 0.2


def test_the_transport_options_are_checked():
    with pytest.raises(ConfigError, match="pull separate makes a pull come a message's transport after its push"):
        Simulator(pull="separate")
    with pytest.raises(ConfigError, match="pull must be one of with-push, separate"):
        Simulator(message_time=0.1, pull="later")
    with pytest.raises(ConfigError, match="message_time must be a finite number >= 0"):
        Simulator(message_time=-1.0)
    res = sg.train("logreg", TRAIN, TEST, "asgd", 3, Simulator(vectorised=True, message_time=0.1), epochs=1,
                   batch_size=8, seed=0)
    assert any("transport (message_time) is drawn one message at a time" in n for n in res.summary["notes"])


def test_a_recorded_trace_paces_a_real_run_at_each_worker_s_recorded_speed(tmp_path):
    """Record a paced run whose last worker is 4x slower, then pace a new real run by that trace alone."""
    trace = tmp_path / "t.csv"
    common = ["--workers", "3", "--dataset", "digits", "--model", "logreg", "--epochs", "6", "--batch-size", "32",
              "-q", "--runtime", "local"]
    assert main(["train", *common, "--delay", "straggler:4", "--step-time", "0.01", "--record-trace", str(trace),
                 "--out", str(tmp_path / "recorded")]) == 0
    model = parse_delay(f"trace:{trace}", 3)
    gaps = model.mean_gap
    assert gaps[2] / gaps[0] == pytest.approx(4.0, rel=0.3)
    assert model.fastest(2) == gaps[2]
    assert main(["train", *common, "--delay", f"trace:{trace}", "--step-time", "0.01",
                 "--out", str(tmp_path / "replayed")]) == 0
    per = json.loads((tmp_path / "replayed" / "summary.json").read_text())["pacing"]["per_worker"]
    assert per[2]["messages"] / per[0]["messages"] == pytest.approx(gaps[0] / gaps[2], rel=0.35)
