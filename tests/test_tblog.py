"""--tensorboard: the run's figures as TensorBoard events, read back with tensorboard's own reader."""
import json
import sys

import pytest

from stalegrad.cli import main

event_accumulator = pytest.importorskip("tensorboard.backend.event_processing.event_accumulator")


def read_events(logdir):
    acc = event_accumulator.EventAccumulator(str(logdir), size_guidance={"scalars": 0, "histograms": 0,
                                                                         "tensors": 0})
    acc.Reload()
    return acc


def test_train_writes_the_run_directorys_figures(tmp_path):
    out, board = tmp_path / "run", tmp_path / "tb"
    assert main(["train", "--algo", "dcasgd-a", "--workers", "4", "--dataset", "digits", "--model", "logreg",
                 "--epochs", "2", "--eval-every", "0.5", "--delay", "gamma:2", "--out", str(out), "--quiet",
                 "--tensorboard", str(board)]) == 0
    metrics = [json.loads(ln) for ln in (out / "metrics.jsonl").read_text().splitlines()]
    messages = (out / "messages.jsonl").read_text().splitlines()
    summary = json.loads((out / "summary.json").read_text())
    ev = read_events(board)
    acc = ev.Scalars("eval/test_acc")
    assert [(e.step, round(e.value, 6)) for e in acc] == [(m["samples"], round(m["test_acc"], 6)) for m in metrics]
    assert len(ev.Scalars("eval/train_acc")) == len(metrics) - 1      # none at epoch 0
    assert len(ev.Scalars("workers/train_acc")) == len(messages) == summary["updates"]
    hists = ev.Histograms("staleness/tau")
    assert sum(h.histogram_value.num for h in hists) == summary["updates"]   # every applied update once
    assert max(h.histogram_value.max for h in hists) == summary["tau_max"]
    assert ev.Scalars("final/final_test_acc")[0].value == pytest.approx(summary["final_test_acc"])


def test_compare_writes_one_log_per_algorithm(tmp_path):
    assert main(["compare", "--algos", "sgd,agn", "--workers", "2", "--dataset", "digits", "--model", "logreg",
                 "--epochs", "1", "--out", str(tmp_path / "cmp"), "--quiet", "--tensorboard", str(tmp_path / "tb")]) == 0
    for algo in ("sgd", "agn"):
        assert read_events(tmp_path / "tb" / algo).Scalars("eval/test_acc")


def test_without_the_package_it_is_one_line_and_nothing_runs(tmp_path, monkeypatch, capsys):
    monkeypatch.setitem(sys.modules, "torch.utils.tensorboard", None)   # import fails
    code = main(["train", "--dataset", "digits", "--model", "logreg", "--out", str(tmp_path / "run"),
                 "--tensorboard", str(tmp_path / "tb")])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1
    assert "--tensorboard needs the tensorboard package: pip install 'tensorboard>=2.14'" in err[0]
    assert not (tmp_path / "run").exists() and not (tmp_path / "tb").exists()


def test_a_file_in_the_way_is_one_line(tmp_path, capsys):
    (tmp_path / "f").write_text("")
    code = main(["train", "--dataset", "digits", "--model", "logreg", "--out", str(tmp_path / "run"),
                 "--tensorboard", str(tmp_path / "f" / "tb")])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1 and "is a file, not a directory; give a directory" in err[0]
    assert not (tmp_path / "run").exists()
