"""Checkpoints: a simulated run stopped and resumed ends bit-identical."""
import pytest
import torch
from torch import nn

import stalegrad as sg
from stalegrad.run.checkpoint import CheckpointError
from stalegrad.runtimes import Simulator
from stalegrad.core.server import ParameterServer

from helpers import TEST, TRAIN, write_trace


class Interrupt(Exception):
    pass


def bn_model():
    return nn.Sequential(nn.Linear(8, 16), nn.BatchNorm1d(16), nn.ReLU(), nn.Linear(16, 3))


def train(algo, delay, path, resume=None, **kw):
    torch.manual_seed(0)
    params = {"window": 2} if "window" in {f.name for f in sg.ALGORITHMS[algo].hyperparameters()} else {}
    return sg.train(bn_model(), TRAIN, TEST, sg.make_algorithm(algo, **params), 1 if algo == "sgd" else 3,
                    Simulator(delay=delay), epochs=2, batch_size=8, seed=5, eval_every=0.5,
                    checkpoint_every=7, checkpoint_path=path, resume=resume, **kw)


def interrupt_at(monkeypatch, version):
    original = ParameterServer.push

    def push(self, worker, msg, lr):
        if self.version == version:
            raise Interrupt()
        return original(self, worker, msg, lr)
    monkeypatch.setattr(ParameterServer, "push", push)


def strip_wall(metrics):
    return [{k: v for k, v in m.items() if k != "wall_s"} for m in metrics]


CASES = [("dcasgd-a", "gamma:2"), ("agn", "exponential"), ("ssgd", "straggler:3"), ("aeasgd", "round-robin"),
         ("easgd", "heterogeneous:sqrt"), ("dynsgd", "round-robin"), ("sgd", "round-robin"),
         # the rules after 2017: scalars in the server state (counts, lr_max, the look-ahead's lr)
         ("gap-aware", "gamma:2"), ("dana-dc", "exponential"), ("async-local-sgd", "round-robin"),
         ("diloco", "straggler:3")]


@pytest.mark.parametrize("algo,delay", CASES)
def test_resumed_run_equals_uninterrupted_run(tmp_path, monkeypatch, algo, delay):
    full = train(algo, delay, tmp_path / "full.pt")
    with monkeypatch.context() as mp:
        interrupt_at(mp, 10)
        with pytest.raises(Interrupt):
            train(algo, delay, tmp_path / "cut.pt")
    saved = torch.load(tmp_path / "cut.pt", weights_only=True)
    assert saved["run"]["server"]["version"] == 7          # the last checkpoint before the interruption
    resumed = train(algo, delay, tmp_path / "cut.pt", resume=tmp_path / "cut.pt")
    assert resumed.summary["weights_sha256"] == full.summary["weights_sha256"]
    assert resumed.update_log() == full.update_log()
    assert strip_wall(resumed.metrics) == strip_wall(full.metrics)
    assert strip_wall(resumed.messages) == strip_wall(full.messages)   # the messages before the cut too
    assert resumed.staleness == full.staleness


def test_async_local_sgd_resumes_bit_exact_on_its_fused_kernel(tmp_path, monkeypatch):
    """Delayed Nesterov's state (buffer, D, update count) through a checkpoint with the kernel on, and
    the same weights as the torch path's run."""
    pytest.importorskip("numba")
    hashes = {}
    for kernels in ("numba", "torch"):
        monkeypatch.setenv("STALEGRAD_KERNELS", kernels)
        full = train("async-local-sgd", "round-robin", tmp_path / f"{kernels}-full.pt")
        assert full.summary["server_kernels"] == kernels
        with monkeypatch.context() as mp:
            interrupt_at(mp, 10)
            with pytest.raises(Interrupt):
                train("async-local-sgd", "round-robin", tmp_path / f"{kernels}-cut.pt")
        resumed = train("async-local-sgd", "round-robin", tmp_path / f"{kernels}-cut.pt",
                        resume=tmp_path / f"{kernels}-cut.pt")
        assert resumed.summary["server_kernels"] == kernels
        assert resumed.summary["weights_sha256"] == full.summary["weights_sha256"]
        assert resumed.update_log() == full.update_log()
        hashes[kernels] = full.summary["weights_sha256"]
    assert hashes["numba"] == hashes["torch"]


def test_resume_of_a_trace_replay(tmp_path, monkeypatch):
    trace = tmp_path / "t.csv"
    write_trace(trace, [(i % 3, max(0, i - 2), i, float(i)) for i in range(40)])
    full = train("asgd", f"trace:{trace}", tmp_path / "a.pt")
    with monkeypatch.context() as mp:
        interrupt_at(mp, 12)
        with pytest.raises(Interrupt):
            train("asgd", f"trace:{trace}", tmp_path / "b.pt")
    resumed = train("asgd", f"trace:{trace}", tmp_path / "b.pt", resume=tmp_path / "b.pt")
    assert resumed.update_log() == full.update_log()
    assert resumed.summary["weights_sha256"] == full.summary["weights_sha256"]


def test_checkpoint_is_replaced_atomically(tmp_path, monkeypatch):
    path = tmp_path / "c.pt"
    train("asgd", "round-robin", path)
    before = path.read_bytes()
    import stalegrad.run.checkpoint as ck

    def failing_save(obj, f, *a, **k):
        f.write(b"partial")
        raise OSError("disk full")
    monkeypatch.setattr(ck.torch, "save", failing_save)
    with pytest.raises(sg.RunError, match="c.pt: cannot write it .*the run stopped"):
        train("asgd", "round-robin", path)
    assert path.read_bytes() == before                    # the old checkpoint is intact
    assert [p.name for p in tmp_path.iterdir()] == ["c.pt"]   # no temporary file left


def test_resume_with_fewer_epochs_names_the_configured_ones_not_the_trained_ones(tmp_path, monkeypatch):
    path = tmp_path / "c.pt"
    with monkeypatch.context() as mp:
        interrupt_at(mp, 10)
        with pytest.raises(Interrupt):
            train("asgd", "round-robin", path)   # 2 epochs configured, stopped well before 1
    saved = torch.load(path, weights_only=True)
    assert saved["run"]["progress"]["samples"] < len(TRAIN.y)

    def resume(epochs):
        torch.manual_seed(0)
        sg.train(bn_model(), TRAIN, TEST, sg.make_algorithm("asgd"), 3, Simulator(delay="round-robin"),
                 epochs=epochs, batch_size=8, seed=5, eval_every=0.5, checkpoint_every=7, checkpoint_path=path,
                 resume=path)
    with pytest.raises(sg.ConfigError, match=r"^epochs is 1, but the run to resume is configured for 2 epochs, "
                                             r"and a resumed run may only be extended; give 2 or more$"):
        resume(1)
    del saved["run"]["progress"]["sample_budget"]   # an older checkpoint: the samples trained count
    torch.save(saved, path)
    done = saved["run"]["progress"]["samples"] / len(TRAIN.y)
    with pytest.raises(sg.ConfigError, match=rf"already trained {done:.4g} epochs; give {done:.4g} or more$"):
        resume(done / 2)


def test_mismatched_checkpoint_is_refused(tmp_path):
    path = tmp_path / "c.pt"
    train("asgd", "round-robin", path)
    with pytest.raises(CheckpointError, match="algorithm"):
        train("dcasgd-c", "round-robin", tmp_path / "other.pt", resume=path)
    with pytest.raises(CheckpointError, match="parameters"):
        sg.train("logreg", TRAIN, TEST, sg.make_algorithm("asgd"), 3, Simulator(), epochs=1, batch_size=8,
                 seed=5, resume=path)


def test_corrupt_checkpoint_is_refused(tmp_path):
    path = tmp_path / "c.pt"
    path.write_bytes(b"not a checkpoint")
    with pytest.raises(CheckpointError, match="corrupt"):
        train("asgd", "round-robin", tmp_path / "x.pt", resume=path)
    with pytest.raises(CheckpointError, match="no checkpoint"):
        train("asgd", "round-robin", tmp_path / "x.pt", resume=tmp_path / "missing.pt")
    torch.save({"format": 1, "weights": torch.zeros(3)}, path)
    with pytest.raises(CheckpointError, match="not a stalegrad checkpoint"):
        train("asgd", "round-robin", tmp_path / "x.pt", resume=path)


@pytest.mark.parametrize("damage", ["worker", "weights", "rng", "metrics", "momentum"])
def test_a_damaged_checkpoint_is_refused_before_on_start(tmp_path, damage):
    """A checkpoint of the right format and keys whose contents do not fit the run is refused with a
    CheckpointError before ``on_start`` (which writes the run directory) is called."""
    path = tmp_path / "c.pt"
    train("dcasgd-a", "round-robin", path)
    state = torch.load(path, weights_only=True)
    if damage == "worker":
        state["runtime"]["workers"].pop()
    elif damage == "weights":
        state["run"]["server"]["w"] = torch.zeros(3)
    elif damage == "rng":
        state["run"]["torch_rng"] = torch.ones(5056, dtype=torch.float32)
    elif damage == "metrics":
        state["run"]["progress"]["metrics"] = "garbage"
    else:
        state["run"]["server"]["state"]["mean_square"].pop()
    torch.save(state, path)
    started = []
    with pytest.raises(CheckpointError, match=f"{path.name}: damaged checkpoint"):
        train("dcasgd-a", "round-robin", path, resume=path, on_start=lambda *a: started.append(a))
    assert started == []


def test_a_checkpoint_saved_before_the_outer_optimizer_resumes(tmp_path, monkeypatch):
    full = train("agn", "round-robin", tmp_path / "full.pt")
    with monkeypatch.context() as mp:
        interrupt_at(mp, 10)
        with pytest.raises(Interrupt):
            train("agn", "round-robin", tmp_path / "cut.pt")
    saved = torch.load(tmp_path / "cut.pt", weights_only=True)
    for key in ("outer_opt", "outer_lr", "outer_momentum"):   # as agn's checkpoints were before them
        del saved["fingerprint"]["algorithm"][key]
    torch.save(saved, tmp_path / "old.pt")
    resumed = train("agn", "round-robin", tmp_path / "old.pt", resume=tmp_path / "old.pt")
    assert resumed.summary["weights_sha256"] == full.summary["weights_sha256"]
    with pytest.raises(CheckpointError, match="algorithm"):   # a missing key is its default, nothing else
        sg.train(bn_model(), TRAIN, TEST, sg.make_algorithm("agn", window=2, outer_opt="nesterov"), 3,
                 Simulator(delay="round-robin"), epochs=2, batch_size=8, seed=5, checkpoint_every=7,
                 checkpoint_path=tmp_path / "x.pt", resume=tmp_path / "old.pt")


@pytest.mark.parametrize("algo, added, old_value, flag", [("sasgd", "staleness_offset", 1, "--staleness-offset"),
                                                           ("gap-aware", "ga_reading", "applied-step", "--ga-reading")])
def test_a_run_saved_before_a_parameter_existed_resumes_with_the_rule_it_ran(tmp_path, algo, added, old_value, flag):
    """sasgd's staleness offset and gap-aware's reading were added (issue 32) with new defaults: a run saved
    before them, whose config.json and checkpoint lack the key, resumes with the rule it ran (the old value),
    not today's default, and ends as a never-stopped run of the old rule."""
    import json

    import torch

    from stalegrad.cli import main
    base = ["train", "--algo", algo, "--workers", "2", "--dataset", "digits", "--model", "logreg", "--quiet",
            "--lr", "0.05"]
    old, whole = tmp_path / "old", tmp_path / "whole"
    assert main(base + [flag, str(old_value), "--epochs", "1", "--checkpoint-every", "5", "--out", str(old)]) == 0
    assert main(base + [flag, str(old_value), "--epochs", "2", "--out", str(whole)]) == 0
    cfg = json.loads((old / "config.json").read_text())     # as a run made before the parameter existed
    del cfg["algorithm"][added]
    (old / "config.json").write_text(json.dumps(cfg))
    state = torch.load(old / "checkpoint.pt", weights_only=False)
    del state["fingerprint"]["algorithm"][added]
    torch.save(state, old / "checkpoint.pt")
    assert main(["train", "--resume", str(old), "--epochs", "2", "--quiet"]) == 0
    assert json.loads((old / "config.json").read_text())["algorithm"][added] == old_value
    sha = [json.loads((d / "summary.json").read_text())["weights_sha256"] for d in (old, whole)]
    assert sha[0] == sha[1]
