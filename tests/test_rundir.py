"""Run directories survive mistakes and concurrent runs: each defect found by hand, reproduced."""
import json
import os
import signal
import subprocess
import sys
import time

import pytest
import torch

import stalegrad.errors as sg_errors
from stalegrad.cli import main
from stalegrad.run.rundir import LOCK_FILE, RunWriter
from stalegrad.run.results import OutputError

from helpers import checkpointed_run

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
                                 ["--seed", "99999999999999999999999"], ["--batch-size", "100000"],
                                 # issue 32: these removed the finished run, then hung or crashed
                                 ["--delay", "gamma:1e308"], ["--delay", "trace:NEGATIVE"]])
def test_overwrite_with_a_bad_input_keeps_the_old_run(finished, capsys, bad):
    if bad[-1] == "trace:NEGATIVE":   # bare worker ids, one of them negative
        (finished.parent / "t.txt").write_text("0\n1\n-5\n0\n")
        bad = ["--delay", f"trace:{finished.parent / 't.txt'}"]
    before = every_file(finished)
    code, _, err = cli(capsys, "train", *RUN, *bad, "--overwrite", "--out", finished)
    assert code == 2 and len(err.strip().splitlines()) == 1 and "Traceback" not in err
    assert every_file(finished) == before


def test_overwrite_keeps_the_old_files_until_the_new_run_starts(finished, capsys, monkeypatch):
    before = snapshot(finished)
    import stalegrad.run.training as training

    def fail_before_start(*a, **k):
        raise training.ConfigError("epochs", "refused here, just before the run starts")
    monkeypatch.setattr(training.TrainingRun, "__init__", fail_before_start)
    code, _, err = cli(capsys, "train", *RUN, "--overwrite", "--out", finished)
    assert code == 2 and snapshot(finished) == before


class Stop(Exception):
    pass


def stop_before_the_first_step(monkeypatch, how):
    """The simulator's loop stops before any message is applied: an interrupt, a crash, or a run that
    hangs there and is broken off (gamma:1e308 hung in the loop's first delay draw)."""
    from stalegrad.runtimes.events import EventLoop

    def begin(self):
        raise how()
    monkeypatch.setattr(EventLoop, "begin", begin)


@pytest.mark.parametrize("how", [KeyboardInterrupt, Stop])
def test_overwrite_keeps_the_old_run_until_the_first_step(finished, capsys, monkeypatch, how):
    """Issue 32 item 1: every check passed, the run started, and stopped before its first step: the old
    run is there byte for byte (and no file of the new one)."""
    before = every_file(finished)
    stop_before_the_first_step(monkeypatch, how)
    if how is Stop:
        with pytest.raises(Stop):
            cli(capsys, "train", *RUN, "--seed", "3", "--overwrite", "--out", finished)
    else:
        code, _, err = cli(capsys, "train", *RUN, "--seed", "3", "--overwrite", "--out", finished)
        assert code == 130 and err.strip() == "stalegrad: interrupted", err
    assert every_file(finished) == before


def test_overwrite_replaces_the_old_run_once_the_first_step_is_taken(finished, capsys, monkeypatch):
    from stalegrad.core.server import ParameterServer
    original = ParameterServer.push

    def push(self, worker, msg, lr):
        if self.version == 1:   # the second message: the first one is applied
            raise KeyboardInterrupt
        return original(self, worker, msg, lr)
    monkeypatch.setattr(ParameterServer, "push", push)
    code, _, err = cli(capsys, "train", *RUN, "--seed", "3", "--overwrite", "--out", finished)
    assert code == 130
    assert json.loads((finished / "config.json").read_text())["seed"] == 3      # the new run's
    assert sorted(p.name for p in finished.iterdir() if p.name != LOCK_FILE) == ["config.json", "metrics.jsonl"]


def test_a_new_run_stopped_before_its_first_step_leaves_no_directory(tmp_path, capsys, monkeypatch):
    stop_before_the_first_step(monkeypatch, KeyboardInterrupt)
    code, _, err = cli(capsys, "train", *RUN, "--out", tmp_path / "new" / "R")
    assert code == 130 and not (tmp_path / "new" / "R").exists()


@pytest.mark.parametrize("cause", ["full disk", "read-only"])
def test_a_lock_that_cannot_be_written_is_one_line_and_leaves_no_lock(finished, tmp_path, capsys, monkeypatch, cause):
    """Issue 32 item 6: the PID written into .lock on a full disk was a 30-line OSError and left a .lock."""
    import errno

    def pwrite(fd, data, offset):
        raise OSError(errno.ENOSPC if cause == "full disk" else errno.EROFS,
                      os.strerror(errno.ENOSPC if cause == "full disk" else errno.EROFS))
    (finished / LOCK_FILE).unlink()
    before = every_file(finished)
    (tmp_path / "empty").mkdir()
    monkeypatch.setattr(os, "pwrite", pwrite)
    for out, extra in ((finished, ["--overwrite"]), (tmp_path / "empty", []), (tmp_path / "new", [])):
        code, _, err = cli(capsys, "train", *RUN, *extra, "--out", out)
        assert code == 2 and len(err.strip().splitlines()) == 1 and "Traceback" not in err, err
        assert f"cannot write the lock file {LOCK_FILE} ({os.strerror(errno.ENOSPC if cause == 'full disk' else errno.EROFS)})" in err
        assert not (out / LOCK_FILE).exists()
    assert every_file(finished) == before and not list((tmp_path / "empty").iterdir())
    assert not (tmp_path / "new").exists()


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
    locker = ("import sys, time; from stalegrad.run.rundir import RunWriter; RunWriter(sys.argv[1]).open(); "
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
    assert code == 2 and ("--epochs is 0.5, but the run to resume is configured for 2 epochs, and a resumed run "
                          "may only be extended; give 2 or more") in err, err
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
    assert ("samples" in err) if damage == "checkpoint" else ("config.json: workers must be an integer" in err)


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

    from stalegrad.run.rundir import RunWriter as Writer
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


# ---- issue 17: the remaining ways to lose or corrupt a run ---------------------------------
def every_file(d):
    """Every file of a run directory, byte for byte (the lock file holds the PID of its last holder)."""
    return {p.name: p.read_bytes() for p in sorted(d.iterdir()) if p.is_file() and p.name != LOCK_FILE}


@pytest.fixture(scope="module")
def checkpointed(tmp_path_factory):
    """A finished 2-epoch run with its checkpoint, made once; each test damages a copy."""
    out = tmp_path_factory.mktemp("checkpointed") / "R"
    assert main(["train", *RUN, "--epochs", "2", "--checkpoint-every", "5", "--out", str(out)]) == 0
    return out


def copy_of(run_dir, tmp_path):
    import shutil
    shutil.copytree(run_dir, tmp_path / "R")
    return tmp_path / "R"


def _drop_worker(st):
    st["runtime"]["workers"].pop()


def _cut_weights(st):
    st["run"]["server"]["w"] = st["run"]["server"]["w"][:-1]


def _garbage_rng(st):
    st["run"]["torch_rng"] = torch.arange(10, dtype=torch.uint8)


def _garbage_worker_rng(st):
    st["runtime"]["workers"][1]["stream"]["rng"] = torch.zeros(3, dtype=torch.uint8)


def _metrics_string(st):
    st["run"]["progress"]["metrics"] = "not a list"


def _metric_without_accuracy(st):
    del st["run"]["progress"]["metrics"][-1]["test_acc"]


def _short_pulled_version(st):
    st["run"]["server"]["pulled_version"] = st["run"]["server"]["pulled_version"][:1]


def _sample_index_out_of_range(st):
    st["runtime"]["workers"][0]["stream"]["order"][0] = 10 ** 9


def _worker_in_heap_out_of_range(st):
    t, q, _ = st["runtime"]["heap"][0]
    st["runtime"]["heap"][0] = (t, q, 7)


def test_an_intact_checkpoint_still_resumes_and_extends(checkpointed, tmp_path, capsys):
    out = copy_of(checkpointed, tmp_path)
    code, _, err = cli(capsys, "train", "--resume", out, "--epochs", "3")
    assert code == 0, err
    assert json.loads((out / "config.json").read_text())["epochs"] == 3
    assert json.loads((out / "summary.json").read_text())["epochs"] >= 3


# ---- issue 32: a checkpoint checked against the complete schema; config.json edits; extensions -----------
@pytest.fixture(scope="module")
def checkpointed_val(tmp_path_factory):
    """A finished run with a validation split (its evaluations hold val_loss and val_acc) and a checkpoint."""
    return checkpointed_run(tmp_path_factory.mktemp("checkpointed_val") / "R", *RUN, "--val-split", "200")


def _metric_without_val_acc(st):
    del st["run"]["progress"]["metrics"][-1]["val_acc"]


def _metric_val_acc_a_string(st):
    st["run"]["progress"]["metrics"][-1]["val_acc"] = "0.9"


def _metric_with_an_unknown_key(st):
    st["run"]["progress"]["metrics"][0]["colour"] = 1


def _metric_accuracy_above_one(st):
    st["run"]["progress"]["metrics"][-1]["test_acc"] = 7.5


def _metrics_out_of_order(st):
    st["run"]["progress"]["metrics"][0]["samples"] = st["run"]["progress"]["samples"] + 1


def _metric_updates_past_the_version(st):
    st["run"]["progress"]["metrics"][-1]["updates"] = st["run"]["server"]["version"] + 1


def _samples_far_past_the_budget(st):
    st["run"]["progress"]["samples"] = 10 ** 12       # "finished", claiming 7.5e8 epochs


def _samples_past_the_messages(st):
    st["run"]["progress"]["samples"] += 1


@pytest.mark.parametrize("damage", [_drop_worker, _cut_weights, _garbage_rng, _garbage_worker_rng, _metrics_string,
                                    _metric_without_accuracy, _short_pulled_version, _sample_index_out_of_range,
                                    _worker_in_heap_out_of_range,
                                    # issue 32 item 2: these passed every check
                                    _metric_without_val_acc, _metric_val_acc_a_string, _metric_with_an_unknown_key,
                                    _metric_accuracy_above_one, _metrics_out_of_order,
                                    _metric_updates_past_the_version, _samples_far_past_the_budget,
                                    _samples_past_the_messages], ids=lambda f: f.__name__.strip("_"))
def test_a_damaged_checkpoint_is_refused_before_anything_changes(checkpointed_val, tmp_path, capsys, damage):
    """Each damage passes the load check (a dict of the right format and keys) but not the run: refused
    in one line, exit 2, and config.json, metrics.jsonl and the rest byte for byte as they were. (Issue 32:
    saved metrics without val_acc, or a string there, passed every check; the resume then deleted
    summary.json, rewrote the run's files and died with a KeyError.)"""
    out = copy_of(checkpointed_val, tmp_path)
    state = torch.load(out / "checkpoint.pt", weights_only=True)
    damage(state)
    torch.save(state, out / "checkpoint.pt")
    before = every_file(out)
    code, _, err = cli(capsys, "train", "--resume", out, "--epochs", "3")
    assert code == 2 and len(err.strip().splitlines()) == 1 and "Traceback" not in err, err
    assert "checkpoint.pt: damaged checkpoint" in err and "resume from an intact one" in err
    assert every_file(out) == before


def _edit(key_path, value):
    def edit(cfg):
        *parents, last = key_path
        for k in parents:
            cfg = cfg[k]
        cfg[last] = value
    edit.__name__ = ".".join(key_path)
    return edit


@pytest.mark.parametrize("edit,needle", [
    (_edit(["runtime", "delay"], "exponential"), "made with delay 'gamma:2', but this run has 'exponential'"),
    (_edit(["runtime", "step_time"], 2.0), "made with step_time 1.0, but this run has 2.0"),
    (_edit(["lr"], 0.5), "made with schedule"),
    (_edit(["on_nonfinite"], "stop"), "made with on_nonfinite 'skip'"),
    (_edit(["colour"], "red"), "config.json holds 'colour', which is no option of a run"),
    (_edit(["algorithm", "colour"], 1), "config.json holds 'algorithm.colour'"),
    (_edit(["runtime", "colour"], 1), "config.json holds 'runtime.colour'"),
    (_edit(["overwrite"], True), "config.json holds 'overwrite'"),
], ids=lambda v: getattr(v, "__name__", None) or "")
def test_an_edited_config_is_refused_on_resume(checkpointed, tmp_path, capsys, edit, needle):
    """Issue 32 item 11: a changed delay model ran (two models mixed, config.json naming one); unknown
    keys were dropped silently."""
    out = copy_of(checkpointed, tmp_path)
    cfg = json.loads((out / "config.json").read_text())
    edit(cfg)
    (out / "config.json").write_text(json.dumps(cfg))
    before = every_file(out)
    code, _, err = cli(capsys, "train", "--resume", out, "--epochs", "3")
    assert code == 2 and len(err.strip().splitlines()) == 1 and needle in err, err
    assert every_file(out) == before


def test_extending_a_finished_run_keeps_its_history(tmp_path, capsys):
    """Issue 32 item 12: the final evaluation of the 1-epoch run stays as it was, the extension's come after
    it, and the weights are a never-stopped 2-epoch run's."""
    one, two = tmp_path / "one", tmp_path / "two"
    assert cli(capsys, "train", *RUN, "--epochs", "1", "--checkpoint-every", "5", "--out", one)[0] == 0
    before = (one / "metrics.jsonl").read_text().splitlines()
    final = json.loads(before[-1])
    assert final["samples"] == json.loads((one / "summary.json").read_text())["samples"]
    code, _, err = cli(capsys, "train", "--resume", one, "--epochs", "2")
    assert code == 0, err
    after = (one / "metrics.jsonl").read_text().splitlines()
    assert after[:len(before)] == before, "the evaluations before the resume changed"
    added = [json.loads(line) for line in after[len(before):]]
    assert added and all(m["updates"] > final["updates"] and m["samples"] > final["samples"] for m in added)
    assert cli(capsys, "train", *RUN, "--epochs", "2", "--checkpoint-every", "5", "--out", two)[0] == 0
    sha = [json.loads((d / "summary.json").read_text())["weights_sha256"] for d in (one, two)]
    assert sha[0] == sha[1]


def test_a_resume_changes_nothing_before_its_first_step(checkpointed, tmp_path, capsys, monkeypatch):
    """The extension of a finished run stopped before its first message: still the finished run."""
    out = copy_of(checkpointed, tmp_path)
    before = every_file(out)
    from stalegrad.core.server import ParameterServer

    def push(self, worker, msg, lr):
        raise KeyboardInterrupt
    monkeypatch.setattr(ParameterServer, "push", push)
    code, _, err = cli(capsys, "train", "--resume", out, "--epochs", "3")
    assert code == 130 and every_file(out) == before


def test_an_interrupt_once_summary_json_is_written_is_ignored(tmp_path, capsys, monkeypatch):
    """Issue 32 item 14: the run is finished; the command exits 0 (its summary line said), no traceback,
    and a caller in this process gets its own SIGINT handler back."""
    import stalegrad.run.rundir as rundir
    from pathlib import Path
    written = rundir.write_json

    def write_json(path, obj):
        written(path, obj)
        if Path(path).name == "summary.json":
            os.kill(os.getpid(), signal.SIGINT)
            time.sleep(0.1)
    monkeypatch.setattr(rundir, "write_json", write_json)
    handler = signal.getsignal(signal.SIGINT)
    code, out, err = cli(capsys, "train", *RUN, "--out", tmp_path / "R")
    assert code == 0 and "interrupted" not in err and "Traceback" not in err and "test acc" in out, err
    assert signal.getsignal(signal.SIGINT) is handler


def test_an_interrupt_while_the_process_exits_adds_no_traceback():
    """Python's exit runs finalisers (torch's for a while); an interrupt there printed a KeyboardInterrupt
    traceback after the command had finished with exit code 0."""
    probe = ("import atexit, os, signal, sys, time; from stalegrad.cli import main; "
             "atexit.register(lambda: (os.kill(os.getpid(), signal.SIGINT), time.sleep(0.2))); "
             "sys.argv = ['stalegrad', 'algorithms']; sys.exit(main())")
    proc = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True)
    assert proc.returncode == 0 and "KeyboardInterrupt" not in proc.stderr and not proc.stderr, proc.stderr


@pytest.mark.parametrize("how", ["directory", "not-utf8", "not-json", "unreadable"])
def test_resume_with_an_unreadable_config_is_one_line(checkpointed, tmp_path, capsys, how):
    out = copy_of(checkpointed, tmp_path)
    config = out / "config.json"
    if how == "directory":
        config.unlink()
        config.mkdir()
    elif how == "not-utf8":
        config.write_bytes(b"\xff\xfe{\x00")
    elif how == "not-json":
        config.write_text("{ half a json")
    else:
        if os.geteuid() == 0:
            pytest.skip("root reads a file of mode 000")
        config.chmod(0)
    code, _, err = cli(capsys, "train", "--resume", out)
    assert code == 2 and len(err.strip().splitlines()) == 1 and "Traceback" not in err, err
    assert "config.json" in err


@pytest.fixture
def small_disk(tmp_path):
    """A file system of 300 KiB (a tmpfs) to fill; mounting one needs root (skipped otherwise)."""
    if os.geteuid() != 0:
        pytest.skip("mounting a tmpfs needs root")
    disk = tmp_path / "disk"
    disk.mkdir()
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=300k", "tmpfs", str(disk)],
                             capture_output=True, text=True)
    if mounted.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {mounted.stderr.strip()}")
    try:
        yield disk
    finally:
        subprocess.run(["umount", "-l", str(disk)], check=False)


def fill(disk):
    """Write to ``disk`` until it is full."""
    import errno
    with open(disk / "filler", "wb", buffering=0) as f:
        with pytest.raises(OSError) as full:
            while True:
                f.write(b"\0" * 4096)
    assert full.value.errno == errno.ENOSPC


def test_a_full_disk_at_the_lock_is_one_line_and_leaves_no_lock(small_disk, capsys):
    """Issue 32 item 6, on a real full disk: creating .lock needs no space, writing the PID into it does."""
    (small_disk / "R").mkdir()
    fill(small_disk)
    for out in (small_disk / "R", small_disk / "new"):
        code, _, err = cli(capsys, "train", *RUN, "--out", out)
        assert code == 2 and len(err.strip().splitlines()) == 1 and "Traceback" not in err, err
        assert "(No space left on device)" in err and not (out / LOCK_FILE).exists(), err
    assert not (small_disk / "new").exists() and not list((small_disk / "R").iterdir())


def test_a_read_only_run_directory_is_refused_before_the_data_is_read(small_disk, capsys, monkeypatch):
    out = small_disk / "R"
    assert cli(capsys, "train", *RUN, "--checkpoint-every", "5", "--out", out)[0] == 0
    subprocess.run(["mount", "-o", "remount,ro", str(small_disk)], check=True)
    import stalegrad.cli.run as run_cli
    monkeypatch.setattr(run_cli, "load_data", lambda params: pytest.fail("the data was read first"))
    code, _, err = cli(capsys, "train", "--resume", out)
    assert code == 2 and len(err.strip().splitlines()) == 1 and "Traceback" not in err, err
    assert "read-only file system" in err and "make it writable" in err


def test_a_run_directory_this_user_cannot_write_is_refused_before_the_data_is_read(checkpointed, tmp_path, capsys,
                                                                                   monkeypatch):
    if os.geteuid() == 0:
        pytest.skip("root writes into a directory of mode 555")
    out = copy_of(checkpointed, tmp_path)
    out.chmod(0o555)
    try:
        import stalegrad.cli.run as run_cli
        monkeypatch.setattr(run_cli, "load_data", lambda params: pytest.fail("the data was read first"))
        code, _, err = cli(capsys, "train", "--resume", out)
        assert code == 2 and "not writable by this user" in err and "Traceback" not in err, err
    finally:
        out.chmod(0o755)


def test_a_metrics_line_on_a_full_disk_is_whole_or_absent(small_disk):
    writer = RunWriter(small_disk / "R").open()
    try:
        writer.start({"algorithm": {"name": "asgd"}}, [{"samples": 0, "test_acc": 0.1}])
        writer.commit()   # (the first step: written from here)
        before = (small_disk / "R" / "metrics.jsonl").read_bytes()
        fill(small_disk)
        # longer than what is left of the file's last page: part of it would fit
        with pytest.raises(sg_errors.RunError, match="metrics.jsonl: cannot write it .No space left on device.*"
                                                     "free space on that disk"):
            writer.metric({"samples": 1, "note": "x" * 6000})
        assert (small_disk / "R" / "metrics.jsonl").read_bytes() == before
    finally:
        writer.close()


def test_a_full_disk_at_model_pt_is_one_line_and_leaves_an_unfinished_run(small_disk, capsys):
    out = small_disk / "R"
    # mlp 256x128 on 32 features: 43k weights, 340 KB of model.pt; the rest fits
    code, _, err = cli(capsys, "train", *RUN, "--model", "mlp", "--out", out)
    assert code == 1 and len(err.strip().splitlines()) == 1 and "Traceback" not in err, err
    assert "model.pt: cannot write it (No space left on device)" in err
    assert not (out / "summary.json").exists() and not (out / "model.pt").exists()
    assert not list(out.glob(".*.tmp"))
    lines = (out / "metrics.jsonl").read_text().splitlines()
    assert lines and all(json.loads(line)["samples"] >= 0 for line in lines)


def test_a_full_disk_at_a_checkpoint_keeps_the_previous_one(small_disk, capsys):
    out = small_disk / "R"
    # about 175 KB a checkpoint: the first fits, the second (written beside it, then renamed) does not
    code, _, err = cli(capsys, "train", *RUN, "--model", "mlp", "--hidden", "160", "--checkpoint-every", "5",
                       "--out", out)
    assert code == 1 and len(err.strip().splitlines()) == 1 and "Traceback" not in err, err
    assert "checkpoint.pt: cannot write it (No space left on device)" in err and f"--resume {out}" in err
    saved = torch.load(out / "checkpoint.pt", weights_only=True)       # whole, and the first one
    assert saved["run"]["server"]["version"] == 5
    assert not list(out.glob(".*.tmp")) and not (out / "summary.json").exists()


def interrupt_model_pt(monkeypatch):
    """Ctrl-C while model.pt is written (the only torch.save of the final writes)."""
    def interrupted(obj, f, *args, **kwargs):
        raise KeyboardInterrupt
    monkeypatch.setattr(torch, "save", interrupted)


def test_ctrl_c_during_the_final_writes_leaves_an_unfinished_run(tmp_path, capsys, monkeypatch):
    interrupt_model_pt(monkeypatch)
    out = tmp_path / "R"
    code, _, err = cli(capsys, "train", *RUN, "--out", out)
    assert code == 130 and "interrupted" in err
    assert (out / "metrics.jsonl").exists() and not (out / "summary.json").exists()
    from stalegrad.run.results import is_finished
    assert not is_finished(out)


def test_a_resume_is_unfinished_until_its_summary_is_written(checkpointed, tmp_path, capsys, monkeypatch):
    out = copy_of(checkpointed, tmp_path)
    interrupt_model_pt(monkeypatch)
    code, _, err = cli(capsys, "train", "--resume", out, "--epochs", "3")
    assert code == 130
    # not the 2-epoch summary beside a 3-epoch config.json
    assert json.loads((out / "config.json").read_text())["epochs"] == 3 and not (out / "summary.json").exists()


def _refusal_imports_torch(*args):
    """Run ``stalegrad train ARGS`` in a fresh interpreter: (exit code, stderr, whether torch was imported)."""
    probe = ("import sys; from stalegrad.cli import main; code = main(sys.argv[1:]); "
             "print('torch' in sys.modules); sys.exit(code)")
    proc = subprocess.run([sys.executable, "-c", probe, "train", *map(str, args)], capture_output=True, text=True)
    return proc.returncode, proc.stderr, proc.stdout.strip() == "True"


def test_an_out_that_holds_a_run_and_a_locked_one_are_refused_before_torch(finished):
    code, err, imported = _refusal_imports_torch(*RUN, "--out", finished)
    assert code == 2 and "already holds a run" in err and not imported
    holder = RunWriter(finished, resume=True).open()
    try:
        code, err, imported = _refusal_imports_torch(*RUN, "--overwrite", "--out", finished)
        assert code == 2 and "another run (PID" in err and not imported
        code, err, imported = _refusal_imports_torch("--resume", finished)
        assert code == 2 and f"--resume {finished}: another run (PID" in err and not imported
    finally:
        holder.close()


def test_train_help_says_out_is_not_needed_with_resume(capsys):
    code, out, _ = cli(capsys, "train", "--help")
    assert code == 0
    help_of_out = " ".join(out.split("--out DIRECTORY", 1)[1].split("--resume DIRECTORY", 1)[0].split())
    assert "[required]" not in help_of_out and "unless --resume" in help_of_out


def test_a_refused_run_removes_every_directory_it_created(tmp_path):
    """--out a/new/run creates a/new too: a command refused after the directory was made (here the window
    is larger than the budget, found once the data is read) leaves neither behind (a fuzz case)."""
    from stalegrad.cli import main
    code = main(["train", "--dataset", "synthetic", "--quiet", "--algo", "agn", "--epochs", "0.05",
                 "--out", str(tmp_path / "new" / "run")])
    assert code == 2
    assert list(tmp_path.iterdir()) == []


def test_a_refused_overwrite_leaves_the_finished_runs_lock_file_as_it_was(tmp_path):
    """Issue 32's promise, "nothing on disk changes", down to the lock file: a command refused after it took
    the lock (the window is larger than the budget, found once the data is read) puts back the PID the
    finished run left there, and its modification time."""
    import os
    import time

    from stalegrad.cli import main
    out = tmp_path / "run"
    base = ["train", "--workers", "2", "--dataset", "digits", "--model", "logreg", "--quiet", "--out", str(out)]
    assert main(base + ["--epochs", "1"]) == 0
    before = {p.name: (p.read_bytes(), p.stat().st_mtime_ns) for p in out.iterdir() if p.is_file()}
    os.utime(out / ".lock", ns=(1, 10**18))   # a time this run cannot write by chance
    before[".lock"] = ((out / ".lock").read_bytes(), 10**18)
    time.sleep(0.01)
    assert main(base + ["--algo", "agn", "--epochs", "0.05", "--overwrite"]) == 2
    after = {p.name: (p.read_bytes(), p.stat().st_mtime_ns) for p in out.iterdir() if p.is_file()}
    assert after == before
