"""A grid with a [protocol] table runs in two stages (stalegrad/study/stages.py): every setting on the selection
seeds, then the reporting seeds of the selected settings only, chosen as the report's protocol chooses."""
import json
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

from stalegrad.errors import UsageError
from stalegrad.study.grid import expand, parse
from stalegrad.study.stages import choose, split, two_stage

ROOT = Path(__file__).resolve().parents[1]
GRID = """
[fixed]
dataset = "digits"
model = "logreg"
epochs = {epochs}
batch_size = 32
val_split = 300
[axes]
seeds = [0, 1, 2]
algos = ["sgd", "asgd", "dcasgd-c"]
workers = [2, 4]
lr = [0.01, 0.1]
lam = [0.0, 1.0, 4.0]
[protocol]
select_seeds = [0]
report_seeds = [1, 2]
tune = ["lr", "lam"]
arms = {{ "placebo" = {{ algo = "dcasgd-c", lam = 0.0 }} }}
{extra}
"""


def cells_of(tmp_path, epochs=1, extra=""):
    f = tmp_path / "g.toml"
    f.write_text(GRID.format(epochs=epochs, extra=extra))
    fixed, axes, report = parse(f)
    return expand(f, fixed, axes), report["protocol"], f


def test_the_stages_split_by_seed_and_stage_two_holds_the_settings_of_the_best_validation_accuracy(tmp_path):
    cells, spec, _ = cells_of(tmp_path)
    assert two_stage(spec) and not two_stage(dict(spec, stages=1)) and not two_stage({"select_seeds": [0]})
    first, second = split(cells, spec)
    assert {c.options["seed"] for c in first} == {0} and {c.options["seed"] for c in second} == {1, 2}
    assert len(first) + len(second) == len(cells)
    # a known optimum: the score is a function of the settings, largest at lr 0.01 and lam 4 for dcasgd-c,
    # at lr 0.1 for asgd and sgd, and at lr 0.01 for the placebo arm (dcasgd-c with lam 0)
    def acc(c):
        o = c.options
        if o["algo"] == "dcasgd-c":
            return (0.9 if o["lr"] == 0.01 else 0.5) + (0.01 * o["lam"] if o["lam"] else 0.0)
        return 0.8 if o["lr"] == 0.1 else 0.6
    results = {c.name: {"final_val_acc": acc(c), "final_test_acc": 0.5} for c in first}
    chosen, picks = choose(first, second, spec, results)
    got = {(c.algo, c.options.get("workers"), c.options["lr"], c.options.get("lam")) for c in chosen}
    want = {("sgd", 1, 0.1, None)} | {(a, m, lr, lam) for m in (2, 4) for a, lr, lam in
                                      (("asgd", 0.1, None), ("dcasgd-c", 0.01, 4.0), ("dcasgd-c", 0.01, 0.0))}
    assert got == want and len(chosen) == 2 * len(want)    # both reporting seeds of each selected setting
    assert {p["algo"] for p in picks} == {"sgd", "asgd", "dcasgd-c", "placebo"}


def test_a_cell_without_a_finished_selection_run_selects_nothing_and_runs_no_reporting_seed(tmp_path):
    cells, spec, _ = cells_of(tmp_path)
    first, second = split(cells, spec)
    val = {c.name: {"final_val_acc": 0.5} for c in first
           if not (c.algo == "asgd" and c.options["workers"] == 4 and c.options["lr"] == 0.1)}
    chosen, picks = choose(first, second, spec, val)   # asgd M=4 lr 0.1 failed: lr 0.01 is chosen there
    assert {c.options["lr"] for c in chosen if c.algo == "asgd" and c.options["workers"] == 4} == {0.01}
    val = {c.name: {"final_val_acc": 0.5} for c in first if not (c.algo == "asgd" and c.options["workers"] == 4)}
    chosen, picks = choose(first, second, spec, val)
    assert not [c for c in chosen if c.algo == "asgd" and c.options["workers"] == 4]
    assert [p["chosen"] for p in picks if p["algo"] == "asgd" and p["cell"]["workers"] == 4] == [None]


def test_a_failed_selection_run_is_never_selected_and_is_listed(tmp_path):
    """Issue 31, item 5: a run that diverged or sits at chance scores NaN (its setting ranks last), even
    when the validation accuracy it left is the best of its cell; its reason is listed in the picks."""
    cells, spec, _ = cells_of(tmp_path)
    first, second = split(cells, spec)
    asgd4 = [c for c in first if c.algo == "asgd" and c.options["workers"] == 4]
    results = {c.name: {"final_val_acc": 0.5 + c.options["lr"], "final_test_acc": 0.5}
               for c in first}                                     # lr 0.1 is the best everywhere
    bad = next(c.name for c in asgd4 if c.options["lr"] == 0.1)
    results[bad]["diverged"] = True
    chosen, picks = choose(first, second, spec, results)
    assert {c.options["lr"] for c in chosen if c.algo == "asgd" and c.options["workers"] == 4} == {0.01}
    assert {c.options["lr"] for c in chosen if c.algo == "asgd" and c.options["workers"] == 2} == {0.1}
    (pick,) = [p for p in picks if p["algo"] == "asgd" and p["cell"]["workers"] == 4]
    failed = {s["tuned"]["lr"]: (s["failed"], s["failure_rate"]) for s in pick["scores"]}
    assert failed == {0.01: ({}, "0 of 1 diverged"), 0.1: ({0: "diverged (summary.json)"}, "1 of 1 diverged")}
    for c in asgd4:                               # a NaN accuracy is written as null
        results[c.name] = {"final_val_acc": None, "final_test_acc": None}
    chosen, picks = choose(first, second, spec, results)
    assert not [c for c in chosen if c.algo == "asgd" and c.options["workers"] == 4]
    assert [p["chosen"] for p in picks if p["algo"] == "asgd" and p["cell"]["workers"] == 4] == [None]


def test_stage_two_reads_divergence_and_chance_from_the_grid_records(tmp_path):
    from stalegrad.cli.grid import _stage_two
    cells, spec, _ = cells_of(tmp_path)
    first, second = split(cells, spec)
    sgd = {c.options["lr"]: c.name for c in first if c.algo == "sgd"}
    records = {c.name: {"name": c.name, "status": "done", "final_val_acc": 0.8, "final_test_acc": 0.8,
                        "diverged": False} for c in cells}
    records[sgd[0.1]].update(final_val_acc=0.9, diverged=True)      # the best accuracy, but diverged
    runner = type("Runner", (), {"records": records, "actions": {c.name: "run" for c in cells},
                                 "write": lambda self: None})()
    chosen = _stage_two(runner, first, second, spec)
    assert {c.options["lr"] for c in chosen if c.algo == "sgd"} == {0.01}
    records[sgd[0.01]].update(final_val_acc=0.1)                       # at chance: sgd selects nothing
    assert not [c for c in _stage_two(runner, first, second, spec) if c.algo == "sgd"]


def test_stages_must_be_one_or_two(tmp_path):
    with pytest.raises(UsageError, match="stages must be 2 .* or 1 .*got 3"):
        cells_of(tmp_path, extra="stages = 3")


def stalegrad(*args):
    return subprocess.run([sys.executable, "-m", "stalegrad", *args], capture_output=True, text=True, cwd=ROOT,
                          timeout=600)


def grid_here(capsys, *args):
    """``stalegrad grid ...`` in this process (its cells still run in subprocesses): no interpreter and
    torch to start for the grid itself."""
    from stalegrad.cli import main
    code = main(["grid", *map(str, args)])
    out, err = capsys.readouterr()
    return SimpleNamespace(returncode=code, stdout=out, stderr=err)


def test_the_grid_runs_the_selection_seeds_then_only_what_the_report_selected(tmp_path, capsys):
    f = tmp_path / "g.toml"
    f.write_text(GRID.format(epochs=0.3, extra="").replace('"asgd", "dcasgd-c"', '"asgd"').replace(
        "workers = [2, 4]", "workers = [2]").replace('arms = { "placebo" = { algo = "dcasgd-c", lam = 0.0 } }', "")
        .replace('tune = ["lr", "lam"]', 'tune = ["lr"]').replace("lam = [0.0, 1.0, 4.0]\n", "")
        # one reporting seed: two runs fewer to start than with two, and each selected setting still runs
        .replace("seeds = [0, 1, 2]", "seeds = [0, 1]").replace("report_seeds = [1, 2]", "report_seeds = [1]"))
    dry = grid_here(capsys, f, "--dry-run")
    assert dry.returncode == 0, dry.stderr
    assert "stage 2 of 2, the reporting seed" in dry.stdout and " 1: 2 of the 4 cells" in dry.stdout
    assert "(4 + 2 cells to run)" in dry.stdout
    out = tmp_path / "out"
    proc = grid_here(capsys, f, "--out", out, "--jobs", 2)
    assert proc.returncode == 0, proc.stderr
    assert "grid: 8 cells: 6 run, 0 skipped (already done), 2 not selected (stage 2), none failed" in proc.stdout
    assert "stage 2 of 2 (the reporting seeds of the 2 selected settings): 2 cells, 0 already done, 2 to run" in proc.stderr
    # progress counts stage 1's cells, then stage 2's selected ones as they are chosen
    assert "grid: 4/4 done, 0 failed, 0 left" in proc.stderr and "grid: 5/6 done, 0 failed, 1 left" in proc.stderr
    records = {r["name"]: r for r in json.loads((out / "grid.json").read_text())["cells"]}
    ran = {n for n, r in records.items() if r["status"] == "done"}
    assert {n for n, r in records.items() if r["status"] == "not selected"} == {
        n for n in records if n.endswith("-s1")} - ran
    assert sorted(p.name for p in (out / "runs").iterdir()) == sorted(ran)
    # stage 2 ran the setting of the best selection-seed validation accuracy, the one the report selected
    protocol = json.loads((out / "report" / "report.json").read_text())["protocol"]
    for algo, prefix in (("sgd", "sgd-"), ("asgd", "asgd-M2-")):
        val = {r["options"]["lr"]: r["final_val_acc"] for n, r in records.items()
               if n.startswith(prefix) and n.endswith("-s0")}
        best = max(sorted(val), key=lambda lr: val[lr])     # ties to the first, as selection.select breaks them
        assert {r["options"]["lr"] for n, r in records.items() if n.startswith(prefix) and n in ran
                and not n.endswith("-s0")} == {best}
        sel = next(s for s in protocol["selections"] if s["algo"] == algo)
        assert sel["tuned"] == {"lr": best} and sel["report_seeds"] == [1]
    again = grid_here(capsys, f, "--out", out)
    assert again.returncode == 0 and "0 run, 6 skipped (already done), 2 not selected" in again.stdout, again.stderr
