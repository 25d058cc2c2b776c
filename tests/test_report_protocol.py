"""The report's protocol section on fabricated run directories whose figures are known: the setting it
selects, the seeds it reports, the intervals and verdicts it derives, the edges it warns of, and the loud
label when there is no validation split; a grid's [protocol] table."""
import json
import statistics

import pytest

from stalegrad.cli import main
from stalegrad.errors import UsageError
from stalegrad.study.report import write_report
from stalegrad.study.stats import t_interval

from helpers import fake_run as fake

SEEDS = range(6)


# test accuracy per (algorithm, lr) and seed: the known truth of the synthetic grid
def acc(algo, lr, seed):
    base = {"sgd": 0.90, "asgd": 0.80, "dcasgd-a": 0.85}[algo]
    best = {"sgd": 0.1, "asgd": 0.03, "dcasgd-a": 0.1}[algo]
    return base - (0.05 if lr != best else 0.0) + 0.002 * ((seed * 7) % 5)


def build(root, with_val=True, trap=True):
    for algo in ("sgd", "asgd", "dcasgd-a"):
        for lr in (0.01, 0.03, 0.1):
            for s in SEEDS:
                test = acc(algo, lr, s)
                val = test - 0.01 if with_val else None
                # the trap: asgd lr 0.1 has the best TEST accuracy on the selection seeds, not the best validation
                if trap and algo == "asgd" and lr == 0.1 and s < 3:
                    test = 0.99
                fake(root, algo, lr, s, test, val, workers=1 if algo == "sgd" else 4)


def protocol(tmp_path, **spec):
    write_report([tmp_path / "runs"], tmp_path / "out", protocol=spec)
    rep = json.loads((tmp_path / "out" / "report.json").read_text())
    return rep["protocol"], (tmp_path / "out" / "report.md").read_text()


def test_it_selects_the_known_best_setting_on_validation_and_reports_other_seeds(tmp_path):
    build(tmp_path / "runs")
    p, md = protocol(tmp_path, select_seeds=[0, 1, 2], report_seeds=[3, 4, 5])
    chosen = {s["algo"]: s for s in p["selections"]}
    assert {a: s["tuned"]["lr"] for a, s in chosen.items()} == {"sgd": 0.1, "asgd": 0.03, "dcasgd-a": 0.1}
    sel = [acc("asgd", 0.03, s) - 0.01 for s in (0, 1, 2)]
    assert chosen["asgd"]["score"] == pytest.approx(statistics.fmean(sel))
    reported = [acc("asgd", 0.03, s) for s in (3, 4, 5)]
    iv = t_interval(reported)
    assert chosen["asgd"]["report_seeds"] == [3, 4, 5]
    assert chosen["asgd"]["report_test_acc"]["mean"] == pytest.approx(iv["mean"])
    assert chosen["asgd"]["report_test_acc"]["lo"] == pytest.approx(iv["lo"])
    section = md.split("## Protocol")[1].split("## Test accuracy")[0]
    assert "selection on validation accuracy" in section and "TEST" not in section
    assert p["warnings"] == []


def test_the_derived_figures_and_their_verdicts(tmp_path):
    build(tmp_path / "runs")
    p, md = protocol(tmp_path, select_seeds=[0, 1, 2], report_seeds=[3, 4, 5], compare=["dcasgd-a>asgd", "asgd>sgd"])
    fig = {(f["kind"], f["claim"].split(" ")[0]): f for f in p["figures"]}
    diff = fig[("difference", "dcasgd-a")]
    # the seeds share their offset, so the difference is 0.05 on every seed: no spread, it holds
    assert diff["mean"] == pytest.approx(0.05) and diff["verdict"] == "holds" and diff["seeds"] == [3, 4, 5]
    assert fig[("difference", "asgd")]["verdict"] == "does not hold"
    closure = fig[("gap closure", "dcasgd-a")]
    assert closure["mean"] == pytest.approx(0.5) and closure["verdict"] == "holds"
    assert closure["method"] == "bootstrap (exact)"
    te = fig[("temporal efficiency", "dcasgd-a")]
    per_seed = [(0.1 + acc("dcasgd-a", 0.1, s)) / (0.1 + acc("asgd", 0.03, s)) for s in (3, 4, 5)]
    assert te["mean"] == pytest.approx(statistics.fmean(per_seed)) and te["null"] == 1.0
    assert "| dcasgd-a more accurate than asgd |" in md


def test_noise_alone_is_inconclusive(tmp_path):
    root = tmp_path / "runs"
    noise = [0.01, -0.02, 0.015, -0.005, 0.02, -0.01]
    for s in SEEDS:
        fake(root, "asgd", 0.1, s, 0.8, 0.8)
        fake(root, "dcasgd-a", 0.1, s, 0.8 + noise[s], 0.8)
    p, _ = protocol(tmp_path, select_seeds=[0], report_seeds=[1, 2, 3, 4, 5], compare=["dcasgd-a>asgd"])
    f = next(f for f in p["figures"] if f["kind"] == "difference")
    assert f["lo"] < 0 < f["hi"] and f["verdict"] == "inconclusive"


def test_a_failed_run_is_never_selected_and_its_failure_is_counted(tmp_path):
    """Issue 31, item 5: summary.json's `diverged` and a run at chance were never read by the selection
    (lr 0.1's diverged run of seed 0 had the best validation accuracy, and won)."""
    root = tmp_path / "runs"
    for lr in (0.03, 0.1, 0.3):
        for s in range(4):
            fake(root, "asgd", lr, s, 0.8, {0.03: 0.8, 0.1: 0.95, 0.3: 0.1}[lr])
    def patch(lr, seed, **fields):
        f = root / f"asgd-M4-lr{lr}--s{seed}" / "summary.json"
        f.write_text(json.dumps({**json.loads(f.read_text()), **fields}))
    patch(0.1, 0, diverged=True)                                       # most messages NaN and skipped
    patch(0.03, 3, final_test_acc=None, final_test_loss=None, diverged=True)   # NaN, written as null
    p, md = protocol(tmp_path, select_seeds=[0, 1], report_seeds=[2, 3])
    (sel,) = p["selections"]
    assert sel["tuned"] == {"lr": 0.03} and sel["score"] == pytest.approx(0.8)
    scores = {s["tuned"]["lr"]: s for s in sel["scores"]}
    assert scores[0.1]["score"] is None and scores[0.1]["failure_rate"] == "1 of 2 diverged"
    assert scores[0.1]["failed"] == {"0": "diverged (summary.json)"}
    assert scores[0.3]["failure_rate"] == "2 of 2 diverged" and "at chance" in scores[0.3]["failed"]["1"]
    assert scores[0.03]["failure_rate"] == "0 of 2 diverged"
    assert sel["report_failure_rate"] == "1 of 2 diverged" and sel["report_failed"] == {"3": "diverged (summary.json)"}
    assert "| asgd | all runs | lr 0.03 | validation | 0.8000 | -; 1 of 2 diverged |" in md


def test_a_selected_value_at_the_grid_edge_is_warned(tmp_path):
    build(tmp_path / "runs")
    p, md = protocol(tmp_path, select_seeds=[0, 1, 2], report_seeds=[3, 4, 5])
    edges = {s["algo"]: s["edges"] for s in p["selections"]}
    assert edges["asgd"] == []                                # 0.03 is interior
    assert edges["sgd"][0]["side"] == "largest" and edges["sgd"][0]["suggest"] == pytest.approx(1 / 3, rel=1e-4)
    assert "**Grid edges:**" in md and "lr 0.1 is the largest of 0.01, 0.03, 0.1" in md


def test_without_a_validation_split_it_says_so_loudly(tmp_path):
    build(tmp_path / "runs", with_val=False)
    p, md = protocol(tmp_path, select_seeds=[0, 1, 2], report_seeds=[3, 4, 5])
    assert p["selected_on"] == "TEST"
    assert "## Protocol: selected on TEST accuracy (no --val-split): not a valid protocol" in md
    # on test accuracy the trap wins: the label is not decoration
    assert {s["algo"]: s["tuned"]["lr"] for s in p["selections"]}["asgd"] == 0.1


def test_the_same_seeds_for_both_are_said(tmp_path):
    build(tmp_path / "runs", trap=False)
    p, md = protocol(tmp_path)
    assert p["select_seeds"] == p["report_seeds"] == list(SEEDS)
    assert any("the selection seeds are the reporting seeds" in w for w in p["warnings"])


def test_an_arm_is_selected_apart(tmp_path):
    root = tmp_path / "runs"
    for s in SEEDS:
        for lam in (0.0, 1.0, 4.0):
            fake(root, "dcasgd-c", 0.1, s, 0.8 + (lam == 0.0) * 0.1, 0.8 + (lam == 0.0) * 0.1, lam=lam)
    p, _ = protocol(tmp_path, select_seeds=[0, 1], tune=["lr", "lam"],
                    arms={"dcasgd-c-placebo": {"algo": "dcasgd-c", "lam": 0.0}})
    chosen = {s["algo"]: s["tuned"] for s in p["selections"]}
    assert chosen == {"dcasgd-c-placebo": {"lr": 0.1, "lam": 0.0}, "dcasgd-c": {"lr": 0.1, "lam": 1.0}}


def test_overlapping_seeds_are_refused(tmp_path):
    build(tmp_path / "runs")
    with pytest.raises(UsageError, match="seed 2 is both"):
        protocol(tmp_path, select_seeds=[0, 1, 2], report_seeds=[2, 3])
    assert not (tmp_path / "out").exists()


def test_the_cli_flags(tmp_path, capsys):
    build(tmp_path / "runs")
    assert main(["report", str(tmp_path / "runs"), "--out", str(tmp_path / "o"), "--select-seeds", "0-2",
                 "--report-seeds", "3,4,5", "--compare", "dcasgd-a>asgd"]) == 0
    rep = json.loads((tmp_path / "o" / "report.json").read_text())["protocol"]
    assert rep["select_seeds"] == [0, 1, 2] and rep["report_seeds"] == [3, 4, 5]
    capsys.readouterr()
    assert main(["report", str(tmp_path / "runs"), "--out", str(tmp_path / "o2"), "--select-seeds", "2-0"]) == 2
    err = capsys.readouterr().err
    assert "--select-seeds" in err and len(err.strip().splitlines()) == 1 and not (tmp_path / "o2").exists()
    assert main(["report", str(tmp_path / "runs"), "--out", str(tmp_path / "o2"), "--select-seeds", "0-2",
                 "--report-seeds", "2-5"]) == 2
    err = capsys.readouterr().err
    assert "--select-seeds and --report-seeds share seed 2" in err and not (tmp_path / "o2").exists()


GRID = """[fixed]
dataset = "digits"
epochs = 0.2
{fixed}
[axes]
algos = ["asgd"]
lr = [0.05, 0.1]
seeds = [0, 1, 2, 3]
[protocol]
{protocol}
"""


@pytest.mark.parametrize("fixed, proto, message", [
    ("val_split = 100", "select_seeds = [0, 1]\nreport_seeds = [1, 2]", "seed 1 is both"),
    ("val_split = 100", "select_seeds = [0, 1]\nreport_seeds = [7]", "seed 7, which the grid does not run"),
    ("val_split = 100", "tune = [\"lam\"]", "tune 'lam' is not an axis"),
    ("val_split = 100", "select = [0]", "unknown key 'select'"),
    ("", "select_seeds = [0, 1]", "hold out no validation samples"),
    ("val_split = 100", "closure = [\"asgd\"]", "closure must name two algorithms"),
])
def test_a_bad_protocol_table_is_one_line_exit_2(tmp_path, capsys, fixed, proto, message):
    f = tmp_path / "g.toml"
    f.write_text(GRID.format(fixed=fixed, protocol=proto))
    assert main(["grid", str(f), "--dry-run"]) == 2
    err = capsys.readouterr().err
    assert message in err and "[protocol]" in err and len(err.strip().splitlines()) == 1, err


def test_a_good_protocol_table_reaches_the_report(tmp_path, capsys):
    f = tmp_path / "g.toml"
    f.write_text(GRID.format(fixed="val_split = 100", protocol="select_seeds = [0, 1]\nreport_seeds = [2, 3]"))
    assert main(["grid", str(f), "--dry-run"]) == 0
    from stalegrad.study.grid import load_grid
    assert load_grid(f).report["protocol"] == {"select_seeds": [0, 1], "report_seeds": [2, 3]}


def test_a_grid_with_a_protocol_reports_it_and_warns_of_edges(tmp_path, capsys):
    f = tmp_path / "g.toml"
    # 3 epochs, not 0.2: a run still at chance (validation accuracy <= 15%) fails and is never selected
    f.write_text(GRID.format(fixed="val_split = 100", protocol="select_seeds = [0]\nreport_seeds = [1]")
                 .replace("seeds = [0, 1, 2, 3]", "seeds = [0, 1]").replace("epochs = 0.2", "epochs = 3"))
    assert main(["grid", str(f), "--out", str(tmp_path / "G"), "--jobs", "2"]) == 0
    err = capsys.readouterr().err
    rep = json.loads((tmp_path / "G" / "report" / "report.json").read_text())["protocol"]
    assert rep["selected_on"] == "validation" and rep["select_seeds"] == [0] and rep["report_seeds"] == [1]
    (sel,) = rep["selections"]               # two lr values: the selected one is always at an edge
    assert sel["tuned"]["lr"] in (0.05, 0.1) and len(sel["edges"]) == 1
    assert "grid: warning: asgd" in err and "extend it (e.g. lr" in err
    md = (tmp_path / "G" / "report" / "report.md").read_text()
    assert "## Protocol: selection on validation accuracy" in md


def test_a_cell_is_labelled_by_the_settings_that_tell_cells_apart_not_by_an_algorithms_fixed_ones(tmp_path):
    # dcasgd-a's eps is the same in every dcasgd-a run and asgd has none: not part of the label; lam0 varies
    # among the dcasgd-a runs: part of it
    for s in SEEDS:
        for lr in (0.03, 0.1):
            fake(tmp_path / "runs", "asgd", lr, s, 0.80, 0.79)
            for lam0 in (0.5, 2.0):
                fake(tmp_path / "runs", "dcasgd-a", lr, s, 0.81, 0.80, lam0=lam0, eps=1e-7)
    p, md = protocol(tmp_path, select_seeds=[0, 1, 2], report_seeds=[3, 4, 5])
    wheres = sorted(s["where"] for s in p["selections"])
    assert wheres == ["all runs", "lam0=0.5", "lam0=2.0"]
    assert "eps=" not in md


def test_mixed_runs_select_each_cell_on_validation_where_its_runs_have_it(tmp_path):
    """Issue 32: runs with a validation split beside runs without one. The cells with it select on validation
    (the trap: asgd lr 0.1 has the best TEST accuracy on the selection seeds, lr 0.03 the best validation
    accuracy), the others on test accuracy, and the report says which, cell by cell."""
    build(tmp_path / "runs" / "val")                          # workers 4 (sgd 1), --val-split
    for lr in (0.03, 0.1):
        for s in SEEDS:
            fake(tmp_path / "runs" / "noval", "asgd", lr, s, acc("asgd", lr, s), workers=8)
    p, md = protocol(tmp_path, select_seeds=[0, 1, 2], report_seeds=[3, 4, 5])
    on = {(s["algo"], s["cell"].get("workers")): (s["selected_on"], s["statistic"], s["tuned"]["lr"])
          for s in p["selections"]}
    assert on[("asgd", 4)] == ("validation", "final_val_acc", 0.03)
    assert on[("asgd", 8)] == ("TEST", "final_test_acc", 0.03)
    assert on[("sgd", 1)][:2] == on[("dcasgd-a", 4)][:2] == ("validation", "final_val_acc")
    assert p["selected_on"] == "mixed"
    assert "## Protocol: selected on validation accuracy where the runs have a validation split, on TEST accuracy " \
           "in 1 of 4 cells (no --val-split): not a valid protocol there" in md
    assert "| asgd | workers=4 | lr 0.03 | validation |" in md and "| asgd | workers=8 | lr 0.03 | **TEST** |" in md
    assert any("selected on TEST accuracy in 1 of 4 cells (asgd workers=8)" in w for w in p["warnings"])


def test_a_grid_and_its_report_select_with_one_rule(tmp_path):
    """stages.choose (a grid's stage 2) and the report choose the statistic of a cell alike: validation where
    every run of the cell has it (report_protocol.with_statistic)."""
    from stalegrad.study.report_protocol import with_statistic
    cands = [{"algo": "asgd", "setting": {"lr": lr, "workers": 4}, "summaries": {0: {"final_val_acc": 0.5,
                                                                                    "final_test_acc": 0.6}}}
             for lr in (0.1, 0.3)]
    cands.append({"algo": "asgd", "setting": {"lr": 0.1, "workers": 8}, "summaries": {0: {"final_test_acc": 0.6}}})
    cands.append({"algo": "asgd", "setting": {"lr": 0.3, "workers": 8}, "summaries": {0: {"final_val_acc": 0.1,
                                                                                         "final_test_acc": 0.6}}})
    stat = with_statistic(cands, ["lr"])
    assert stat == {("asgd", (("workers", 4),)): "final_val_acc", ("asgd", (("workers", 8),)): "final_test_acc"}
    assert [c["values"] for c in cands] == [{0: 0.5}, {0: 0.5}, {0: 0.6}, {0: 0.6}]
