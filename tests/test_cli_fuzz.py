"""The command line under random input: never a traceback, exit 0 or 2, and a refused
command leaves no new directory. (A run that starts and then fails, e.g. a NaN under
--on-nonfinite stop, exits 1 with one line; that is allowed too.)"""
import json
import os

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from stalegrad.algorithms import ALGORITHMS
from stalegrad.cli import main

from helpers import checkpointed_run, deadline, fake_run, full_disk, snapshot

NUMBERS = ["0", "-1", "nan", "inf", "-inf", "x", "", "1e400", "99999999999999999999999"]
CHOICES = {
    "--algo": [*ALGORITHMS, "foo"],
    "--workers": ["1", "2", "3", "0", "-1", "x", "1e3", "100000", "99999999999999999999"],
    "--epochs": ["0.05", "0.1", "1e-9", *NUMBERS],
    "--batch-size": ["8", "32", "1000000", *NUMBERS],
    "--lr": ["0.01", "0.1", "1e30", *NUMBERS],
    "--lr-milestones": ["0.02", "0.02,0.04", "2,1", "0.04,0.04", "a,b", *NUMBERS],
    "--lr-gamma": ["0.5", "1e308", *NUMBERS],
    "--eval-every": ["0.05", "0.5", *NUMBERS],
    "--val-split": ["0", "100", "0.1", "1.5", "2000", "0.0001", *NUMBERS],
    "--delay": ["uniform", "gamma:2", "gamma:-1", "gamma:nan", "straggler:3", "heterogeneous:sqrt",
                "heterogeneous:x", "trace:/nonexistent.csv", "trace:", "warp", "exponential", "gamma:1e-320",
                "trace:/dev/zero", "straggler:1e300", "gamma:1e308", "gamma:9e307", "straggler:0.5"],
    "--step-time": ["1", "0.5", "1e308", *NUMBERS],
    "--runtime": ["sim", "bogus", "local"],
    "--threads-per-worker": ["1", "0", "x", "100000"],
    "--worker-timeout": ["300", *NUMBERS],
    "--ps-shards": ["1", "2", "0", "x"], "--cpus-per-worker": ["1", *NUMBERS], "--gpus-per-worker": ["0", "1", "-1"],
    "--address": ["auto", "127.0.0.1:1"],
    "--init": ["torch", "glorot-uniform", "he-normal", "x"],
    "--device": ["cpu", "tpu", "cuda:0", "cuda:x"],
    "--seed": ["0", "7", "4294967295", "4294967296", *NUMBERS],
    "--partition": ["shard", "iid", "x"],
    "--on-nonfinite": ["skip", "stop", "x"],
    "--checkpoint-every": ["0", "3", "-1", "x"],
    "--model": ["logreg", "mlp", "cnn", "resnet20", "x"],
    "--hidden": ["16", "8,8", "0", "x,y", "", "100000000000"],
    "--lam": ["0.04", *NUMBERS], "--lam0": ["2", *NUMBERS], "--eps": ["1e-7", *NUMBERS],
    "--ms-momentum": ["0.95", "1", *NUMBERS], "--momentum": ["0.9", "1.5", *NUMBERS],
    "--weight-decay": ["1e-4", *NUMBERS], "--local-weight-decay": ["1e-4", *NUMBERS],
    "--window": ["1", "3", "2.5", *NUMBERS], "--local-opt": ["adam", "sgd", "x"],
    "--local-momentum": ["0.9", "1", "1e6", *NUMBERS], "--rho": ["5", *NUMBERS],
    "--elastic-lr": ["0.01", "0.5", *NUMBERS],
    "--outer-opt": ["sgd", "nesterov", "delayed-nesterov", "x"], "--dn-delay": ["0", "2", "100000000000000000000", "-1"],
    "--dn-c": ["0", "0.1", "2", *NUMBERS],
    "--beta": ["0.9", "1.5", *NUMBERS],
}
FLAGS = ["--vectorised", "--overwrite"]
# The Python names of the options whose flag differs (checkpoint_every, not --checkpoint-every)
PYTHON_NAMES = __import__("re").compile(r"(?<![\w/.-])(" + "|".join(
    sorted({k.lstrip("-").replace("-", "_") for k in CHOICES if "-" in k.lstrip("-")})) + r")(?![\w/-])")

options = st.fixed_dictionaries({}, optional={k: st.sampled_from(v) for k, v in CHOICES.items()})
flags = st.lists(st.sampled_from(FLAGS), unique=True)


@settings(max_examples=60, deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(opts=options, extra=flags, record=st.sampled_from([None, "ok", "/proc/t.csv"]))
def test_random_options_never_give_a_traceback(tmp_path_factory, capsys, opts, extra, record):
    base = tmp_path_factory.mktemp("fuzz")
    out = base / "new" / "run"
    args = ["train", "--dataset", "synthetic", "--quiet", "--out", str(out), *extra]
    for flag, value in opts.items():
        args += [flag, value]
    if record is not None:
        args += ["--record-trace", str(base / "t.csv") if record == "ok" else record]
    if opts.get("--epochs") in ("0.05", "0.1", "1e-9") or "--epochs" not in opts:
        args += ["--epochs", opts.get("--epochs", "0.05")]     # keep valid runs short
    code = main(args)
    err = capsys.readouterr().err
    assert "Traceback" not in err, (args, err)
    lines = err.strip().splitlines()
    if code == 0:
        assert (out / "summary.json").exists(), args
    elif code == 2:
        assert len(lines) == 1 and lines[0].startswith("stalegrad: error:"), (args, err)
        assert not PYTHON_NAMES.search(lines[0]), (args, err)   # every parameter named as its flag
        assert not (base / "new").exists(), (args, err)      # nothing created for a refused command
    else:
        assert code == 1 and "NaN or Inf" in err, (args, code, err)


# ---- TOML files: --config of train and compare, and grid files (issue 17 item 5) ------------------------
# What each key's value must be, written here independently of the code under test: the oracle.
KINDS = {"workers": "int", "epochs": "number", "batch-size": "int", "lr": "number", "lr_milestones": "numbers",
         "lr-gamma": "number", "delay": "string", "step_time": "number", "vectorised": "flag", "runtime": "string",
         "seed": "int", "data-dir": "string", "hidden": "ints", "eval_every": "number", "window": "int",
         "lam0": "number", "device": "string", "init": "string", "partition": "string", "quiet": None,
         "colour": None}   # None: not a key of a config file at all
WELL_TYPED = {
    "int": lambda v: type(v) is int,
    "number": lambda v: type(v) in (int, float),
    "string": lambda v: type(v) is str,
    "flag": lambda v: type(v) is bool,
    "ints": lambda v: type(v) is list and all(type(x) is int for x in v),
    "numbers": lambda v: type(v) is list and all(type(x) in (int, float) for x in v),
    None: lambda v: False,
}
scalars = st.one_of(st.integers(-3, 10**20), st.floats(allow_nan=True, allow_infinity=True), st.booleans(),
                    st.sampled_from(["uniform", "0.1", "", "x", "cpu", "trace:/dev/zero", "256,128"]),
                    st.dates(), st.times(), st.datetimes())
values = st.one_of(scalars, st.lists(st.one_of(st.integers(0, 300), st.floats(0.01, 100), st.just("a")), max_size=3),
                   st.just({"a": 1}))


def toml_text(v) -> str:
    import datetime
    from stalegrad.study.grid import toml_value
    if isinstance(v, (datetime.date, datetime.time)):
        return v.isoformat()
    if isinstance(v, dict):
        return "{" + ", ".join(f"{k} = {toml_text(x)}" for k, x in v.items()) + "}"
    if isinstance(v, list):
        return "[" + ", ".join(toml_text(x) for x in v) + "]"
    return toml_value(v)


documents = st.dictionaries(st.sampled_from(sorted(KINDS)), values, min_size=1, max_size=4)


@settings(max_examples=40, deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(doc=documents, command=st.sampled_from(["train", "compare"]),
       layout=st.sampled_from(["flat", "train", "flat+train", "other"]))
def test_random_config_files_are_typed_strictly(tmp_path_factory, capsys, doc, command, layout):
    base = tmp_path_factory.mktemp("toml")
    lines = [f"{k} = {toml_text(v)}" for k, v in doc.items()]
    text = {"flat": "\n".join(lines), "train": "[train]\n" + "\n".join(lines),
            "flat+train": "\n".join(lines) + "\n[train]\nseed = 1", "other": "\n".join(lines) + "\n[other]\nx = 1"}
    cfg = base / "c.toml"
    cfg.write_text(text[layout] + "\n")
    out = base / "new" / "run"
    # --batch-size 0 on the command line: a file that passes every check still stops before any training
    code = main([command, "--config", str(cfg), "--batch-size", "0", "--quiet", "--out", str(out)])
    err = capsys.readouterr().err
    lines_err = err.strip().splitlines()
    assert code == 2 and len(lines_err) == 1 and lines_err[0].startswith("stalegrad: error:"), (text[layout], err)
    assert "Traceback" not in err and not (base / "new").exists(), err
    bad = [k for k, v in doc.items() if not WELL_TYPED[KINDS[k]](v)]
    if bad or layout in ("flat+train", "other"):
        assert lines_err[0].startswith(f"stalegrad: error: {cfg}: "), (text[layout], err)
        if layout in ("flat", "train"):   # the first mistake in the file is named
            assert f" {bad[0]} " in lines_err[0] or f"'{bad[0]}'" in lines_err[0], (text[layout], err)


@settings(max_examples=30, deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@example(fixed={"seed": 0}, axis="workers", axis_values=__import__("datetime").date(1970, 1, 1), report={})
@example(fixed={"epochs": __import__("datetime").time(7, 32)}, axis="seed", axis_values=[0], report={"baseline": 1})
@given(fixed=documents, axis=st.sampled_from(sorted(k for k, kind in KINDS.items() if kind)), axis_values=values,
       report=st.dictionaries(st.sampled_from(["target", "baseline", "colour"]), scalars, max_size=2))
def test_random_grid_files_are_typed_strictly(tmp_path_factory, capsys, fixed, axis, axis_values, report):
    base = tmp_path_factory.mktemp("gridtoml")
    fixed = {k: v for k, v in fixed.items() if k != axis}
    path = base / "g.toml"
    path.write_text("[fixed]\n" + "".join(f"{k} = {toml_text(v)}\n" for k, v in fixed.items())
                    + f"[axes]\n{axis} = {toml_text(axis_values)}\n[report]\n"
                    + "".join(f"{k} = {toml_text(v)}\n" for k, v in report.items()))
    code = main(["grid", str(path), "--dry-run", "--out", str(base / "new")])
    err = capsys.readouterr().err
    assert "Traceback" not in err and not (base / "new").exists(), err
    assert code in (0, 2), err
    bad_fixed = [k for k, v in fixed.items() if not WELL_TYPED[KINDS[k]](v) and not isinstance(v, list)]
    if bad_fixed:
        assert code == 2 and err.startswith(f"stalegrad: error: {path}: [fixed] "), err
    if code == 2:
        assert err.count("\n") == 1 and err.startswith("stalegrad: error: "), err


# ---- the adversarial probes' repro lines: each a test that grows with every defect found ----------------
# Issue 32 (train): each of these removed a finished run it was to --overwrite, hung, crashed mid-run or ran
# a run that meant nothing. Each must now be one line, exit 2, and leave the finished run byte for byte.
PROBE = ["--workers", "2", "--dataset", "synthetic", "--model", "logreg", "--epochs", "0.3", "--quiet"]
REPROS = [
    ["--delay", "gamma:1e308"], ["--delay", "gamma:9e307"],
    ["--delay", "trace:{dir}/negative5.txt"], ["--delay", "trace:{dir}/negative1.txt"],
    ["--algo", "agn", "--window", "2", "--local-opt", "sgd", "--local-momentum", "1e6"],
    ["--algo", "async-local-sgd", "--window", "2", "--dn-delay", "100000000000000000000"],
    ["--algo", "async-local-sgd", "--window", "2", "--outer-opt", "sgd", "--dn-c", "0.1"],
    ["--algo", "async-local-sgd", "--window", "2", "--outer-opt", "nesterov", "--dn-delay", "2"],
    ["--config", "{dir}/val_split.toml"],
]


@pytest.fixture(scope="module")
def finished_run(tmp_path_factory):
    base = tmp_path_factory.mktemp("probe")
    (base / "negative5.txt").write_text("0\n1\n-5\n0\n")
    (base / "negative1.txt").write_text("0\n1\n-1\n0\n")
    (base / "val_split.toml").write_text("val_split = -1\n")
    assert main(["train", *PROBE, "--checkpoint-every", "5", "--out", str(base / "FINISHED")]) == 0
    return base


@pytest.mark.parametrize("repro", REPROS, ids=lambda r: " ".join(r))
def test_the_probes_repro_lines_are_one_line_and_change_nothing(finished_run, capsys, repro):
    run = finished_run / "FINISHED"
    before = {p.name: p.read_bytes() for p in run.iterdir() if p.name != ".lock"}
    args = [a.replace("{dir}", str(finished_run)) for a in repro]
    code = main(["train", *PROBE, *args, "--overwrite", "--out", str(run)])
    err = capsys.readouterr().err
    assert code == 2 and len(err.strip().splitlines()) == 1 and err.startswith("stalegrad: error: "), err
    assert not PYTHON_NAMES.search(err.replace("val_split", "")), err   # flags, or a file's own key
    if "--config" in repro:   # a value the file gave: the file and its key, not a flag never typed
        assert "val_split.toml: val_split must be" in err, err
    assert {p.name: p.read_bytes() for p in run.iterdir() if p.name != ".lock"} == before


# Issue 32 item 2: a checkpoint whose metrics or progress hold anything at all resumes, or is refused in one
# line with every file as it was; never a traceback, never a run directory changed and then abandoned.
METRIC_KEYS = ["epoch", "updates", "samples", "wall_s", "virtual_s", "lr", "train_loss", "train_acc", "test_loss",
               "test_acc", "val_loss", "val_acc", "tau_mean", "nonfinite_skipped", "colour"]
PROGRESS_KEYS = ["samples", "virtual_s", "next_eval", "loss_sum", "loss_count", "wall_s", "next_checkpoint",
                 "sample_budget", "acc_sum", "acc_samples", "notes"]
anything = st.one_of(st.none(), st.booleans(), st.integers(-2, 10**13), st.floats(allow_nan=True, allow_infinity=True),
                     st.sampled_from(["", "0.9", "x"]), st.just([1]), st.just({"a": 1}))


@pytest.fixture(scope="module")
def finished_with_validation(tmp_path_factory):
    return checkpointed_run(tmp_path_factory.mktemp("checkpoint") / "R", *PROBE, "--val-split", "200")


@settings(max_examples=30, deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(part=st.sampled_from(["metric", "progress"]), metric_key=st.sampled_from(METRIC_KEYS),
       progress_key=st.sampled_from(PROGRESS_KEYS), which=st.integers(0, 1), drop=st.booleans(), value=anything)
def test_a_checkpoint_with_any_value_changed_resumes_or_is_refused_cleanly(tmp_path_factory, capsys,
                                                                          finished_with_validation, part, metric_key,
                                                                          progress_key, which, drop, value):
    import shutil

    import torch
    out = tmp_path_factory.mktemp("resume") / "R"
    shutil.copytree(finished_with_validation, out)
    state = torch.load(out / "checkpoint.pt", weights_only=True)
    progress = state["run"]["progress"]
    target, key = (progress["metrics"][-which], metric_key) if part == "metric" else (progress, progress_key)
    if drop:
        target.pop(key, None)
    else:
        target[key] = value
    torch.save(state, out / "checkpoint.pt")
    before = {p.name: p.read_bytes() for p in out.iterdir() if p.name != ".lock"}
    code = main(["train", "--resume", str(out), "--epochs", "2", "--quiet"])
    err = capsys.readouterr().err
    assert "Traceback" not in err and code in (0, 2), (part, key, drop, value, err)
    if code == 2:
        assert len(err.strip().splitlines()) == 1, err
        assert {p.name: p.read_bytes() for p in out.iterdir() if p.name != ".lock"} == before, err
    else:
        summary = __import__("json").loads((out / "summary.json").read_text())
        assert summary["epochs"] >= 2 and 0 <= summary["final_test_acc"] <= 1


# ---- issue 32, the study side: `report`, `grid` and `plot` under an unlucky user's input -----------------------
# Each repro gives one line and its exit code, within seconds, and changes nothing on disk.


def study_runs(root):
    """asgd and dcasgd-a at two rates, seeds 0-3, made with a validation split."""
    for algo in ("asgd", "dcasgd-a"):
        for lr in (0.03, 0.1):
            for s in range(4):
                fake_run(root, algo, lr, s, 0.8 + lr, 0.79 + lr)
    return root


def run_cli(capsys, *args):
    with deadline(60):
        code = main([str(a) for a in args])
    return code, capsys.readouterr().err.strip().splitlines()


def damage(d, how):
    """The run directory ``d`` with one of its files made into what no run writes."""
    if how == "metrics.jsonl a FIFO":
        (d / "metrics.jsonl").unlink()
        os.mkfifo(d / "metrics.jsonl")
    elif how == "summary.json a link to /dev/zero":
        (d / "summary.json").unlink()
        (d / "summary.json").symlink_to("/dev/zero")
    elif how == "summary.json past its limit":   # valid JSON, one byte more than the 16 MiB limit (files.JSON_LIMIT)
        head = '{"final_test_acc": 0.5, "pad": "'
        (d / "summary.json").write_text(head + "x" * (16 * 2**20 + 1 - len(head) - 2) + '"}')
    else:
        (d / "summary.json").write_text(how)


@pytest.mark.parametrize("how, words", [
    ("metrics.jsonl a FIFO", "metrics.jsonl is a FIFO (named pipe), not a regular file"),
    ("summary.json a link to /dev/zero", "summary.json is a character device, not a regular file"),
    ("summary.json past its limit", "summary.json is 16,777,217 bytes, more than the 16 MiB such a file may hold"),
    ('{"final_test_acc": 7.5, "best_test_acc": 0.9}', "summary.json: final_test_acc is 7.5, not an accuracy in [0, 1]"),
    ('{"final_test_acc": 0.5, "best_test_acc": NaN}', "summary.json: best_test_acc is nan, not an accuracy in [0, 1]"),
    ('{"final_test_acc": 0.5, "tau_mean": Infinity}', "summary.json: tau_mean is inf, not a finite number >= 0"),
])
def test_report_over_a_file_no_run_writes_is_one_line(tmp_path, capsys, how, words):
    run = fake_run(tmp_path / "runs", "asgd", 0.1, 0, 0.8)
    damage(run, how)
    before = snapshot(tmp_path)
    code, err = run_cli(capsys, "report", run, "--out", tmp_path / "out")
    assert code == 2 and len(err) == 1 and words in err[0] and str(run) in err[0], err
    assert snapshot(tmp_path) == before
    # beside good runs: left out with one warning line naming it, and out of every mean
    study_runs(tmp_path / "more")
    code, err = run_cli(capsys, "report", tmp_path / "runs", tmp_path / "more", "--out", tmp_path / "out")
    assert code == 0 and err == [f"stalegrad: warning: skipped {run}: {words}"], err
    rep = json.loads((tmp_path / "out" / "report.json").read_text())
    assert rep["compared"]["runs"] == 16 and all(g["final_test_acc"]["mean"] <= 1 for g in rep["groups"])


@pytest.mark.parametrize("args, code, words", [
    (["--compare", "foo>asgd"], 2, "compare 'foo>asgd' names 'foo', which is no algorithm"),
    (["--compare", "asgd>asgd"], 2, "compare 'asgd>asgd' compares asgd with itself"),
    (["--closure", "foo,bar"], 2, "closure names 'foo', which is no algorithm"),
    (["--closure", "asgd,asgd"], 2, "closure names asgd twice"),
    (["--tune", "foo"], 2, "tune 'foo' is no setting of the runs (the settings that vary among them: algo, lr)"),
    (["--tune", "seed"], 2, "tune 'seed': not a setting to select over"),
    (["--tune", "lr,algo"], 2, "tune 'algo': not a setting to select over"),
    (["--select-seeds", "0-100000000"], 2, "100000001 seeds, more than the 10000 a protocol may list"),
    (["--report-seeds", "0,4294967296"], 2, "seed 4294967296 is larger than any seed a run takes"),
    (["--compare", "sgd>asgd"], 0, "compare 'sgd>asgd': not evaluated: no run of sgd (the runs have asgd, dcasgd-a)"),
    (["--closure", "asgd,sgd"], 0, "closure asgd,sgd: not evaluated: no run of sgd"),
    (["--select-seeds", "5-6"], 0, "no run of selection seed(s) 5, 6 (the runs' seeds: 0, 1, 2, 3)"),
    (["--report-seeds", "3,9"], 0, "no run of reporting seed(s) 9 (the runs' seeds: 0, 1, 2, 3)"),
])
def test_a_claim_the_report_cannot_evaluate_is_refused_or_warned_in_one_line(tmp_path, capsys, args, code, words):
    study_runs(tmp_path / "runs")
    before = snapshot(tmp_path)
    got, err = run_cli(capsys, "report", tmp_path / "runs", "--out", tmp_path / "out", *args)
    assert got == code and len(err) == 1 and words in err[0], err
    if code == 2:
        assert err[0].startswith("stalegrad: error: ") and snapshot(tmp_path) == before
    else:
        assert err[0].startswith("stalegrad: warning: ")
        md = (tmp_path / "out" / "report.md").read_text()
        assert f"**Warning:** {err[0].removeprefix('stalegrad: warning: ')}." in md


PROTOCOL_GRID = """[fixed]
dataset = "synthetic"
epochs = 0.2
{fixed}
[axes]
algos = ["asgd", "dcasgd-a"]
lr = [0.05, 0.1]
seeds = [0, 1, 2]
{axes}
[protocol]
select_seeds = [0]
report_seeds = [1, 2]
{protocol}
"""


@pytest.mark.parametrize("fixed, axes, protocol, words", [
    ("val_split = 100", "", 'compare = ["foo>asgd"]', "compare 'foo>asgd' names 'foo', which is no algorithm"),
    ("val_split = 100", "", 'compare = ["asgd>asgd"]', "compares asgd with itself"),
    ("val_split = 100", "", 'compare = ["sgd>asgd"]', "compare 'sgd>asgd' names sgd, which the grid does not run "
                                                      "(its algorithms: asgd, dcasgd-a)"),
    ("val_split = 100", "", 'closure = ["foo", "bar"]', "closure names 'foo', which is no algorithm"),
    ("val_split = 100", "", 'tune = ["seed"]', "tune 'seed': not a setting to select over"),
    ("val_split = 100", "", 'tune = ["foo"]', "tune 'foo' is not an axis of the grid"),
    ("", "val_split = [0, 200]", "", "the cells of val_split = 0 in [axes] hold out no validation samples"),
])
def test_a_protocol_table_that_cannot_be_evaluated_is_refused(tmp_path, capsys, fixed, axes, protocol, words):
    path = tmp_path / "g.toml"
    path.write_text(PROTOCOL_GRID.format(fixed=fixed, axes=axes, protocol=protocol))
    code, err = run_cli(capsys, "grid", path, "--dry-run", "--out", tmp_path / "new")
    assert code == 2 and len(err) == 1 and f"{path}: [protocol]" in err[0] and words in err[0], err
    assert not (tmp_path / "new").exists()


def test_plot_to_a_file_that_is_no_image_is_one_line(tmp_path, capsys):
    run = fake_run(tmp_path / "runs", "asgd", 0.1, 0, 0.8)
    before = snapshot(tmp_path)
    code, err = run_cli(capsys, "plot", run, "--out", tmp_path / "new" / "x.txt")
    assert code == 2 and len(err) == 1, err
    assert ".txt is not an image format matplotlib writes; use .png, .pdf or .svg (or .eps" in err[0]
    assert snapshot(tmp_path) == before


@pytest.mark.parametrize("command", ["report", "plot"])
def test_report_and_plot_on_a_full_disk_are_one_line_and_write_nothing(tmp_path, capsys, command):
    study_runs(tmp_path / "runs")
    with full_disk(tmp_path / "disk") as disk:
        before = snapshot(disk)
        out = disk / "new" / ("report" if command == "report" else "curves.png")
        code, err = run_cli(capsys, command, tmp_path / "runs" if command == "report" else
                            next((tmp_path / "runs").iterdir()), "--out", out)
        assert code == 1 and len(err) == 1 and "No space left on device" in err[0] and str(out) in err[0], err
        assert "nothing" in err[0] and snapshot(disk) == before


@pytest.mark.parametrize("free_pages, file", [(0, ".grid.lock"), (1, "grid.json")])
def test_a_grid_on_a_full_disk_is_one_line(tmp_path, capsys, free_pages, file):
    path = tmp_path / "g.toml"
    path.write_text('[fixed]\ndataset = "synthetic"\nepochs = 0.2\n[axes]\nseeds = [0, 1]\n')
    with full_disk(tmp_path / "disk", free_pages) as disk:
        before = snapshot(disk)
        code, err = run_cli(capsys, "grid", path, "--out", disk / "G", "--no-report")
        *progress, last = err      # (the grid's own line, "grid: 2 cells, ...", once it has its lock)
        assert code == 1 and all(line.startswith("grid: ") for line in progress), err
        assert last.startswith("stalegrad: error: ") and file in last and "No space left on device" in last, err
        if free_pages == 0:    # not even the lock: nothing is left of the command
            assert snapshot(disk) == before
        else:                  # the lock, and no grid.json, whole or in part
            assert sorted(p.name for p in (disk / "G").iterdir() if p.is_file()) == [".grid.lock"]
            assert not list((disk / "G" / "runs").iterdir())
