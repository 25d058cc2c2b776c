"""Vectorised simulation (Simulator(vectorised=True)) against the one-by-one event loop."""
from types import SimpleNamespace

import pytest
import torch

import stalegrad as sg
from stalegrad.algorithms import make_algorithm
from stalegrad.models import build_model
from stalegrad.runtimes import Simulator
from stalegrad.runtimes.vectorised import BatchedGradient
from stalegrad.core.worker import FlatModel

from helpers import blobs


def images(n, seed, channels=3, side=8, classes=4):
    g = torch.Generator().manual_seed(seed)
    y = torch.randint(0, classes, (n,), generator=g)
    x = torch.randn(n, channels, side, side, generator=g) + y.view(-1, 1, 1, 1).float()
    return SimpleNamespace(x=x, y=y, num_classes=classes)


TRAIN, TEST = blobs(seed=0), blobs(n=128, seed=1)


def both(algo, workers, delay, model="mlp", train=TRAIN, test=TEST, **kw):
    """The same run one worker at a time and vectorised."""
    out, params = [], kw.pop("params", {})
    for vectorised in (False, True):
        algorithm = make_algorithm(algo, **params) if isinstance(algo, str) else algo
        out.append(sg.train(model, train, test, algorithm, workers, Simulator(delay=delay, vectorised=vectorised),
                            **{"epochs": 2, "batch_size": 8, "seed": 3, **kw}))
    return out


@pytest.mark.parametrize("algo,workers,delay", [
    ("asgd", 4, "round-robin"),
    ("asgd", 7, "exponential"),
    ("dcasgd-c", 3, "heterogeneous:sqrt"),
    ("dcasgd-a", 5, "gamma:2"),
    ("dcasgd-a", 4, "straggler:4"),
    ("ssgd", 3, "gamma:1"),
    ("sgd", 1, "round-robin"),
    ("sasgd", 4, "exponential"),
    ("gap-aware", 3, "gamma:2"),
    ("dana-dc", 4, "heterogeneous:sqrt"),   # the gradients at each worker's look-ahead, stacked
])
def test_same_weights_and_tau_sequence_as_one_by_one(algo, workers, delay):
    one, vec = both(algo, workers, delay)
    assert vec.update_log() == one.update_log()
    assert vec.summary["notes"] == []
    torch.testing.assert_close(vec.weights, one.weights, rtol=1e-4, atol=1e-5)
    # the mean losses of the evaluation intervals too: every gradient came from the same mini-batch
    for a, b in zip(one.metrics, vec.metrics):
        if a["train_loss"] is None:
            assert b["train_loss"] is None
        else:
            assert b["train_loss"] == pytest.approx(a["train_loss"], rel=1e-4, abs=1e-6)
        assert a["test_acc"] == pytest.approx(b["test_acc"], abs=1e-6)


def test_momentum_weight_decay_and_logreg():
    one, vec = both("dcasgd-a", 4, "gamma:2", model="logreg", params={"momentum": 0.9, "weight_decay": 1e-3},
                    lr=0.01)
    assert one.weights.abs().max() < 10   # a stable run: differences in the last bits stay small
    assert vec.update_log() == one.update_log()
    torch.testing.assert_close(vec.weights, one.weights, rtol=1e-4, atol=1e-5)


def test_same_seed_same_bits_and_iid_partition():
    a = sg.train("mlp", TRAIN, TEST, "asgd", 5, Simulator(delay="gamma:2", vectorised=True), epochs=1,
                 batch_size=8, seed=4, partition="iid")
    b = sg.train("mlp", TRAIN, TEST, "asgd", 5, Simulator(delay="gamma:2", vectorised=True), epochs=1,
                 batch_size=8, seed=4, partition="iid")
    assert a.summary["weights_sha256"] == b.summary["weights_sha256"]
    c = sg.train("mlp", TRAIN, TEST, "asgd", 5, Simulator(delay="gamma:2"), epochs=1, batch_size=8, seed=4,
                 partition="iid")
    assert c.update_log() == a.update_log()
    torch.testing.assert_close(c.weights, a.weights, rtol=1e-4, atol=1e-5)


def test_batchnorm_running_statistics_match():
    """ResNet-20: batch statistics per worker, running statistics folded in event order."""
    train, test = images(64, seed=0), images(32, seed=1)
    one, vec = both("asgd", 3, "gamma:2", model="resnet20", train=train, test=test, epochs=1, lr=0.01,
                    eval_every=0.5)
    assert vec.update_log() == one.update_log()
    torch.testing.assert_close(vec.weights, one.weights, rtol=1e-3, atol=1e-4)
    sa, sb = one.model.state_dict(), vec.model.state_dict()
    for k in sa:
        if "running" in k or "num_batches" in k:
            torch.testing.assert_close(sb[k].float(), sa[k].float(), rtol=1e-3, atol=1e-4, msg=k)
    # evaluations in the middle of the run use those statistics
    for a, b in zip(one.metrics, vec.metrics):
        assert b["test_loss"] == pytest.approx(a["test_loss"], rel=1e-3)


def test_batched_gradient_equals_each_workers_gradient():
    torch.manual_seed(0)
    model = FlatModel(build_model("cnn", (1, 8, 8), 3))
    ref = FlatModel(build_model("cnn", (1, 8, 8), 3))
    K, B = 4, 5
    W = torch.stack([model.flat + 0.05 * torch.randn_like(model.flat) for _ in range(K)])
    X, Y = torch.randn(K, B, 1, 8, 8), torch.randint(0, 3, (K, B))
    losses, grads, stats, correct = BatchedGradient(model)(W, X, Y)
    assert stats == ()
    for k in range(K):
        loss, g = ref.loss_and_grad(W[k], X[k], Y[k])
        assert losses[k].item() == pytest.approx(loss, rel=1e-5)
        torch.testing.assert_close(grads[k], g, rtol=1e-4, atol=1e-6)
        assert int(correct[k]) == int(ref.correct)   # the batch's correct predictions, as one by one


@pytest.mark.parametrize("algo,workers,delay,params", [
    ("agn", 4, "round-robin", {"window": 3}),
    ("agn", 5, "heterogeneous:sqrt", {"window": 2, "local_weight_decay": 1e-3}),
    ("downpour", 3, "gamma:2", {"window": 2, "local_opt": "sgd", "local_momentum": 0.9}),
    ("dynsgd", 5, "exponential", {"window": 3}),
    ("dynsgd", 3, "straggler:4", {"window": 2, "local_opt": "sgd"}),
    ("easgd", 3, "gamma:1", {"window": 2}),
    ("aeasgd", 4, "heterogeneous:sqrt", {"window": 3}),
    ("diloco", 3, "gamma:1", {"window": 2}),
    ("async-local-sgd", 4, "exponential", {"window": 2}),
])
def test_commit_rules_same_weights_and_tau_sequence_as_one_by_one(algo, workers, delay, params):
    """The windows of waiting workers run stacked; under uneven delays the workers of one batch have
    taken different numbers of Adam steps, so each row keeps its own step count."""
    lr = 0.01
    one, vec = both(algo, workers, delay, params=params, lr=lr)
    assert vec.summary["notes"] == []
    assert vec.update_log() == one.update_log()
    # Adam moves every element by about lr whatever its gradient's size, so an element whose gradients
    # are at rounding level (a nearly dead ReLU) takes steps whose sign is rounding noise: a handful of
    # elements may differ by a fraction of lr; every other one agrees to float tolerance.
    diff = (vec.weights - one.weights).abs()
    assert diff.max() < lr / 10
    assert (diff > 1e-5 + 1e-4 * one.weights.abs()).float().mean() < 1e-3
    for a, b in zip(one.metrics, vec.metrics):
        if a["train_loss"] is not None:
            assert b["train_loss"] == pytest.approx(a["train_loss"], rel=1e-4, abs=1e-6)
    # each message's training accuracy over its window: the same predictions but for near-ties
    diffs = [abs(a["train_acc"] - b["train_acc"]) for a, b in zip(one.messages, vec.messages)]
    assert len(one.messages) == len(vec.messages) and max(diffs) <= 1 / 8 and sum(d > 0 for d in diffs) <= len(diffs) // 10


def test_commit_rule_with_batchnorm_folds_every_local_step():
    train, test = images(48, seed=0), images(32, seed=1)
    one, vec = both("agn", 2, "gamma:2", model="resnet20", train=train, test=test, epochs=1, lr=0.01,
                    params={"window": 2}, eval_every=0.5)
    assert vec.update_log() == one.update_log()
    sa, sb = one.model.state_dict(), vec.model.state_dict()
    for k in sa:
        if "running" in k or "num_batches" in k:
            torch.testing.assert_close(sb[k].float(), sa[k].float(), rtol=1e-3, atol=1e-4, msg=k)


def test_batched_local_optimizer_step_equals_each_rows_step():
    """local_opt.step on K stacked workers (Adam at different step counts) against K separate steps."""
    from stalegrad.algorithms import local_opt
    gen = torch.Generator().manual_seed(0)
    K, n = 3, 50
    for name, kw in [("adam", {"weight_decay": 0.01}), ("sgd", {"momentum": 0.9})]:
        states = [local_opt.init(name, torch.zeros(n), kw.get("momentum", 0.0)) for _ in range(K)]
        W = torch.randn(K, n, generator=gen)
        for k in range(K):             # worker k has taken k steps already
            for _ in range(k):
                local_opt.step(name, states[k], W[k], torch.randn(n, generator=gen), 0.01, **kw)
        G = torch.randn(K, n, generator=gen)
        one = W.clone()
        alone = [dict(s, **{key: v.clone() for key, v in s.items() if isinstance(v, torch.Tensor)}) for s in states]
        for k in range(K):
            local_opt.step(name, alone[k], one[k], G[k], 0.01, **kw)
        batched = local_opt.stack(states)
        local_opt.step(name, batched, W, G, 0.01, **kw)
        local_opt.unstack(batched, states)
        torch.testing.assert_close(W, one, rtol=1e-6, atol=1e-7)
        for s, a in zip(states, alone):
            assert s.keys() == a.keys()
            for key in s:
                torch.testing.assert_close(torch.as_tensor(s[key]), torch.as_tensor(a[key]))


def test_commit_rules_of_a_model_too_large_to_stack_run_one_by_one_with_a_note(monkeypatch):
    from stalegrad.runtimes import vectorised
    monkeypatch.setattr(vectorised, "CPU_STACK_BYTES", 100_000)   # the blobs mlp is 142 kB
    one, vec = both("agn", 3, "round-robin", epochs=1)
    assert vec.summary["weights_sha256"] == one.summary["weights_sha256"]
    assert any("no room to stack two" in n for n in vec.summary["notes"])


def test_changing_learning_rate_runs_commit_rules_one_by_one_with_a_note():
    one, vec = both("agn", 3, "round-robin", epochs=1, lr_milestones=[0.5])
    assert vec.summary["weights_sha256"] == one.summary["weights_sha256"]
    assert any("learning rate changes" in n for n in vec.summary["notes"])
    one, vec = both("asgd", 3, "round-robin", epochs=1, lr_milestones=[0.5])   # gradient rules apply lr at the push
    assert vec.summary["notes"] == []


def test_trace_replay_runs_one_by_one_with_a_note(tmp_path):
    trace = tmp_path / "t.csv"
    trace.write_text("worker\n" + "\n".join(str(i % 3) for i in range(40)) + "\n")
    one, vec = both("asgd", 3, f"trace:{trace}", epochs=1)
    assert vec.summary["weights_sha256"] == one.summary["weights_sha256"]
    assert any("trace replay" in n for n in vec.summary["notes"])


def test_dropout_runs_one_by_one_with_a_note():
    def factory():
        return torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Dropout(0.5), torch.nn.Linear(16, 3))
    res = sg.train(factory, TRAIN, TEST, "asgd", 2, Simulator(vectorised=True), epochs=0.5, batch_size=8)
    assert any("dropout" in n for n in res.summary["notes"])


def test_cli_flag(tmp_path):
    from stalegrad.cli import main
    assert main(["train", "--algo", "dcasgd-a", "--workers", "3", "--dataset", "synthetic", "--epochs", "0.5",
                 "--vectorised", "-q", "--out", str(tmp_path / "v")]) == 0
    import json
    assert json.loads((tmp_path / "v" / "config.json").read_text())["runtime"]["vectorised"] is True
    assert main(["train", "--vectorised", "--runtime", "local", "--out", str(tmp_path / "l")]) == 2
