"""``stalegrad grid``: expansion, names, validation, runs in subprocesses, resume, failures, Ctrl-C."""
import contextlib
import importlib
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import click
import pytest

import stalegrad.cli
from stalegrad.study import grid as G

from helpers import deadline as fails_after

# The module, not the command: once `grid` is registered, stalegrad.cli.grid is the click command.
cli_grid = importlib.import_module("stalegrad.cli.grid")

ROOT = Path(__file__).resolve().parent.parent
EXPERIMENTS = sorted((ROOT / "experiments").glob("*.toml"))
TINY = '[fixed]\ndataset = "synthetic"\nmodel = "logreg"\nepochs = 0.2\nbatch_size = 32\n'


@pytest.fixture
def run(monkeypatch, capsys):
    """``stalegrad grid ...`` through the real entry point (one-line errors, exit codes), with the
    command in a test-local group until the lead registers it."""
    group = click.Group("stalegrad", commands={"grid": cli_grid.grid})
    monkeypatch.setattr(stalegrad.cli, "cli", group)

    def call(*args):
        code = stalegrad.cli.main(["grid", *map(str, args)])
        out, err = capsys.readouterr()
        return code, out, err
    return call


def write(tmp_path, text, name="g.toml"):
    path = tmp_path / name
    path.write_text(text)
    return path


def records(out):
    return {r["name"]: r for r in json.loads((out / "grid.json").read_text())["cells"]}


# ---- expansion and names ----------------------------------------------------------------
def test_expansion_rules(tmp_path, run):
    path = write(tmp_path, TINY + '[axes]\nalgos = ["sgd", "asgd", "agn", "dcasgd-a"]\nworkers = [2, 4]\n'
                                  'window = [2, 5]\nlam0 = [1.0, 2.0]\nseeds = [0, 1]\n')
    cells = {c.name: c for c in G.load_grid(path).cells}
    per_algo = {a: sum(c.algo == a for c in cells.values()) for a in ("sgd", "asgd", "agn", "dcasgd-a")}
    # sgd: one worker, once per seed; asgd: no window, no lam0; agn: window; dcasgd-a: lam0.
    assert per_algo == {"sgd": 2, "asgd": 4, "agn": 8, "dcasgd-a": 8}
    assert cells["sgd-M1-s0"].options == {"algo": "sgd", "dataset": "synthetic", "model": "logreg", "epochs": 0.2,
                                          "batch_size": 32, "workers": 1, "seed": 0}
    assert "window" not in cells["asgd-M4-s1"].options and "lam0" not in cells["asgd-M4-s1"].options
    assert cells["agn-M4-W5-s1"].options["window"] == 5 and "lam0" not in cells["agn-M4-W5-s1"].options
    assert cells["dcasgd-a-M2-lam0_1-s0"].options["lam0"] == 1.0
    assert list(cells)[:3] == ["sgd-M1-s0", "sgd-M1-s1", "asgd-M2-s0"]     # the product's order
    code, out, err = run(path, "--dry-run")
    assert code == 0, err
    assert "22 cells (sgd 2, asgd 4, agn 8, dcasgd-a 8), every one valid" in out
    assert "agn-M2-W2-s0" in out and "nothing was run" in out


def test_fixed_parameters_apply_to_their_algorithms_only(tmp_path):
    path = write(tmp_path, TINY + 'window = 3\nlam = 0.5\nworkers = 3\n'
                                  '[axes]\nalgo = ["sgd", "dcasgd-c", "downpour"]\n')
    cells = {c.algo: c for c in G.load_grid(path).cells}
    assert [c.name for c in cells.values()] == ["sgd", "dcasgd-c", "downpour"]
    assert cells["sgd"].options["workers"] == 1 and "window" not in cells["sgd"].options
    assert cells["dcasgd-c"].options["lam"] == 0.5 and "window" not in cells["dcasgd-c"].options
    assert cells["downpour"].options["window"] == 3 and cells["downpour"].params["workers"] == 3


def test_names_are_readable_stable_and_safe():
    assert G.cell_name("asgd", {"algo": "asgd", "seed": 0, "delay": "gamma:2", "lr": 0.1, "workers": 8}) == \
        "asgd-M8-lr0.1-gamma2-s0"
    assert G.cell_name("agn", {"window": 10, "local_opt": "sgd", "workers": 4}) == "agn-M4-W10-local_opt_sgd"
    assert G.cell_name("dcasgd-a", {"lam0": 2.0, "hidden": [256, 128], "delay": "heterogeneous:sqrt"}) == \
        "dcasgd-a-lam0_2-hidden_256x128-heterogeneous_sqrt"
    name = G.cell_name("asgd", {"delay": "trace:../runs/a b.csv", "lr": 1e-07})
    assert name == "asgd-lr1e-07-trace_.._runs_a_b.csv" and "/" not in name
    long = G.cell_name("asgd", {"delay": "trace:" + "x" * 300})
    assert len(long) <= 150 and long != G.cell_name("asgd", {"delay": "trace:" + "x" * 299})


def test_dry_run_lists_what_a_run_would_do(tmp_path, run):
    path = write(tmp_path, TINY + '[axes]\nalgos = ["asgd"]\nseeds = [0, 1]\n')
    (tmp_path / "out" / "runs" / "asgd-s1").mkdir(parents=True)          # an interrupted run
    code, out, err = run(path, "--out", tmp_path / "out", "--dry-run")
    assert code == 0, err
    assert "asgd-s0  to run" in out and "asgd-s1  to run again" in out
    assert sorted(os.listdir(tmp_path / "out")) == ["runs"]                  # nothing written


@pytest.mark.parametrize("path", EXPERIMENTS, ids=[p.stem for p in EXPERIMENTS])
def test_every_experiment_file_validates(path, run):
    """--dry-run reads no data (MNIST and CIFAR-10 need not be here) and accepts a CUDA device that
    this machine lacks; everything else is checked as `train` checks it."""
    code, out, err = run(path, "--dry-run")
    assert code == 0, err
    expected = {"dcasgd_cifar10": 27, "agn_mnist": 196, "dcasgd_fashion": 234, "agn_fashion": 72,
                "probes_dc_digits": 3, "probes_dc_fashion": 3, "probes_agn_fashion": 12, "probes_agn_fashion_asgd": 2,
                # issue 18: (sgd 1 + ssgd 3 + asgd 3 + dcasgd-c 3 x 6 lam + dcasgd-a 3 x 3 lam0) x 5 lr x 4 delays
                # x 10 seeds; (1 + 2 + 2 + 2 x 6 + 2 x 3) x 4 lr x 10; (1 + 1 + 3 + 3) x 4 lr x 10;
                # 10 seeds x 2 data sets x 4 algos x 3 n x 3 windows x 3 lr x 2 delays; 10 x 2 x 2 x 3 x 2 x 3 x 2;
                # 10 x 2 algos x 2 n x 2 windows x 2 delays
                "dcasgd_decisive": 6800, "dcasgd_decisive_momentum": 920, "dcasgd_decisive_cnn": 320,
                "agn_decisive": 4320, "agn_decisive_downpour5": 1440, "agn_decisive_agnmlp": 160,
                "delays_gradient": 72, "delays_commit": 96,
                # the cut grids: 7 seeds x 5 lr x (sgd 1 + 3 M x (ssgd + asgd + dcasgd-c x 2 lam + dcasgd-a));
                # 7 seeds x 5 lr x 4 algos x 2 n x 2 windows
                "dcasgd_decisive_cut": 560, "agn_decisive_cut": 560,
                # issue 20's leaderboard: 8 seeds x algos x 4 M x lr x 2 delays (sgd: its 1 worker instead of
                # the 4 M); 8 seeds x algos x 3 n x 2 windows x lr (the Fashion-MNIST twins: the same, outer and
                # downpour with one rate more or the same)
                "leaderboard_grad_asgd": 8 * 4 * 4 * 5 * 2, "leaderboard_grad_sgd": 8 * (1 + 4) * 4 * 2,
                "leaderboard_grad_dana": 8 * 2 * 4 * 5 * 2, "leaderboard_grad_gap": 8 * 4 * 4 * 2,
                "leaderboard_grad_sasgd": 8 * 4 * 4 * 2, "leaderboard_grad_momentum": 8 * 4 * 5 * 2,
                "leaderboard_commit_agn": 8 * 2 * 3 * 2 * 4, "leaderboard_commit_agn_fashion": 8 * 2 * 3 * 2 * 4,
                "leaderboard_commit_outer": 8 * 3 * 3 * 2 * 4, "leaderboard_commit_outer_fashion": 8 * 3 * 3 * 2 * 5,
                "leaderboard_commit_downpour": 8 * 3 * 2 * 8, "leaderboard_commit_downpour_fashion": 8 * 3 * 2 * 8,
                # issue 41's rules that drop stale gradients: 8 seeds x algos x 4 M x lr x 2 delays
                "leaderboard_time_rules": 8 * 2 * 4 * 4 * 2, "leaderboard_time_rules_ringmaster": 8 * 1 * 4 * 5 * 2,
                # issue 18's second pass: 8 seeds x 3 algos x 2 M x 4 lr x 2 delays; 8 x 3 x 2 x 4
                "dcasgd_decisive_delays": 8 * 3 * 2 * 4 * 2, "dcasgd_decisive_momentum_cut": 8 * 3 * 2 * 4,
                # issue 18's third pass: 8 seeds x algos x n x windows x lr; the agn-mlp cut: 3 seeds x 2 algos;
                # 3 selection seeds: 10 seeds x 3 algos x 3 n x 2 windows x 4 lr
                "agn_decisive_roundrobin": 8 * 3 * 2 * 2 * 4, "agn_decisive_roundrobin_downpour": 8 * 2 * 2 * 2 * 7,
                "agn_decisive_roundrobin_fashion": 8 * 3 * 2 * 2 * 5,
                "agn_thesis_cells": 8 * 2 * 4 * 4 * 4, "agn_thesis_cells_odd": 8 * 2 * 3 * 3 * 4,
                "agn_thesis_cells_odd_n": 8 * 2 * 3 * 4 * 4, "agn_thesis_cells_odd_window": 8 * 2 * 4 * 3 * 4,
                "agn_decisive_agnmlp_cut": 3 * 2,
                "agn_selection3": 10 * 3 * 3 * 2 * 4,
                # the 49 thesis cells on 3 selection seeds: 10 seeds x 2 algos x 7 n x 7 windows x 4 lr
                "agn_thesis_selection3": 10 * 2 * 7 * 7 * 4,
                # issue 18's fourth pass: 10 seeds x 3 M x 4 lr x (asgd + 5 lam + 4 lam0)
                "dcasgd_decisive_lambda": 10 * 3 * 4 * (1 + 5 + 4),
                # DC-ASGD-c's lambda past 64: 10 seeds x 2 M x 5 lr x (asgd + 4 lam); its confirmation: 7 seeds x 2
                "dcasgd_decisive_lambda_past64": 10 * 2 * 5 * (1 + 4), "dcasgd_decisive_lambda256_confirm": 7 * 2,
                # the 24-epoch regime and the cnn cell: seeds x algos x lr
                "dcasgd_decisive_long": 10 * 3 * 3,
                "dcasgd_decisive_long16": 10 * 4 * (1 + 2 + 1), "dcasgd_decisive_cnn_cut": 10 * 2 * 4,
                # lambda0 8 carried to M = 32, round-robin and momentum: seeds x 2 algos x M x lr (x 2 delays)
                "dcasgd_decisive_lambda0_stress": 10 * 2 * 3 * 5 * 2, "dcasgd_decisive_lambda0_momentum": 10 * 2 * 2 * 4,
                # the lambda0 sweep at M = 32: 10 seeds x 5 lr x (asgd + 4 lam0)
                "dcasgd_decisive_lambda32": 10 * 5 * (1 + 4),
                # the lambda0 sweep under round-robin and with momentum: 10 seeds x 2 M x lr x (asgd + 5 lam0)
                "dcasgd_decisive_lambda0_roundrobin": 10 * 2 * 5 * (1 + 5),
                "dcasgd_decisive_lambda0_sweep_momentum": 10 * 2 * 5 * (1 + 5),
                # DOWNPOUR and AGN at 5 epochs: 8 seeds x n x windows x lr
                "agn_decisive_downpour5_cut": 8 * 3 * 2 * 9,
                # AGN RQ4 over seeds: 5 seeds x 2 n x 3 windows
                "probes_agn_seeds": 5 * 2 * 3, "agn_decisive_agn5_cut": 8 * 3 * 2 * 4,
                # issue 18's modelled temporal efficiency: 5 seeds x 2 algos x 2 windows x 2 lr
                "te_modelled_demo": 5 * 2 * 2 * 2}
    assert f": {expected[path.stem]} cells (" in out and "every one valid" in out


# ---- bad files ------------------------------------------------------------------------
BAD = [
    ("foo = 1\n", "[fixed] unknown key 'foo'"),
    ("[axes]\nworkers = 4\n", "[axes] workers must be a list"),
    ("[axes]\nworkers = []\n", "workers is empty"),
    ("[axes]\nworkers = [4, 0]\n", "cell asgd-M0: workers must be a positive integer, got 0"),
    ('lr = "fast"\n', "[fixed] lr must be a number, not 'fast'"),
    ("seed = 1970-01-01\n", "[fixed] seed must be an integer, not 1970-01-01"),
    ("data_dir = 5\n", "[fixed] data_dir must be a string"),
    ('[axes]\nworkers = [4, "8"]\n', "[axes] workers must be an integer, not '8'"),
    ('[axes]\nhidden = ["8,8"]\n', "each value is a list"),
    ("[fixed.x]\ny = 1\n", "[fixed] unknown key 'x'"),
    ("[report]\nbaseline = 3\n", "[report] baseline must be an algorithm's name"),
    ("seed = [0, 1]\n", "seed is a list: put it in [axes]"),
    ('[axes]\nalgos = ["asgd"]\nlam = [0.1]\n', "lam is a parameter of dcasgd-c, dana-dc, and none of the grid's algorithms"),
    ('[axes]\nalgos = ["sgd", "quantum"]\n', "unknown algorithm 'quantum'"),
    ('out = "x"\n', "[fixed] out: not an option of a grid"),
    ('[axes]\nalgos = ["sgd"]\nseeds = [0]\n[report]\nbaseline = "agn"\n', "baseline 'agn' is not one of"),
    ("[report]\ntarget = 85\n", "target must be a test accuracy in (0, 1]"),
    ("[report]\ncolour = 1\n", "[report] unknown key 'colour'"),
    ("[axes]\nlr = [0.1, 0.1]\n", "lr lists 0.1 twice"),
    ("[axes]\nhidden = [256, 128]\n", "each value is a list, e.g. hidden = [[256, 128], [512]]"),
    ("[bogus]\n", "unknown table or key 'bogus'"),
    ("[axes\n", "not valid TOML"),
    ('[axes]\ndelay = ["round-robin", "gamma:-1"]\n', "cell asgd-gamma_-1: delay 'gamma:-1'"),
    ('[axes]\nalgos = ["easgd"]\nworkers = [1, 2]\nbeta = [2.0]\n',
     "cell easgd-M1-beta_2: easgd: beta must be in (0, 1]"),
    ("batch_size = 5000\n", "larger than each worker's"),           # found by the data check
]


@pytest.mark.parametrize("extra,message", BAD, ids=[m[:30] for _, m in BAD])
def test_a_bad_file_is_one_line_and_nothing_is_created(tmp_path, run, extra, message):
    text = TINY.replace("batch_size = 32\n", "") if extra.startswith("batch_size") else TINY
    path = write(tmp_path, text + extra)
    code, out, err = run(path, "--out", tmp_path / "out")
    assert code == 2
    assert err.startswith("stalegrad: error: ") and err.count("\n") == 1 and message in err, err
    assert not (tmp_path / "out").exists()


def test_a_missing_data_set_is_refused_before_anything_runs(tmp_path, run):
    path = write(tmp_path, '[fixed]\ndataset = "mnist"\ndata_dir = "%s"\n[axes]\nseeds = [0]\n' % (tmp_path / "none"))
    code, _, err = run(path, "--out", tmp_path / "out")
    assert code == 2 and err.count("\n") == 1 and "mnist" in err
    assert not (tmp_path / "out").exists()
    assert run(path, "--dry-run")[0] == 0          # a dry run reads no data


@pytest.mark.parametrize("entry", ["cells", "runs", "logs", "report", "grid.json"])
def test_an_entry_of_the_wrong_kind_in_out_is_refused_before_anything_is_created(tmp_path, run, entry):
    path = write(tmp_path, TINY + '[axes]\nalgos = ["asgd"]\nseeds = [0]\n')
    out = tmp_path / "out"
    out.mkdir()
    if entry == "grid.json":
        (out / entry).mkdir()
    else:
        (out / entry).write_text("mine\n")
    code, _, err = run(path, "--out", out)
    assert code == 2 and err.count("\n") == 1, err
    assert err.startswith("stalegrad: error: ") and f"{out / entry} is not a" in err, err
    assert sorted(p.name for p in out.iterdir()) == [entry]      # nothing created
    if entry != "grid.json":
        assert (out / entry).read_text() == "mine\n"


def test_the_report_says_the_target_and_baseline_came_from_the_file(tmp_path, run):
    path = write(tmp_path, TINY + '[axes]\nalgos = ["sgd", "asgd"]\nworkers = [2]\nseeds = [0]\n'
                                  '[report]\ntarget = 0.3\nbaseline = "asgd"\n')
    code, _, err = run(path, "--out", tmp_path / "out")
    assert code == 0, err
    md = (tmp_path / "out" / "report" / "report.md").read_text()
    assert f"Target: test accuracy 0.3000, given in the [report] table of {path}." in md
    assert f"Baseline: asgd (given in the [report] table of {path})." in md
    assert "--target" not in md and "--baseline" not in md


# ---- runs, resume -----------------------------------------------------------------------
def test_runs_resume_and_new_cells(tmp_path, run):
    out = tmp_path / "out"
    path = write(tmp_path, TINY + '[axes]\nalgos = ["sgd", "asgd"]\nworkers = [2]\nseeds = [0]\n')
    code, stdout, err = run(path, "--out", out, "--jobs", 2)
    assert code == 0, err
    recs = records(out)
    assert {n: r["status"] for n, r in recs.items()} == {"sgd-M1-s0": "done", "asgd-M2-s0": "done"}
    assert all(r["exit_code"] == 0 and r["run_s"] > 0 and 0 <= r["final_test_acc"] <= 1 for r in recs.values())
    summary = json.loads((out / "runs" / "asgd-M2-s0" / "summary.json").read_text())
    assert summary["workers"] == 2 and summary["algorithm"] == "asgd"
    assert (out / "cells" / "sgd-M1-s0.toml").read_text().startswith('algo = "sgd"\n')
    assert "grid: 2/2 done, 0 failed, 0 left" in err and "2 at once with" in err
    assert "grid: 2 cells: 2 run, 0 skipped (already done), none failed" in stdout
    try:
        import stalegrad.study.report  # noqa: F401
        assert (out / "report" / "report.md").is_file()
    except ImportError:
        assert "grid: no report" in err

    # A second invocation runs nothing.
    mtimes = {p: p.stat().st_mtime_ns for p in out.glob("runs/*/summary.json")}
    code, stdout, err = run(path, "--out", out, "--jobs", 1, "--no-report")
    assert code == 0, err
    assert {r["status"] for r in records(out).values()} == {"skipped"}
    assert {p: p.stat().st_mtime_ns for p in out.glob("runs/*/summary.json")} == mtimes
    assert "0 run, 2 skipped" in stdout

    # A new seed runs only the new cells; an interrupted run (no summary.json) is run again.
    for name in ("summary.json", "model.pt", "staleness.json"):
        (out / "runs" / "sgd-M1-s0" / name).unlink()
    write(tmp_path, TINY + '[axes]\nalgos = ["sgd", "asgd"]\nworkers = [2]\nseeds = [0, 1]\n')
    code, stdout, err = run(path, "--out", out, "--jobs", 2, "--no-report")
    assert code == 0, err
    status = {n: r["status"] for n, r in records(out).items()}
    assert status == {"sgd-M1-s0": "done", "asgd-M2-s0": "skipped", "sgd-M1-s1": "done", "asgd-M2-s1": "done"}
    assert (out / "runs" / "sgd-M1-s0" / "summary.json").is_file()
    assert (out / "runs" / "asgd-M2-s0" / "summary.json").stat().st_mtime_ns == mtimes[
        out / "runs" / "asgd-M2-s0" / "summary.json"]
    assert "3 run, 1 skipped" in stdout


def test_a_run_without_its_last_file_is_not_done(tmp_path, run, monkeypatch):
    """A run interrupted in its final writes is run again: by this version (which writes summary.json
    last, so there is none) and by earlier ones (summary.json, but no model.pt)."""
    out = tmp_path / "out"
    path = write(tmp_path, TINY + '[axes]\nalgos = ["asgd"]\nseeds = [0, 1]\n')
    assert run(path, "--out", out, "--jobs", 1, "--no-report")[0] == 0
    (out / "runs" / "asgd-s0" / "model.pt").unlink()            # as an earlier version left it
    code, listing, _ = run(path, "--out", out, "--dry-run")
    assert code == 0 and "asgd-s0  to run again" in listing and "asgd-s1  done: skipped" in listing

    import torch

    def interrupted(obj, f, *args, **kwargs):    # Ctrl-C while this version writes model.pt
        raise KeyboardInterrupt
    with monkeypatch.context() as mp:
        mp.setattr(torch, "save", interrupted)
        train = importlib.import_module("stalegrad.cli.run").train
        with pytest.raises(click.exceptions.Abort):      # (click's KeyboardInterrupt)
            train.main(["--config", str(out / "cells" / "asgd-s0.toml"), "--quiet", "--overwrite",
                        "--out", str(out / "runs" / "asgd-s0")], standalone_mode=False)
    assert (out / "runs" / "asgd-s0" / "metrics.jsonl").is_file()
    code, listing, _ = run(path, "--out", out, "--dry-run")
    assert code == 0 and "asgd-s0  to run again" in listing
    code, stdout, err = run(path, "--out", out, "--jobs", 1, "--no-report")
    assert code == 0 and "1 run, 1 skipped" in stdout, err
    assert (out / "runs" / "asgd-s0" / "model.pt").is_file()


@pytest.mark.parametrize("summary, why", [
    ('{"final_test_acc": 0.5', "its summary.json is corrupt (Expecting ',' delimiter at line 1)"),
    ('{"final_test_acc": 7.5, "best_test_acc": 0.9}', "its summary.json: final_test_acc is 7.5, not an accuracy"),
    ("fifo", "its summary.json is a FIFO (named pipe), not a regular file"),
])
def test_a_cell_with_a_damaged_summary_is_not_done_and_runs_again(tmp_path, run, summary, why):
    """Issue 32: a corrupt summary.json (or one no run writes) would have counted as done forever."""
    path = write(tmp_path, TINY + '[axes]\nalgos = ["asgd"]\nseeds = [0]\n')
    out = tmp_path / "out"
    finished = out / "runs" / "asgd-s0"
    finished.mkdir(parents=True)
    (finished / "model.pt").write_bytes(b"weights")
    if summary == "fifo":
        os.mkfifo(finished / "summary.json")
    else:
        (finished / "summary.json").write_text(summary)
    code, listing, err = run(path, "--out", out, "--dry-run")
    assert code == 0 and "asgd-s0  to run again" in listing, listing
    (line,) = err.strip().splitlines()
    assert line.startswith(f"grid: note: cell asgd-s0 is not done: {why}") and line.endswith("; it runs again"), err
    if summary == "fifo":     # the rerun, once: the run replaces the damaged directory, and the cell is done
        code, stdout, err = run(path, "--out", out, "--jobs", 1, "--no-report")
        assert code == 0 and "1 run, 0 skipped" in stdout and err.startswith(f"grid: note: cell asgd-s0"), err
        assert 0 <= json.loads((finished / "summary.json").read_text())["final_test_acc"] <= 1
        assert records(out)["asgd-s0"]["status"] == "done"


def test_a_disk_that_fills_before_grid_json_is_rewritten_stops_the_grid_in_one_line(tmp_path, run, monkeypatch):
    """Issue 32: grid.json is rewritten after every cell; a full disk then (simulated: the write raises ENOSPC)
    stops the grid with one line, exit code 1, grid.json as it was, and the same command continues it."""
    import errno
    path = write(tmp_path, TINY + '[axes]\nalgos = ["asgd"]\nseeds = [0, 1]\n')
    out, writes = tmp_path / "out", []
    real = G.write_json

    def fills_after_the_first(file, obj):
        writes.append(file)
        if len(writes) > 1:
            raise OSError(errno.ENOSPC, "No space left on device")
        real(file, obj)
    monkeypatch.setattr(G, "write_json", fills_after_the_first)
    code, _, err = run(path, "--out", out, "--jobs", 1, "--no-report")
    *progress, last = err.strip().splitlines()
    assert code == 1 and all(line.startswith("grid: ") for line in progress), err
    assert last == (f"stalegrad: error: {out / 'grid.json'}: cannot write it (No space left on device); the grid "
                    "stopped (its running cells with it), and the file is as it was; free space there, then run the "
                    "same command again to continue"), err
    assert {r["status"] for r in records(out).values()} == {"pending"}      # the one written before the disk filled
    assert not [p for p in out.iterdir() if p.name.startswith(".grid.json")]   # no temporary file left
    monkeypatch.setattr(G, "write_json", real)
    code, stdout, err = run(path, "--out", out, "--jobs", 1, "--no-report")
    assert code == 0 and "1 run, 1 skipped" in stdout, err


def test_a_changed_fixed_value_is_refused_unless_rerun_changed(tmp_path, run):
    out = tmp_path / "out"
    path = write(tmp_path, TINY + '[axes]\nalgos = ["asgd"]\nseeds = [0]\n')
    assert run(path, "--out", out, "--jobs", 1, "--no-report")[0] == 0
    write(tmp_path, TINY.replace("epochs = 0.2", "epochs = 0.3") + '[axes]\nalgos = ["asgd"]\nseeds = [0]\n')
    code, _, err = run(path, "--out", out)
    assert code == 2 and err.count("\n") == 1
    assert "cell asgd-s0 already ran" in err and "epochs = 0.2 -> 0.3" in err and "--rerun-changed" in err
    code, out_, err = run(path, "--out", out, "--dry-run", "--rerun-changed")
    assert code == 0 and "asgd-s0  to run again" in out_


def test_a_failed_run_is_recorded_and_the_grid_goes_on(tmp_path, run, monkeypatch):
    monkeypatch.setitem(sys.modules, "stalegrad.study.report", None)      # as if the report module were absent
    out = tmp_path / "out"
    path = write(tmp_path, TINY + 'on_nonfinite = "stop"\n[axes]\nalgos = ["asgd"]\nlr = [1e38, 0.1]\n')
    code, stdout, err = run(path, "--out", out, "--jobs", 1)
    assert code == 0, err
    recs = records(out)
    bad, good = recs["asgd-lr1e+38"], recs["asgd-lr0.1"]
    assert bad["status"] == "failed" and bad["exit_code"] == 1 and "NaN or Inf" in bad["reason"]
    assert good["status"] == "done" and good["exit_code"] == 0
    assert "grid: asgd-lr1e+38 failed (exit code 1): stalegrad: error: message from worker" in err
    assert "grid: 1/2 done, 1 failed, 0 left" in err
    assert "grid: no report: this stalegrad has no report module" in err
    assert "2 run, 0 skipped (already done), 1 failed" in stdout
    # The failed cell is run again by the next invocation; the done one is not.
    code, listing, _ = run(path, "--out", out, "--dry-run")
    assert "asgd-lr1e+38  to run again" in listing and "asgd-lr0.1    done: skipped" in listing


def test_jobs_threads_and_the_child_command(tmp_path, run, monkeypatch):
    """--jobs N gives each child cores // N threads; an existing run directory is rerun with --overwrite."""
    started = []

    class FakeChild:
        def __init__(self, cmd, **kw):
            started.append((cmd, kw["env"]))
            self.pid, self.returncode = 0, 0

        def poll(self):
            return 0

    monkeypatch.setattr(G.subprocess, "Popen", FakeChild)
    monkeypatch.setattr(cli_grid, "machine_cores", lambda: 4)
    out = tmp_path / "out"
    (out / "runs" / "asgd-s1").mkdir(parents=True)
    path = write(tmp_path, TINY + '[axes]\nalgos = ["asgd"]\nseeds = [0, 1]\n')
    code, _, err = run(path, "--out", out, "--jobs", 2, "--no-report", "--tensorboard", tmp_path / "tb")
    assert code == 0, err
    (cmd0, env0), (cmd1, _) = started
    assert cmd0[:4] == [sys.executable, "-c", G.CHILD, "train"] and "--quiet" in cmd0
    assert cmd1[-2:] == ["--tensorboard", str(tmp_path / "tb" / "asgd-s1")]
    assert "--overwrite" not in cmd0 and "--overwrite" in cmd1
    assert env0["OMP_NUM_THREADS"] == env0["MKL_NUM_THREADS"] == "2"
    assert records(out)["asgd-s0"]["reason"] == "exited 0 but wrote no summary.json"


def test_default_jobs():
    def cell(**p):
        return G.Cell("c", "asgd", {}, {}, params={"runtime": "sim", "device": "cpu", **p})
    assert cli_grid.default_jobs([cell(), cell(device="cuda")], 16) == 1
    assert cli_grid.default_jobs([cell(runtime="local")], 16) == 1
    assert 1 <= cli_grid.default_jobs([cell()], 4) <= 4
    assert cli_grid.default_jobs([cell()], 1) == 1


def _ignore_sigint():
    signal.signal(signal.SIGINT, signal.SIG_IGN)


def test_a_child_that_ended_before_the_ctrl_c_is_recorded_done_not_interrupted(tmp_path):
    grid = G.load_grid(write(tmp_path, TINY + '[axes]\nalgos = ["asgd"]\nseeds = [0, 1]\n'))
    done, busy = grid.cells
    run = G.GridRun(grid, tmp_path / "out", {c.name: "run" for c in grid.cells}, jobs=2, threads=1)
    finished = tmp_path / "out" / "runs" / done.name
    finished.mkdir(parents=True)
    (finished / "summary.json").write_text(json.dumps({"final_test_acc": 0.5}))
    (finished / "model.pt").write_bytes(b"weights")
    ended = subprocess.Popen([sys.executable, "-c", "pass"], start_new_session=True)
    ended.wait()       # exited 0 with its run written, between the grid's last poll and the signal
    sleeping = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"], start_new_session=True)
    for cell in grid.cells:
        run.records[cell.name]["status"] = "running"
    run._stop({ended: (done, time.monotonic()), sleeping: (busy, time.monotonic())})
    assert run.records[done.name]["status"] == "done" and run.records[done.name]["final_test_acc"] == 0.5
    assert run.records[busy.name]["status"] == "interrupted" and run.records[busy.name]["exit_code"] == -signal.SIGINT


@pytest.mark.parametrize("how", ["ctrl-c", "sigterm-in-background"])
def test_ctrl_c_stops_the_children_and_the_grid_continues_later(tmp_path, how, run):
    """Ctrl-C; or SIGTERM to a grid started in the background (nohup, `&`), which ignores SIGINT: its
    children must not inherit that, or the grid's SIGINT would not reach them (they were killed)."""
    out = tmp_path / "out"
    # 20 epochs: about 1 s of training here, far longer than the signal takes once the run has begun
    longer = TINY.replace("epochs = 0.2", "epochs = 20")
    path = write(tmp_path, longer + '[axes]\nalgos = ["asgd"]\nseeds = [0, 1, 2]\n')
    code = ("import sys, stalegrad.cli as c; from stalegrad.cli.grid import grid; c.cli.add_command(grid); "
            "sys.exit(c.main(sys.argv[1:]))")
    cmd = [sys.executable, "-c", code, "grid", str(path), "--out", str(out), "--jobs", "1", "--no-report"]
    background = how == "sigterm-in-background"
    proc = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            preexec_fn=_ignore_sigint if background else None)
    # the signal comes once the first run is done and the next one trains: its first metrics line (the
    # evaluation before its first update) is written (seconds, but minutes on a loaded machine)
    training = out / "runs" / "asgd-s1" / "metrics.jsonl"
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline and proc.poll() is None:
        with contextlib.suppress(OSError):
            if training.read_text().strip():
                break
        time.sleep(0.02)
    else:
        proc.kill()
        pytest.fail(f"the second run of the grid did not start training in 300 s: {proc.communicate()}")
    proc.send_signal(signal.SIGTERM if background else signal.SIGINT)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 130, err
    assert "grid: interrupted:" in err and "stalegrad: interrupted" in err
    stopped = [r for r in records(out).values() if r["status"] == "interrupted"]
    # interrupted while training: 130 (it cleaned up), not -9 (killed after 30 s)
    assert len(stopped) == 1 and stopped[0]["exit_code"] == 130
    status = [r["status"] for r in records(out).values()]
    assert status[0] == "done" and "interrupted" in status and "done" not in status[2:]
    assert (out / "runs" / "asgd-s0" / "summary.json").is_file()
    # Nothing is left running, and the same command finishes the grid (run here: one interpreter fewer to start)
    with fails_after(300):
        code, _, err = run(*cmd[4:])
    assert code == 0, err
    assert [r["status"] for r in records(out).values()][0] == "skipped"
    assert all(r["status"] in ("done", "skipped") for r in records(out).values())


def test_the_rules_after_2017_expand_and_validate(tmp_path, run):
    path = write(tmp_path, TINY + 'window = 2\n[axes]\nalgos = ["sasgd", "gap-aware", "dana-zero", "dana-dc", '
                                  '"diloco", "async-local-sgd", "agn"]\nworkers = [2, 4]\n'
                                  'outer_opt = ["sgd", "nesterov"]\nlam = [1.0, 2.0]\n')
    cells = {c.name: c for c in G.load_grid(path).cells}
    per_algo = {a: sum(c.algo == a for c in cells.values()) for a in ("sasgd", "dana-dc", "diloco", "agn")}
    # outer_opt applies to the commit rules with an outer optimizer, lam to dana-dc (and dcasgd-c)
    assert per_algo == {"sasgd": 2, "dana-dc": 4, "diloco": 4, "agn": 4}
    assert cells["dana-dc-M2-lam_1"].options["lam"] == 1.0
    assert cells["diloco-M4-outer_opt_sgd"].options["outer_opt"] == "sgd"
    code, out, err = run(path, "--dry-run")
    assert code == 0, err
    assert "every one valid" in out and "async-local-sgd-M4" in out
