"""Run directories survive mistakes and concurrent runs: each defect found by hand, reproduced."""
import json
import os
import signal
import subprocess
import sys
import time

import pytest
import torch

from stalegrad.cli import main
from stalegrad.rundir import LOCK_FILE, RunWriter
from stalegrad.results import OutputError

RUN = ["--dataset", "synthetic", "--model", "logreg", "--workers", "2", "--epochs", "0.3", "--quiet"]
FILES = ["config.json", "metrics.jsonl", "staleness.json", "summary.json", "model.pt"]


def cli(capsys, *args):
    code = main([str(a) for a in args])
    out, err = capsys.readouterr()
    return code, out, err


def snapshot(d):
    return {f: (d / f).read_bytes() for f in FILES}


@pytest.fixture
def finished(tmp_path, capsys):
    out = tmp_path / "R"
    code, _, err = cli(capsys, "train", *RUN, "--out", out)
    assert code == 0, err
    return out


@pytest.mark.parametrize("bad", [["--lr-milestones", "2,1"], ["--lr", "nan"], ["--epochs", "inf"],
                                 ["--delay", "trace:/nonexistent.csv"], ["--model", "cnn"],
                                 ["--seed", "99999999999999999999999"], ["--batch-size", "100000"]])
def test_overwrite_with_a_bad_input_keeps_the_old_run(finished, capsys, bad):
    before = snapshot(finished)
    code, _, err = cli(capsys, "train", *RUN, *bad, "--overwrite", "--out", finished)
    assert code == 2 and len(err.strip().splitlines()) == 1 and "Traceback" not in err
    assert snapshot(finished) == before


def test_overwrite_keeps_the_old_files_until_the_new_run_starts(finished, capsys, monkeypatch):
    before = snapshot(finished)
    import stalegrad.training as training

    def fail_before_start(*a, **k):
        raise training.ConfigError("epochs", "refused here, just before the run starts")
    monkeypatch.setattr(training.TrainingRun, "__init__", fail_before_start)
    code, _, err = cli(capsys, "train", *RUN, "--overwrite", "--out", finished)
    assert code == 2 and snapshot(finished) == before


def test_a_second_run_on_a_locked_directory_fails_at_once_naming_the_pid(finished, capsys):
    holder = RunWriter(finished, resume=True).open()        # another run, in progress
    try:
        before = snapshot(finished)
        t0 = time.monotonic()
        code, _, err = cli(capsys, "train", *RUN, "--overwrite", "--out", finished)
        assert code == 2 and time.monotonic() - t0 < 30
        assert f"another run (PID {os.getpid()}) is using this directory" in err
        assert snapshot(finished) == before
        code, _, err = cli(capsys, "train", "--resume", finished)
        assert code == 2 and "another run (PID" in err
    finally:
        holder.close()
    code, _, err = cli(capsys, "train", *RUN, "--overwrite", "--out", finished)
    assert code == 0, err


def test_a_lock_left_by_a_dead_process_does_not_block(tmp_path, capsys):
    out = tmp_path / "R"
    locker = ("import sys, time; from stalegrad.rundir import RunWriter; RunWriter(sys.argv[1]).open(); "
              "print('locked', flush=True); time.sleep(60)")
    proc = subprocess.Popen([sys.executable, "-c", locker, str(out)], stdout=subprocess.PIPE, text=True)
    assert proc.stdout.readline().strip() == "locked"
    code, _, err = cli(capsys, "train", *RUN, "--out", out)
    assert code == 2 and f"PID {proc.pid}" in err
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    assert (out / LOCK_FILE).exists()                        # the file stays; the kernel dropped the lock
    code, _, err = cli(capsys, "train", *RUN, "--out", out)
    assert code == 0, err


def test_two_runs_started_together_one_wins_and_nothing_is_mixed(tmp_path):
    out = tmp_path / "R"
    cmd = [sys.executable, "-m", "stalegrad", "train", *RUN, "--epochs", "2", "--out", str(out)]
    procs = [subprocess.Popen(cmd + ["--seed", str(s)], stderr=subprocess.PIPE, text=True) for s in (1, 2)]
    results = [(p.wait(), p.stderr.read()) for p in procs]
    codes = sorted(c for c, _ in results)
    assert codes == [0, 2], results
    loser = next(err for c, err in results if c == 2)
    assert "another run (PID" in loser or "already holds a run" in loser
    winner_seed = json.loads((out / "config.json").read_text())["seed"]
    summary = json.loads((out / "summary.json").read_text())
    assert torch.load(out / "model.pt", weights_only=True)["summary"]["weights_sha256"] == summary["weights_sha256"]
    seeds = {json.loads(line)["samples"] for line in (out / "metrics.jsonl").read_text().splitlines()}
    assert len(seeds) == len((out / "metrics.jsonl").read_text().splitlines())   # one run's lines, no duplicates
    assert winner_seed in (1, 2)


def test_a_failed_command_leaves_no_new_directory(tmp_path, capsys):
    out = tmp_path / "new" / "R"
    code, _, err = cli(capsys, "train", *RUN, "--lr", "-1", "--out", out)
    assert code == 2 and not (tmp_path / "new").exists()


def test_a_crashed_checkpoint_write_leaves_no_temp_file_after_resume(tmp_path, capsys):
    out = tmp_path / "R"
    code, _, err = cli(capsys, "train", *RUN, "--checkpoint-every", "5", "--out", out)
    assert code == 0, err
    stale = out / ".checkpoint.pt.abc123.tmp"
    stale.write_bytes(b"half a checkpoint")                  # what a kill -9 mid-write leaves
    code, _, err = cli(capsys, "train", "--resume", out, "--epochs", "0.6")
    assert code == 0, err
    assert not stale.exists() and not list(out.glob(".*.tmp"))


def test_resume_may_not_shrink_the_epochs(tmp_path, capsys):
    out = tmp_path / "R"
    assert cli(capsys, "train", *RUN, "--epochs", "2", "--checkpoint-every", "5", "--out", out)[0] == 0
    before = snapshot(out)
    code, _, err = cli(capsys, "train", "--resume", out, "--epochs", "0.5")
    assert code == 2 and "--epochs is 0.5, but the run to resume has already trained 2 epochs" in err
    assert snapshot(out) == before


@pytest.mark.parametrize("damage", ["config", "checkpoint"])
def test_resume_of_a_damaged_run_is_one_line(tmp_path, capsys, damage):
    out = tmp_path / "R"
    assert cli(capsys, "train", *RUN, "--checkpoint-every", "5", "--out", out)[0] == 0
    if damage == "config":
        cfg = json.loads((out / "config.json").read_text())
        cfg["workers"] = "two"
        (out / "config.json").write_text(json.dumps(cfg))
    else:
        state = torch.load(out / "checkpoint.pt", weights_only=True)
        del state["run"]["progress"]["samples"]
        torch.save(state, out / "checkpoint.pt")
    code, _, err = cli(capsys, "train", "--resume", out)
    assert code == 2 and len(err.strip().splitlines()) == 1 and "Traceback" not in err, err
    assert ("samples" in err) if damage == "checkpoint" else ("--workers" in err)


def test_every_json_file_is_strict_and_a_divergence_is_reported(tmp_path, capsys):
    out = tmp_path / "R"
    code, _, err = cli(capsys, "train", *RUN, "--model", "mlp", "--algo", "asgd", "--lr", "1e35", "--out", out)
    assert code == 0
    assert "warning: the run diverged" in err and "--on-nonfinite stop" in err
    for name in ("config.json", "summary.json", "staleness.json"):
        text = (out / name).read_text()
        json.loads(text, parse_constant=lambda c: pytest.fail(f"{name} holds {c}"))
    for line in (out / "metrics.jsonl").read_text().splitlines():
        json.loads(line, parse_constant=lambda c: pytest.fail(f"metrics.jsonl holds {c}"))
    summary = json.loads((out / "summary.json").read_text())
    assert summary["diverged"] is True and summary["nonfinite_skipped"] > summary["updates"]


def test_a_run_directory_removed_mid_run_ends_in_one_line(tmp_path, capsys, monkeypatch):
    import shutil

    from stalegrad.rundir import RunWriter as Writer
    out = tmp_path / "R"
    metric = Writer.metric
    calls = []

    def metric_then_vanish(self, record):
        calls.append(record)
        if len(calls) == 2:
            shutil.rmtree(self.dir)
        metric(self, record)
    monkeypatch.setattr(Writer, "metric", metric_then_vanish)
    code, _, err = cli(capsys, "train", *RUN, "--eval-every", "0.1", "--out", out)
    assert code == 1 and len(err.strip().splitlines()) == 1
    assert "the run directory was removed" in err and "Traceback" not in err


def test_writer_refuses_a_file_in_the_way(tmp_path):
    (tmp_path / "f").write_text("x")
    with pytest.raises(OutputError, match="exists and is not a directory"):
        RunWriter(tmp_path / "f")


def test_resuming_a_finished_local_run_keeps_its_final_weights(tmp_path, capsys):
    out = tmp_path / "R"
    args = ["train", "--runtime", "local", "--dataset", "synthetic", "--model", "logreg", "--workers", "2",
            "--epochs", "0.5", "--checkpoint-every", "4", "--quiet", "--out", out]
    assert cli(capsys, *args)[0] == 0
    before = json.loads((out / "summary.json").read_text())
    code, _, err = cli(capsys, "train", "--resume", out)          # nothing left to train
    assert code == 0, err
    after = json.loads((out / "summary.json").read_text())
    assert after["weights_sha256"] == before["weights_sha256"] and after["updates"] == before["updates"]


def test_a_trace_with_only_a_header_says_so(tmp_path, capsys):
    trace = tmp_path / "t.csv"
    trace.write_text("worker,pulled,applied,wall_s\n")
    code, _, err = cli(capsys, "train", *RUN, "--delay", f"trace:{trace}", "--out", tmp_path / "R")
    assert code == 2 and "the trace has a header but no pushes" in err and "no 'worker' column" not in err


def test_run_files_are_as_readable_as_any_new_file(finished):
    mask = os.umask(0)
    os.umask(mask)
    for name in FILES:
        assert (finished / name).stat().st_mode & 0o777 == 0o666 & ~mask, name
