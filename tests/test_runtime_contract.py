"""The runtime contract (stalegrad/runtimes/base.py) is all a runtime needs.

A third runtime, written here in a few dozen lines, trains every algorithm end
to end through ``stalegrad.train`` and checkpoints and resumes; it sees the
training run only through a view that refuses everything outside the
contract. Because its schedule is exact round robin, it must give the same
weights as the simulator with equal speeds.
"""
import pytest
import torch

import stalegrad as sg
from stalegrad.algorithms import ALGORITHMS, make_algorithm
from stalegrad.run.config import RunConfig
from stalegrad.runtimes import Runtime, Simulator, Training
from stalegrad.runtimes.base import Training as TrainingProtocol
from stalegrad.run.training import TrainingRun

from helpers import Stop, blobs, stop_after_first_checkpoint

TRAIN, TEST = blobs(seed=0), blobs(n=128, seed=1)
CONTRACT = {"server", "worker_factory", "test_data", "lr", "done", "done_after", "after_push", "evaluation_due", "checkpoint_due",
            "checkpoint_every", "save_checkpoint", "evaluate", "note", "probes"}


class ContractOnly:
    """A training run seen through the contract: any other attribute is an error."""

    def __init__(self, training):
        object.__setattr__(self, "_training", training)

    def __getattr__(self, name):
        if name not in CONTRACT:
            raise AssertionError(f"a runtime used {name!r}, which is not in the runtime contract")
        return getattr(self._training, name)

    def __setattr__(self, name, value):
        raise AssertionError(f"a runtime wrote {name!r} into the training run")


class RoundRobin:
    """Workers take turns, one message each; a worker pulls again once its push is applied."""

    def describe(self):
        return {"name": "round-robin"}

    def run(self, training, *, seed, resume=None):
        training = ContractOnly(training)
        server = training.server
        algo = server.algorithm
        workers = [training.worker_factory.build(m) for m in range(server.num_workers)]
        turn = 0 if resume is None else resume["turn"]
        for w, st in zip(workers, resume["workers"] if resume else []):
            w.load_state_dict(st)
        pulled = list(resume["pulled"]) if resume else [None] * len(workers)
        if resume is None and algo.pull_before_compute:
            pulled = [server.pull(m) for m in range(len(workers))]
        while not training.done:
            m = turn % len(workers)
            worker, lr = workers[m], training.lr
            loss, computed = worker.compute(pulled[m], lr)
            if not algo.pull_before_compute:       # elastic averaging: the centre, after the local steps
                pulled[m] = server.pull(m)
            waiting = [k for k in range(len(workers)) if server.waiting(k)]   # their messages wait in a round
            server.push(m, worker.message(pulled[m], computed), lr)
            turn += 1
            training.after_push(worker.samples_per_message, loss, float(turn), train_acc=worker.train_acc)
            if algo.pull_before_compute:   # synchronous: those whose message waits no more (the round closed, or
                for k in ([k for k in waiting + [m] if not server.waiting(k)] if algo.synchronous else [m]):
                    pulled[k] = server.pull(k)   # the rule dropped it: m-ssgd's late straggler)
            state = {"kind": "round-robin", "turn": turn, "pulled": pulled,
                     "workers": [w.state_dict() for w in workers]}
            if training.checkpoint_due():
                training.save_checkpoint(state)
        training.note("workers took turns", turns=turn)


def window(name):
    return {"window": 3} if "window" in {f.name for f in ALGORITHMS[name].hyperparameters()} else {}


def train(runtime, name, **kw):
    workers = 1 if ALGORITHMS[name].sequential else 3
    return sg.train("mlp", TRAIN, TEST, make_algorithm(name, **window(name)), workers, runtime,
                    epochs=1.5, batch_size=8, seed=4, **kw)


def test_the_runtimes_satisfy_the_protocols():
    assert isinstance(RoundRobin(), Runtime) and isinstance(Simulator(), Runtime)
    assert Training is TrainingProtocol
    run = TrainingRun(torch.nn.Linear(8, 3), TRAIN, TEST, RunConfig(workers=2, batch_size=8).validate())
    assert isinstance(run, Training)


@pytest.mark.parametrize("name", list(ALGORITHMS))
def test_a_third_runtime_needs_only_the_contract(name):
    ours = train(RoundRobin(), name)
    sim = train(Simulator(delay="round-robin"), name)
    # a synchronous round is every worker's turn (m-ssgd's: 2 of 3); rennala's update takes B = 3 gradients
    per_update = {"m-ssgd": 2, "rennala": 3}.get(name, 3 if ALGORITHMS[name].synchronous else 1)
    used = ours.summary["turns"] - ours.summary["updates_dropped"]   # the messages not dropped
    assert 0 <= used - ours.summary["updates"] * per_update < per_update
    assert "workers took turns" in ours.summary["notes"]
    assert ours.config["runtime"] == {"name": "round-robin"}
    assert ours.summary["samples"] >= 1.5 * len(TRAIN.y)
    # exact round robin is the simulator's schedule under equal speeds
    assert ours.update_log() == sim.update_log()
    assert ours.summary["weights_sha256"] == sim.summary["weights_sha256"]


@pytest.mark.parametrize("name", ["dcasgd-a", "agn", "aeasgd", "ssgd", "dana-dc", "async-local-sgd"])
def test_a_third_runtime_checkpoints_and_resumes_through_the_contract(tmp_path, name):
    full = train(RoundRobin(), name)
    path = tmp_path / "ck.pt"

    with pytest.raises(Stop):
        train(stop_after_first_checkpoint(RoundRobin)(), name, checkpoint_every=5, checkpoint_path=path)
    resumed = train(RoundRobin(), name, checkpoint_every=5, checkpoint_path=path, resume=path)
    assert resumed.summary["weights_sha256"] == full.summary["weights_sha256"]
    assert resumed.update_log() == full.update_log()


@pytest.mark.parametrize("delay,vectorised", [("gamma:2", False), ("round-robin", True), ("straggler:3", False)])
def test_the_simulator_uses_only_the_contract(delay, vectorised):
    config = RunConfig(algorithm="dcasgd-a", workers=3, batch_size=8, epochs=1.0, seed=1).validate()
    torch.manual_seed(1)
    run = TrainingRun(torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 3)),
                      TRAIN, TEST, config)
    Simulator(delay=delay, vectorised=vectorised).run(ContractOnly(run), seed=1)
    assert run.done and run.server.version > 0
