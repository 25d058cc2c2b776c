"""Per-message records (messages.jsonl): the workers' training accuracy of Hermans et al."""
import json
import math

import pytest
import torch
import torch.nn.functional as F

import stalegrad as sg
from stalegrad.runtimes import Simulator
from stalegrad.core.worker import BatchStream, FlatModel, WorkerFactory

from helpers import TEST, TRAIN


def mlp():
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 3))


def test_train_acc_is_the_accuracy_of_each_local_step_at_the_weights_it_used():
    """agn, window 3, local SGD: replay the worker's three mini-batches and weights by hand."""
    algo = sg.make_algorithm("agn", window=3, local_opt="sgd")
    module = mlp()
    model = FlatModel(module)
    w0 = model.flat.clone()
    factory = WorkerFactory(algo, 2, 16, "shard", 4, TRAIN.x, TRAIN.y, w0=w0, model=model)
    worker = factory.build(1)
    worker.compute(w0.clone(), lr=0.5)
    # by hand: the same stream, plain local SGD steps, counting correct predictions before each step
    stream = BatchStream(len(TRAIN.y), 1, 2, 16, "shard", 4)
    ref = mlp()
    params = list(ref.parameters())
    correct = 0
    for _ in range(3):
        idx = stream.next()
        logits = ref(TRAIN.x[idx])
        correct += int((logits.argmax(1) == TRAIN.y[idx]).sum())
        grads = torch.autograd.grad(F.cross_entropy(logits, TRAIN.y[idx]), params)
        with torch.no_grad():
            for p, g in zip(params, grads):
                p -= 0.5 * g
    assert worker.train_acc == pytest.approx(correct / 48, abs=1e-12)
    assert 0 < correct < 48      # neither trivially 0 nor 1: the count can be wrong


def run(algo, workers, vectorised=False, **kw):
    return sg.train(mlp(), TRAIN, TEST, algo, workers, Simulator(vectorised=vectorised), epochs=2, batch_size=16,
                    eval_every=0.5, seed=3, **kw)


@pytest.mark.parametrize("algo,workers", [("asgd", 4), ("agn", 3), ("ssgd", 2), ("aeasgd", 2)])
def test_one_record_per_message_and_the_evaluations_average_them(algo, workers):
    r = run(algo, workers)
    msgs = r.messages
    assert len(msgs) == r.summary["updates"] * (workers if algo == "ssgd" else 1)
    assert [m["samples"] for m in msgs] == sorted(m["samples"] for m in msgs)
    assert msgs[-1]["samples"] == r.summary["samples"]
    assert round(msgs[-1]["virtual_s"], 6) == r.summary["virtual_s"]   # summary.json: to the microsecond
    assert all(0 <= m["train_acc"] <= 1 and math.isfinite(m["loss"]) for m in msgs)
    # every evaluation's train_acc: the sample-weighted mean of the messages since the one before
    prev = 0
    for rec in r.metrics[1:]:
        between = [m for m in msgs if prev < m["samples"] <= rec["samples"]]
        weights = [m["samples"] - p["samples"] for p, m in zip([{"samples": prev}] + between, between)]
        want = sum(w * m["train_acc"] for w, m in zip(weights, between)) / sum(weights)
        assert rec["train_acc"] == pytest.approx(want, rel=1e-12)
        prev = rec["samples"]
    assert r.metrics[0]["train_acc"] is None   # epoch 0: nothing trained yet


def test_vectorised_mode_reports_the_same_training_accuracy():
    one, vec = run("dcasgd-a", 4), run("dcasgd-a", 4, vectorised=True)
    assert [m["samples"] for m in one.messages] == [m["samples"] for m in vec.messages]
    # same mini-batches at (to float tolerance) the same weights: the same predictions but for near-ties
    diffs = [abs(a["train_acc"] - b["train_acc"]) for a, b in zip(one.messages, vec.messages)]
    assert max(diffs) <= 1 / 16 and sum(d > 0 for d in diffs) <= len(diffs) // 20


def test_cli_writes_messages_jsonl_and_report_uses_it_for_the_workers_variant(tmp_path):
    from stalegrad.cli import main
    from stalegrad.study.report_curves import workers_curve
    from stalegrad.run.results import read_run
    for algo in ("agn", "downpour"):
        out = tmp_path / algo
        assert main(["train", "--algo", algo, "--workers", "3", "--dataset", "digits", "--model", "logreg",
                     "--epochs", "1", "--out", str(out), "--quiet"]) == 0
        lines = (out / "messages.jsonl").read_text().splitlines()
        run_ = read_run(out)
        assert len(lines) == len(run_["messages"]) == json.loads((out / "summary.json").read_text())["updates"]
        t, acc = workers_curve(run_)
        assert len(t) >= 1 and all(0 <= a <= 1 for a in acc)
    assert main(["report", str(tmp_path / "agn"), str(tmp_path / "downpour"), "--variant", "workers",
                 "--baseline", "downpour", "--out", str(tmp_path / "rep")]) == 0
    text = (tmp_path / "rep" / "report.md").read_text()
    assert "training accuracy" in text and "needs per-message" not in text
