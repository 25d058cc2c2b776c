"""experiments/papers.py: the papers' claims computed from run directories, checked by hand."""
import json

import pytest

from helpers import experiment

papers = experiment("papers")

ON_TEST = papers.Rule(on_test=True)      # the superseded rule: these runs, as the old grids', have no validation


def fake_run(root, name, algo, workers, seed, final, *, lr=0.1, delay="round-robin", window=None, curve=None,
             train_curve=None, val=None, lam=None):
    d = root / name
    d.mkdir(parents=True)
    algorithm = {"name": algo, **({"window": window} if window is not None else {}),
                 **({"lam": lam} if lam is not None else {})}
    (d / "config.json").write_text(json.dumps({"algorithm": algorithm, "workers": workers, "lr": lr, "seed": seed,
                                               "runtime": {"name": "sim", "delay": delay}}))
    curve = curve or [(0.0, 0.1), (10.0, final)]
    (d / "metrics.jsonl").write_text("".join(json.dumps({"virtual_s": t, "test_acc": a, "samples": i})
                                             + "\n" for i, (t, a) in enumerate(curve)))
    msgs = [{"samples": 100 * (i + 1), "wall_s": t, "virtual_s": t, "loss": 1.0, "train_acc": a}
            for i, (t, a) in enumerate(train_curve or [])]
    (d / "messages.jsonl").write_text("".join(json.dumps(m) + "\n" for m in msgs))
    summary = {"final_test_acc": final, "diverged": False, **({"final_val_acc": val} if val is not None else {})}
    (d / "summary.json").write_text(json.dumps(summary))
    (d / "staleness.json").write_text("{}")


def test_gap_closure_and_the_learning_rate_rules(tmp_path):
    # sgd: 0.90 (lr 0.1) beats 0.80 (lr 0.03); asgd: lr 0.03 is its best; dcasgd-a: lr 0.1 is its best
    for s, (sgd, asgd_hi, asgd_lo, dc_hi, dc_lo) in enumerate([(0.90, 0.60, 0.70, 0.80, 0.75),
                                                              (0.92, 0.62, 0.72, 0.86, 0.70)]):
        fake_run(tmp_path, f"sgd-a{s}", "sgd", 1, s, sgd)
        fake_run(tmp_path, f"sgd-b{s}", "sgd", 1, s, 0.80, lr=0.03)
        fake_run(tmp_path, f"asgd-a{s}", "asgd", 8, s, asgd_hi)
        fake_run(tmp_path, f"asgd-b{s}", "asgd", 8, s, asgd_lo, lr=0.03)
        fake_run(tmp_path, f"dc-a{s}", "dcasgd-a", 8, s, dc_hi)
        fake_run(tmp_path, f"dc-b{s}", "dcasgd-a", 8, s, dc_lo, lr=0.03)
    result, text = papers.dcasgd(papers.load_runs([tmp_path]), ON_TEST)
    rows = {r["rule"]: r for r in result["rows"]}
    tuned, sgds = rows["tuned"], rows["sgd's"]
    assert tuned["lr"] == {"sgd": 0.1, "asgd": 0.03, "dcasgd-a": 0.1}
    assert sgds["lr"] == {"sgd": 0.1, "asgd": 0.1, "dcasgd-a": 0.1}
    # tuned, per seed: (0.80-0.70)/(0.90-0.70) = 0.5 and (0.86-0.72)/(0.92-0.72) = 0.7
    assert tuned["closure"]["dcasgd-a"][0] == pytest.approx(0.6)
    assert tuned["closure"]["dcasgd-a"][1] == pytest.approx(0.1414213562, rel=1e-6)
    # sgd's rate: (0.80-0.60)/(0.90-0.60) = 2/3 and (0.86-0.62)/(0.92-0.62) = 0.8
    assert sgds["closure"]["dcasgd-a"][0] == pytest.approx((2 / 3 + 0.8) / 2)
    assert "| 8 | 0.9100 ± 0.0141 (0.1) | - | 0.7100 ± 0.0141 (0.03) |" in text
    assert text.splitlines()[0].startswith("**Superseded:** the learning rate here was selected on the TEST set")
    assert "docs/results/archive/decisive/" in text.splitlines()[0]
    assert result["selection"]["on"] == "test"


def test_agn_temporal_efficiency_and_the_share_of_cells(tmp_path):
    # area to 10 s: agn 0.5*(0.1+0.9)*10 = 5.0, aeasgd 0.5*(0.1+0.7)*10 = 4.0 -> TE 1.25 in cell (8, 10);
    # in cell (8, 40) aeasgd's curve is the higher: TE 4/5 = 0.8
    for s in (0, 1):
        fake_run(tmp_path, f"agn10-{s}", "agn", 8, s, 0.9, window=10, train_curve=[(2.0, 0.5), (7.0, 0.9)])
        fake_run(tmp_path, f"ae10-{s}", "aeasgd", 8, s, 0.7, window=10, train_curve=[(2.0, 0.5), (7.0, 0.7)])
        fake_run(tmp_path, f"agn40-{s}", "agn", 8, s, 0.7, window=40)
        fake_run(tmp_path, f"ae40-{s}", "aeasgd", 8, s, 0.9, window=40)
    result, text = papers.agn(papers.load_runs([tmp_path]), ON_TEST)
    te = {(r["workers"], r["window"]): r["te"] for r in result["rows"]}
    assert te[(8, 10)]["central"][0] == pytest.approx(1.25)
    assert te[(8, 40)]["central"][0] == pytest.approx(0.8)
    # workers variant, 5 s windows: [0,5) holds 0.5 for both, [5,10) 0.9 against 0.7, at 2.5 and 7.5 s:
    # areas to 7.5 s: 0.5*(0.5+0.9)*5 = 3.5 and 0.5*(0.5+0.7)*5 = 3.0
    assert te[(8, 10)]["workers"][0] == pytest.approx(3.5 / 3.0)
    assert result["te_above_1"]["central"] == (1, 2)
    assert "central: 1 of 2" in text


# ---------------------------------------------------------------- selection on validation (issue 18)

# (algo, M, lr) -> per seed 0..3: (validation accuracy, test accuracy). Seeds 0, 1 select, seeds 2, 3 report.
# Validation on seeds 0, 1 prefers sgd 0.1, asgd 0.03, dcasgd-a 0.1; the mean test accuracy over every seed
# prefers the other rate each time; the validation accuracies of seeds 2, 3 prefer it too (a selection that
# looked at them would pick it); the test accuracies of seeds 0, 1 are far off (a report that looked at them
# would show it).
DISAGREE = {
    ("sgd", 1, 0.1): [(0.90, 0.10), (0.90, 0.10), (0.10, 0.90), (0.10, 0.92)],
    ("sgd", 1, 0.03): [(0.80, 0.99), (0.80, 0.99), (0.99, 0.99), (0.99, 0.99)],
    ("asgd", 8, 0.1): [(0.60, 0.95), (0.60, 0.95), (0.99, 0.60), (0.99, 0.62)],
    ("asgd", 8, 0.03): [(0.70, 0.10), (0.70, 0.10), (0.10, 0.70), (0.10, 0.72)],
    ("dcasgd-a", 8, 0.1): [(0.80, 0.10), (0.80, 0.10), (0.10, 0.80), (0.10, 0.86)],
    ("dcasgd-a", 8, 0.03): [(0.75, 0.99), (0.75, 0.99), (0.99, 0.70), (0.99, 0.70)],
}


def disagreeing_grid(root):
    for (algo, m, lr), per_seed in DISAGREE.items():
        for s, (val, test) in enumerate(per_seed):
            fake_run(root, f"{algo}-lr{lr}-s{s}", algo, m, s, test, lr=lr, val=val)


def test_dcasgd_selects_on_validation_and_reports_the_other_seeds(tmp_path):
    disagreeing_grid(tmp_path)
    runs = papers.load_runs([tmp_path])
    result, text = papers.dcasgd(runs, papers.Rule(select_seeds=(0, 1), report_seeds=(2, 3)))
    rows = {r["rule"]: r for r in result["rows"]}
    tuned, sgds = rows["tuned"], rows["sgd's"]
    assert tuned["lr"] == {"sgd": 0.1, "asgd": 0.03, "dcasgd-a": 0.1}
    assert tuned["seeds"] == {"sgd": [2, 3], "asgd": [2, 3], "dcasgd-a": [2, 3]}
    # the reporting seeds' test accuracies: sgd (0.90 + 0.92) / 2, asgd (0.70 + 0.72) / 2, dcasgd-a (0.80 + 0.86) / 2
    assert tuned["final_test_acc"]["sgd"][0] == pytest.approx(0.91)
    assert tuned["final_test_acc"]["asgd"][0] == pytest.approx(0.71)
    assert tuned["final_test_acc"]["dcasgd-a"][0] == pytest.approx(0.83)
    # closure per reporting seed: (0.80-0.70)/(0.90-0.70) = 0.5, (0.86-0.72)/(0.92-0.72) = 0.7
    assert tuned["closure"]["dcasgd-a"][0] == pytest.approx(0.6)
    # sgd's rate 0.1 for all: (0.80-0.60)/(0.90-0.60) = 2/3, (0.86-0.62)/(0.92-0.62) = 0.8
    assert sgds["lr"] == {"sgd": 0.1, "asgd": 0.1, "dcasgd-a": 0.1}
    assert sgds["final_test_acc"]["asgd"][0] == pytest.approx(0.61)
    assert sgds["closure"]["dcasgd-a"][0] == pytest.approx((2 / 3 + 0.8) / 2)
    # std of 0.80, 0.86: 0.06 / sqrt(2) = 0.0424; of the closures 0.5, 0.7: 0.1414
    assert ("| 8 | 0.9100 ± 0.0141 (0.1) | - | 0.7100 ± 0.0141 (0.03) | - | 0.8300 ± 0.0424 (0.1) | - "
            "| 0.60 ± 0.14 |") in text
    assert text.splitlines()[0].startswith("Learning rate selected per cell on validation accuracy")
    assert "selection seeds 0, 1" in text.splitlines()[0] and "reporting seeds 2, 3 only" in text.splitlines()[0]
    assert result["selection"] == {"on": "validation", "select_seeds": [0, 1], "report_seeds": [2, 3],
                                   "statistic": result["selection"]["statistic"]}
    # the superseded rule on the same runs picks every other rate: the test set chose differently
    old = {r["rule"]: r for r in papers.dcasgd(runs, ON_TEST)[0]["rows"]}
    assert old["tuned"]["lr"] == {"sgd": 0.03, "asgd": 0.1, "dcasgd-a": 0.03}


@pytest.mark.parametrize("options, grid_json", [
    (["--select-seeds", "0-1", "--report-seeds", "2,3"], None),
    (["--select-seeds", "0,1"], None),                       # the reporting seeds: every other seed
    ([], {"report": {"protocol": {"select_seeds": [0, 1], "report_seeds": [2, 3], "tune": ["lr"]}}}),
])
def test_the_seeds_from_the_options_or_the_grids_protocol(tmp_path, options, grid_json, capsys):
    disagreeing_grid(tmp_path / "grid" / "runs")
    if grid_json is not None:
        (tmp_path / "grid" / "grid.json").write_text(json.dumps(grid_json))
    out = tmp_path / "papers.md"
    assert papers.main(["dcasgd", str(tmp_path / "grid"), "--out", str(out), *options]) == 0
    result = json.loads((tmp_path / "papers.json").read_text())
    assert result["selection"]["on"] == "validation"
    assert (result["selection"]["select_seeds"], result["selection"]["report_seeds"]) == ([0, 1], [2, 3])
    tuned = next(r for r in result["rows"] if r["rule"] == "tuned")
    assert tuned["lr"] == {"sgd": 0.1, "asgd": 0.03, "dcasgd-a": 0.1}
    assert tuned["final_test_acc"]["sgd"][0] == pytest.approx(0.91)
    assert out.read_text().startswith("Learning rate selected per cell on validation accuracy")


def test_agn_selects_a_rate_per_cell_instead_of_mixing_them(tmp_path):
    # cell (8, 10): agn ran at two rates. Validation on seed 0, 1 prefers 0.001 (0.9 against 0.5); its test
    # accuracies on the reporting seeds 2, 3 are 0.80, 0.84, its curve that of the TE test above (TE 1.25
    # against aeasgd); rate 0.01's are 0.40, 0.44 and a curve to 0.3 (TE 2.0 / 4.0 = 0.5)
    for s in range(4):
        sel = s < 2
        fake_run(tmp_path, f"agn-a{s}", "agn", 8, s, 0.10 if sel else 0.80 + 0.04 * (s - 2), lr=0.001, window=10,
                 val=0.9, curve=[(0.0, 0.1), (10.0, 0.9)])
        fake_run(tmp_path, f"agn-b{s}", "agn", 8, s, 0.99 if sel else 0.40 + 0.04 * (s - 2), lr=0.01, window=10,
                 val=0.5, curve=[(0.0, 0.1), (10.0, 0.3)])
        fake_run(tmp_path, f"ae-{s}", "aeasgd", 8, s, 0.10 if sel else 0.70 + 0.04 * (s - 2), lr=0.001, window=10,
                 val=0.7, curve=[(0.0, 0.1), (10.0, 0.7)])
    result, text = papers.agn(papers.load_runs([tmp_path]), papers.Rule(select_seeds=(0, 1), report_seeds=(2, 3)))
    (row,) = result["rows"]
    assert row["lr"] == {"agn": 0.001, "aeasgd": 0.001}
    assert row["seeds"] == {"agn": [2, 3], "aeasgd": [2, 3]}
    assert row["final_test_acc"]["agn"][0] == pytest.approx(0.82)
    assert row["final_test_acc"]["agn"][1] == pytest.approx(0.0282842712, rel=1e-6)   # 0.04 / sqrt(2)
    assert row["final_test_acc"]["aeasgd"][0] == pytest.approx(0.72)
    assert row["te"]["central"][0] == pytest.approx(1.25)
    assert "| 8 | 10 | 0.8200 ± 0.0283 (0.001) | 0.7200 ± 0.0283 (0.001) | - | - | 1.250 ± 0.000 |" in text


def test_runs_without_validation_accuracy_are_refused_in_one_line(tmp_path, capsys):
    for s in range(3):
        fake_run(tmp_path, f"sgd-{s}", "sgd", 1, s, 0.9)
    assert papers.main(["dcasgd", str(tmp_path), "--select-seeds", "0", "--report-seeds", "1-2"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("papers.py: the runs in ")
    assert "no validation accuracy" in err and "--select-on-test" in err
    # the superseded rule still reads them
    assert papers.main(["dcasgd", str(tmp_path), "--select-on-test"]) == 0
    assert capsys.readouterr().out.startswith("**Superseded:**")


@pytest.mark.parametrize("options, message", [
    (["--select-seeds", "0,1", "--report-seeds", "1-3"], "seed 1 is both a selection seed and a reporting seed"),
    (["--select-seeds", "0-1", "--report-seeds", "0-3"], "seed 0 is both a selection seed and a reporting seed"),
    (["--select-seeds", "5", "--report-seeds", "2,3"], "no run of selection seed 5"),
    (["--select-seeds", "0-3"], "no reporting seed is left"),
    (["--select-seeds", "x"], "--select-seeds 'x': give seeds as integers >= 0"),
    ([], "give --select-seeds and --report-seeds"),
    (["--select-on-test", "--report-seeds", "2"], "drop --select-seeds and --report-seeds"),
])
def test_bad_seeds_are_refused_in_one_line(tmp_path, capsys, options, message):
    disagreeing_grid(tmp_path)
    assert papers.main(["dcasgd", str(tmp_path), *options]) == 2
    captured = capsys.readouterr()
    assert captured.err.count("\n") == 1 and captured.err.startswith("papers.py: ") and message in captured.err
    assert captured.out == ""


def test_runs_that_differ_in_a_setting_not_selected_over_are_refused(tmp_path, capsys):
    # two dcasgd-c runs of one cell, rate and seed, at lam 0 and 8: no rule here may pick one of them
    disagreeing_grid(tmp_path)
    for lam in (0.0, 8.0):
        fake_run(tmp_path, f"dcc-lam{lam}", "dcasgd-c", 8, 0, 0.8, val=0.8, lam=lam)
    assert papers.main(["dcasgd", str(tmp_path), "--select-seeds", "0-1", "--report-seeds", "2-3"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "differ in lam, which papers.py neither selects over" in err
