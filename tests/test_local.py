"""The local runtime: real worker processes, shared-memory transport, failures, Ctrl-C."""
import errno
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from torch import nn

import stalegrad as sg
from stalegrad.algorithms import ALGORITHMS
from stalegrad.cli import main
from stalegrad.core.delays import read_trace
from stalegrad.runtimes import LocalRuntime, Simulator
from stalegrad.errors import ConfigError
from stalegrad.runtimes.local import WorkerError, max_workers
from stalegrad.runtimes.local.stats import Measurements
from stalegrad.core.worker import BatchStream

from helpers import alive, blobs, descendants

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="the process checks read /proc")


TRAIN, TEST = blobs(n=512, seed=0), blobs(n=128, seed=1)


def local(algo="asgd", workers=2, epochs=1.0, batch_size=8, runtime=None, model="logreg", **kw):
    rt = runtime or LocalRuntime()
    res = sg.train(model, TRAIN, TEST, algo, workers, rt, epochs=epochs, batch_size=batch_size, **kw)
    return res, rt


def gone(pids, timeout=5.0) -> list[int]:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        left = [p for p in pids if alive(p)]
        if not left:
            return []
        time.sleep(0.05)
    return [p for p in pids if alive(p)]


def run_pids(rt: LocalRuntime) -> list[int]:
    return [p for p in rt.pids["workers"] + [rt.pids["evaluator"]] if p is not None]


def test_asynchronous_training_learns_and_measures_staleness():
    res, rt = local("asgd", workers=3, epochs=3, eval_every=0.5)
    s = res.summary
    assert torch.isfinite(res.weights).all()
    assert s["final_test_acc"] > 0.9 and res.metrics[0]["test_acc"] < 0.8
    assert s["samples"] >= 3 * len(TRAIN.y) and s["workers_lost"] == 0
    per = res.staleness["per_worker"]
    assert all(w["updates"] > 0 for w in per)
    assert sum(w["updates"] for w in per) == s["updates"] == res.staleness["updates"] == len(res.update_log())
    assert s["tau_max"] >= 0 and s["wall_s"] > 0 and s["virtual_s"] > 0
    # metrics: epoch 0, every half epoch in order (evaluated on snapshots), and the end
    epochs = [m["epoch"] for m in res.metrics]
    assert epochs == sorted(epochs) and len(epochs) >= 7 and res.metrics[-1]["samples"] == s["samples"]
    assert all(m["test_acc"] is not None for m in res.metrics)
    t = s["transport"]
    assert t["pull_ms_median"] > 0 and t["push_ms_p90"] >= t["push_ms_median"] > 0
    assert t["weight_bytes_per_message"] == 2 * 4 * res.weights.numel()
    assert s["threads_per_worker"] == max(1, len(os.sched_getaffinity(0)) // 3)
    assert sum(rt.stats["local_steps"]) >= s["updates"]
    assert gone(run_pids(rt)) == []


@pytest.mark.parametrize("algo", ["ssgd", "easgd"])
def test_synchronous_rounds_really_wait_for_every_worker(algo):
    kw = {"window": 2} if algo == "easgd" else {}
    M, batch = 3, 8
    res, _ = local(sg.make_algorithm(algo, **kw), workers=M, epochs=1.5, batch_size=batch)
    rounds = res.summary["updates"]
    steps = 2 if algo == "easgd" else 1
    assert rounds == res.summary["samples"] // (M * steps * batch) and rounds > 0
    assert res.staleness["tau_max"] == 0
    assert [w["updates"] for w in res.staleness["per_worker"]] == [rounds] * M


@pytest.mark.parametrize("algo", list(ALGORITHMS))
def test_every_algorithm_runs(algo):
    M = 1 if ALGORITHMS[algo].sequential else 2
    kw = {"window": 2} if "window" in {f.name for f in ALGORITHMS[algo].hyperparameters()} else {}
    # Two workers: enough samples (hundreds of messages) that both are up and push before the
    # budget is spent, even when other jobs on a loaded machine delay one worker's start.
    epochs = 1.0 if M == 1 else 10.0
    res, rt = local(sg.make_algorithm(algo, **kw), workers=M, epochs=epochs, model="mlp")
    assert torch.isfinite(res.weights).all()
    assert res.summary["updates"] > 0 and res.summary["samples"] >= epochs * len(TRAIN.y)
    per = [w["updates"] for w in res.staleness["per_worker"]]
    assert sum(per) == res.staleness["updates"] and all(n > 0 for n in per)
    assert res.summary["final_test_acc"] > 0.5   # three well-separated blobs
    assert gone(run_pids(rt)) == []


@pytest.mark.parametrize("algo", ["dcasgd-a", "dana-dc"])
def test_recorded_trace_replays_exactly_in_the_simulator(tmp_path, algo):
    # dana-dc: the workers compute at the look-ahead the server sends at each pull, as in the simulator
    path = tmp_path / "trace.csv"
    real, _ = local(algo, workers=3, epochs=2, runtime=LocalRuntime(record_trace=path), seed=3)
    lines = path.read_text().splitlines()
    assert lines[0] == "worker,pulled,applied,wall_s" and len(lines) - 1 == real.summary["updates"]
    trace = read_trace(path)
    assert trace.wall_s == sorted(trace.wall_s)
    replay = sg.train("logreg", TRAIN, TEST, algo, 3, Simulator(delay=f"trace:{path}"), epochs=2,
                      batch_size=8, seed=3)
    assert replay.update_log() == real.update_log()
    assert torch.allclose(replay.weights, real.weights, rtol=1e-5, atol=1e-6)
    assert replay.summary["samples"] == real.summary["samples"]
    assert not replay.summary["notes"]   # the trace covered the whole run


@pytest.mark.parametrize("algo", ["asgd", "ssgd"])
def test_a_killed_worker_is_removed_and_the_run_completes(algo):
    rt = LocalRuntime()
    killed = []

    def kill_once(record):
        if record["epoch"] > 0 and not killed:
            killed.append(rt.pids["workers"][1])
            os.kill(killed[0], signal.SIGKILL)

    res, _ = local(algo, workers=3, epochs=8, runtime=rt, eval_every=0.25, on_eval=kill_once)
    s = res.summary
    assert killed and not alive(killed[0])
    assert s["workers_lost"] == 1 and s["samples"] >= 8 * len(TRAIN.y)
    note = " ".join(s["notes"])
    assert "worker 1 lost" in note and "SIGKILL" in note and "goes to workers 0, 2" in note
    per = [w["updates"] for w in res.staleness["per_worker"]]
    assert per[0] > per[1] and per[2] > per[1]   # the survivors went on
    if algo == "ssgd":
        assert res.staleness["tau_max"] == 0 and per[0] == per[2] == s["updates"]
    assert torch.isfinite(res.weights).all() and s["final_test_acc"] > 0.9
    assert gone(run_pids(rt)) == []


class FailsInTraining(nn.Module):
    """Evaluates fine (no_grad) but raises in a worker's backward pass."""

    def __init__(self):
        super().__init__()
        self.linear = nn.Linear(8, 3)

    def forward(self, x):
        if torch.is_grad_enabled():
            raise RuntimeError("boom in the worker")
        return self.linear(x)


def test_an_error_in_a_worker_stops_the_run_and_every_process():
    rt = LocalRuntime()
    t0 = time.monotonic()
    with pytest.raises(WorkerError, match="boom in the worker"):
        sg.train(FailsInTraining(), TRAIN, TEST, "asgd", 2, rt, epochs=1, batch_size=8)
    assert time.monotonic() - t0 < 10
    assert gone(run_pids(rt)) == []


def test_batch_stream_adopts_a_shard_in_the_current_pass():
    s = BatchStream(100, 0, 2, batch_size=5, seed=0)
    extra = torch.arange(1000, 1010)
    first = s.next()
    s.extend(extra)
    seen = torch.cat([s.next() for _ in range(11)])   # the rest of this pass: 45 own + 10 adopted
    assert set(extra.tolist()) <= set(seen.tolist()) and not set(first.tolist()) & set(seen.tolist())
    assert len(s.pool) == 60


def test_cli_local_run_and_replay(tmp_path, capsys):
    out, trace = tmp_path / "run", tmp_path / "trace.csv"
    common = ["--workers", "2", "--algo", "dcasgd-c", "--dataset", "digits", "--model", "logreg",
              "--epochs", "1", "--batch-size", "32", "-q"]
    assert main(["train", *common, "--runtime", "local", "--threads-per-worker", "1",
                 "--record-trace", str(trace), "--out", str(out)]) == 0
    summary = json.loads((out / "summary.json").read_text())
    config = json.loads((out / "config.json").read_text())
    assert config["runtime"]["name"] == "local" and config["runtime"]["threads_per_worker"] == 1
    assert summary["workers_lost"] == 0 and summary["threads_per_worker"] == 1
    assert (out / "model.pt").exists() and len((out / "metrics.jsonl").read_text().splitlines()) == 2
    staleness = json.loads((out / "staleness.json").read_text())
    assert main(["train", *common, "--delay", f"trace:{trace}", "--out", str(tmp_path / "replay")]) == 0
    assert json.loads((tmp_path / "replay" / "staleness.json").read_text()) == staleness


@pytest.mark.parametrize("args, message", [
    (["--runtime", "local", "--delay", "gamma:0"], "--delay 'gamma:0': SHAPE must be a number from 0.01"),
    (["--runtime", "local", "--step-time", "0.01"], "--step-time paces the workers of a speed profile: give one"),
    (["--runtime", "local", "--delay", "straggler:5", "--step-time", "-1"], "--step-time must be a finite number"),
    (["--runtime", "local", "--delay", "trace:/nonexistent.csv"], "cannot read the trace"),
    (["--record-trace", "t.csv"], "--record-trace records a real run: use it with runtime local"),
    (["--threads-per-worker", "2"], "--threads-per-worker applies to runtime local only"),
    (["--runtime", "local", "--threads-per-worker", "0"], "--threads-per-worker"),
    (["--worker-timeout", "5"], "--worker-timeout applies to runtime local only"),
    (["--runtime", "local", "--worker-timeout", "0"], "--worker-timeout must be a finite number > 0, got 0.0"),
    (["--runtime", "local", "--worker-timeout", "inf"], "--worker-timeout must be a finite number > 0, got inf"),
])
def test_cli_errors(tmp_path, capsys, args, message):
    assert main(["train", *args, "--out", str(tmp_path / "run"), "-q"]) == 2
    err = capsys.readouterr().err
    assert message in err and err.count("\n") == 1
    assert not (tmp_path / "run").exists()


def test_sigint_stops_every_process_and_leaves_no_shared_memory(tmp_path):
    shm_before = set(os.listdir("/dev/shm"))
    out = tmp_path / "run"
    proc = subprocess.Popen([sys.executable, "-m", "stalegrad", "train", "--runtime", "local", "--workers", "2",
                             "--algo", "asgd", "--dataset", "digits", "--model", "mlp", "--epochs", "1000",
                             "--batch-size", "8", "--eval-every", "0.2", "--out", str(out), "-q"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            cwd=Path(__file__).resolve().parents[1])
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and proc.poll() is None:   # training is under way
            metrics = out / "metrics.jsonl"
            if metrics.exists() and len(metrics.read_text().splitlines()) >= 2:
                break
            time.sleep(0.1)
        assert proc.poll() is None, proc.stderr.read()
        kids = descendants(proc.pid)
        assert len(kids) >= 3   # two workers and the evaluator (and the fork server)
        t0 = time.monotonic()
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=15)
        assert time.monotonic() - t0 < 5
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 130 and "interrupted" in err
    assert gone(kids, timeout=5) == []
    ours = {str(proc.pid), *map(str, kids)}
    leaked = [n for n in set(os.listdir("/dev/shm")) - shm_before if any(f"_{p}_" in n for p in ours)]
    assert leaked == []


def test_checkpoint_and_resume_under_the_local_runtime(tmp_path, monkeypatch):
    from stalegrad.core.server import ParameterServer
    path = tmp_path / "ckpt.pt"
    algorithm = sg.make_algorithm("agn", window=2)

    def go(resume=None):
        torch.manual_seed(0)
        return sg.train("logreg", TRAIN, TEST, algorithm, 2, LocalRuntime(), epochs=3, batch_size=16,
                        checkpoint_every=8, checkpoint_path=path, resume=resume)

    original = ParameterServer.push

    def push(self, worker, msg, lr):
        if self.version == 20:
            raise KeyboardInterrupt
        return original(self, worker, msg, lr)
    monkeypatch.setattr(ParameterServer, "push", push)
    with pytest.raises(KeyboardInterrupt):
        go()
    monkeypatch.setattr(ParameterServer, "push", original)
    first = torch.load(path, weights_only=True)
    v1 = first["run"]["server"]["version"]
    assert 8 <= v1 < 20
    assert first["runtime"]["kind"] == "local" and len(first["runtime"]["workers"]) == 2
    steps1 = [w["algorithm"]["opt"]["step"] for w in first["runtime"]["workers"]]
    assert all(s > 0 for s in steps1)            # every worker's Adam state was gathered
    res = go(resume=path)
    assert res.summary["samples"] >= 3 * len(TRAIN.y)
    assert res.summary["updates"] > v1
    metrics1 = first["run"]["progress"]["metrics"]
    assert res.metrics[:len(metrics1)] == metrics1
    second = torch.load(path, weights_only=True)     # the final checkpoint, at the end of the budget
    assert second["run"]["server"]["version"] == res.summary["updates"] > v1
    assert second["runtime"]["now"] > first["runtime"]["now"]
    steps2 = [w["algorithm"]["opt"]["step"] for w in second["runtime"]["workers"]]
    # the workers went on from their saved Adam state, not from scratch
    assert all(b > a for a, b in zip(steps1, steps2))


# ---- an unwritable trace, too many workers, a stopped worker ---------------------------------
CLI_RUN = ["--workers", "2", "--algo", "asgd", "--dataset", "digits", "--model", "logreg", "--epochs", "1",
           "--batch-size", "32", "--runtime", "local", "-q"]


@pytest.mark.parametrize("where", ["/proc", "a read-only directory"])
def test_an_unwritable_trace_is_refused_before_training(tmp_path, capsys, where):
    if where == "/proc":
        trace = "/proc/t.csv"
    else:
        if os.geteuid() == 0:
            pytest.skip("root may write into a read-only directory; the /proc case covers an unwritable place")
        ro = tmp_path / "ro"
        ro.mkdir()
        ro.chmod(0o500)
        trace = str(ro / "t.csv")
    out = tmp_path / "run"
    try:
        assert main(["train", *CLI_RUN, "--record-trace", trace, "--out", str(out)]) == 2
    finally:
        if where != "/proc":
            (tmp_path / "ro").chmod(0o700)
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and f"--record-trace is {trace!r}, but the file cannot be written there" in err
    assert not out.exists() and not os.path.exists(trace)


def test_the_trace_path_is_tried_without_changing_anything(tmp_path):
    rt = LocalRuntime(record_trace=tmp_path)
    with pytest.raises(ConfigError, match="record_trace .* is a directory"):
        sg.train("logreg", TRAIN, TEST, "asgd", 2, rt, epochs=1, batch_size=8)
    with pytest.raises(ConfigError, match="record_trace .* the directory .* does not exist"):
        sg.train("logreg", TRAIN, TEST, "asgd", 2, LocalRuntime(record_trace=tmp_path / "no" / "t.csv"))
    old = tmp_path / "old.csv"
    old.write_text("an earlier trace\n")
    LocalRuntime(record_trace=old).check(sg.RunConfig(workers=2).validate())
    LocalRuntime(record_trace=tmp_path / "new.csv").check(sg.RunConfig(workers=2).validate())
    assert sorted(p.name for p in tmp_path.iterdir()) == ["old.csv"] and old.read_text() == "an earlier trace\n"


def test_a_trace_that_cannot_be_written_at_the_end_costs_only_the_trace(tmp_path, capsys, monkeypatch):
    def disk_full(self, path):
        raise OSError(errno.ENOSPC, "No space left on device")
    monkeypatch.setattr(Measurements, "write_trace", disk_full)
    out, trace = tmp_path / "run", tmp_path / "trace.csv"
    assert main(["train", *CLI_RUN, "--record-trace", str(trace), "--out", str(out)]) == 0
    err = capsys.readouterr().err
    text = f"the trace could not be written to {trace} (No space left on device)"
    assert [line for line in err.splitlines() if "warning" in line] == [f"stalegrad: warning: {text}"]
    summary = json.loads((out / "summary.json").read_text())
    config = json.loads((out / "config.json").read_text())
    assert text in summary["notes"] and summary["samples"] >= config["train_samples"] > 0
    assert (out / "model.pt").exists() and not trace.exists()


def test_a_trace_directory_removed_during_the_run_costs_only_the_trace(tmp_path):
    where = tmp_path / "traces"
    where.mkdir()
    res, _ = local("asgd", workers=2, epochs=1, runtime=LocalRuntime(record_trace=where / "t.csv"),
                   eval_every=0.5, on_eval=lambda record: shutil.rmtree(where, ignore_errors=True))
    assert any(n.startswith(f"the trace could not be written to {where / 't.csv'}") for n in res.summary["notes"])
    assert res.summary["samples"] >= len(TRAIN.y) and torch.isfinite(res.weights).all()


def test_more_workers_than_the_machine_can_run_are_refused_at_once(tmp_path, capsys):
    before = set(descendants(os.getpid()))
    t0 = time.monotonic()
    code = main(["train", "--runtime", "local", "--workers", "100000", "--out", str(tmp_path / "run"), "-q"])
    elapsed = time.monotonic() - t0
    err = capsys.readouterr().err
    assert code == 2 and elapsed < 0.5, (code, elapsed, err)
    limit, machine = max_workers()
    assert err.count("\n") == 1 and "--workers is 100000" in err and f"can run at most {limit}" in err
    assert f"({machine})" in err and "per core" in err and "runtime sim" in err
    assert 2 <= limit <= 32 * len(os.sched_getaffinity(0))
    assert set(descendants(os.getpid())) - before == set() and not (tmp_path / "run").exists()


def test_worker_timeout_is_checked_and_described():
    assert LocalRuntime().describe()["worker_timeout"] == 300.0
    assert LocalRuntime(worker_timeout=2).describe()["worker_timeout"] == 2.0
    for bad in (0, -1, float("nan"), float("inf"), True, "3"):
        with pytest.raises(ConfigError, match="worker_timeout must be a finite number > 0"):
            LocalRuntime(worker_timeout=bad)


def test_a_stopped_worker_times_out_and_the_synchronous_run_completes():
    rt = LocalRuntime(worker_timeout=1.0)
    stopped = []

    def stop_once(record):
        if record["epoch"] > 0 and not stopped:
            stopped.append(rt.pids["workers"][1])
            os.kill(stopped[0], signal.SIGSTOP)

    try:
        res, _ = local("ssgd", workers=3, epochs=4, runtime=rt, eval_every=0.25, on_eval=stop_once)
        assert stopped and gone(stopped) == []   # killed, not left stopped
    finally:
        for pid in stopped:
            if alive(pid):
                os.kill(pid, signal.SIGCONT)
                os.kill(pid, signal.SIGKILL)
    s = res.summary
    assert s["workers_lost"] == 1 and s["samples"] >= 4 * len(TRAIN.y)
    note = " ".join(s["notes"])
    assert "worker 1 lost" in note and "(no message for 1 s)" in note and "goes to workers 0, 2" in note
    per = [w["updates"] for w in res.staleness["per_worker"]]
    assert per[0] == per[2] == s["updates"] > per[1] and res.staleness["tau_max"] == 0
    assert gone(run_pids(rt)) == []


class SlowToTrain(nn.Module):
    """A logistic regression whose training steps take 50 ms each (evaluation is fast)."""

    def __init__(self):
        super().__init__()
        self.linear = nn.Linear(8, 3)

    def forward(self, x):
        if torch.is_grad_enabled():
            time.sleep(0.05)
        return self.linear(x)


def test_the_timeout_is_per_message_not_per_run():
    # Synchronous rounds of 4 local steps (0.2 s each message), a run several times the timeout:
    # workers parked between rounds, and messages that fit in it, are no timeout.
    rt = LocalRuntime(worker_timeout=1.0)
    res = sg.train(SlowToTrain(), TRAIN, TEST, sg.make_algorithm("easgd", window=4), 3, rt, epochs=2, batch_size=8)
    assert res.summary["workers_lost"] == 0 and res.summary["wall_s"] > 2.5 * rt.worker_timeout
    assert res.summary["samples"] >= 2 * len(TRAIN.y)
