"""stalegrad report --target: time to the target on test and validation accuracy, censored runs counted,
the Kaplan–Meier median, and the figure of accuracy over time with a band over seeds (issue 41)."""
import json
import math
from fractions import Fraction

import numpy as np
import pytest
from click.testing import CliRunner

from stalegrad.cli.report import report
from stalegrad.study.report import write_report
from stalegrad.study.report_target import (LEGEND_MAX, band, censored_cell, km_median, step_values, survival)

pytest.importorskip("matplotlib")

# asgd on the simulator (clock: virtual seconds), five seeds with a validation split. Each evaluation:
# (virtual_s, test_acc, val_acc). Test accuracy 0.8 is reached at 10 (seed 0: exactly at an evaluation),
# 17.5 (seed 2: 0.5 at 10, 0.9 at 20), 25 (seed 3: 0.7 at 20, 0.9 at 30); seed 1 stops at 15 and seed 4
# at 40 without reaching it. Validation accuracy 0.8 only by seed 0, at 20 (0.6 at 10, 1.0 at 30).
SIM = {0: [(0, 0.1, 0.1), (10, 0.8, 0.6), (20, 0.85, 0.8), (30, 0.9, 1.0), (40, 0.9, 0.9)],
       1: [(0, 0.1, 0.1), (5, 0.4, 0.4), (15, 0.6, 0.6)],
       2: [(0, 0.1, 0.1), (10, 0.5, 0.5), (20, 0.9, 0.7), (30, 0.9, 0.7), (40, 0.9, 0.75)],
       3: [(0, 0.1, 0.1), (10, 0.5, 0.5), (20, 0.7, 0.6), (30, 0.9, 0.7)],
       4: [(0, 0.1, 0.1), (20, 0.5, 0.5), (40, 0.7, 0.7)]}
# sgd on the local runtime (clock: wall seconds; its virtual_s, here 10 x wall, is not the clock), no
# validation split: (wall_s, test_acc); 0.8 reached at wall 3 and 5.
LOCAL = {0: [(0, 0.1), (3, 0.8), (6, 0.9)], 1: [(0, 0.1), (4, 0.6), (6, 1.0)]}
TARGET = 0.8


def fake(d, algo, workers, runtime, seed, records):
    d.mkdir(parents=True)
    (d / "config.json").write_text(json.dumps({"algorithm": {"name": algo}, "workers": workers, "seed": seed,
                                               "epochs": 1.0, "dataset": "synthetic", "model": "logreg",
                                               "runtime": {"name": runtime}}))
    (d / "metrics.jsonl").write_text("".join(json.dumps(m) + "\n" for m in records))
    accs = [m["test_acc"] for m in records]
    (d / "summary.json").write_text(json.dumps({"final_test_acc": accs[-1], "best_test_acc": max(accs),
                                                "final_test_loss": 0.5}))
    (d / "staleness.json").write_text("{}")


def sim_records(evals):
    return [{"epoch": i / 4, "samples": 100 * i, "wall_s": t / 100, "virtual_s": float(t), "test_acc": a,
             "val_acc": v} for i, (t, a, v) in enumerate(evals)]


def local_records(evals):
    return [{"epoch": i / 2, "samples": 100 * i, "wall_s": float(t), "virtual_s": 10.0 * t, "test_acc": a}
            for i, (t, a) in enumerate(evals)]


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    root = tmp_path_factory.mktemp("target")
    for s, evals in SIM.items():
        fake(root / "sim" / f"s{s}", "asgd", 4, "sim", s, sim_records(evals))
    for s, evals in LOCAL.items():
        fake(root / "local" / f"s{s}", "sgd", 1, "local", s, local_records(evals))
    return root


@pytest.fixture(scope="module")
def made(runs, tmp_path_factory):
    out = tmp_path_factory.mktemp("report")
    res = CliRunner().invoke(report, [str(runs), "--out", str(out), "--target", str(TARGET)])
    assert res.exit_code == 0, res.output
    return out, json.loads((out / "report.json").read_text()), (out / "report.md").read_text()


def rows_of(rep):
    return {(r["group"], r["accuracy"]): r for r in rep["time_to_target_censored"]["rows"]}


SGD, ASGD = "sgd workers=1 runtime=local", "asgd workers=4 runtime=sim"


def md_row(md, group, accuracy):
    section = md[md.index("## Time to accuracy"):]
    return next(ln for ln in section.splitlines() if ln.startswith(f"| {group} | {accuracy} |"))


# ---------------------------------------------------------------- Kaplan–Meier by hand

def test_kaplan_meier_median_against_a_hand_computation():
    """Reached at 10, 17.5, 25; censored at 15 and 40. At 10: 5 at risk, S = 4/5. At 17.5: 3 at risk
    (17.5, 25 and the run censored at 40; the one censored at 15 has left), S = 4/5 x 2/3 = 8/15 > 1/2. At 25:
    2 at risk, S = 8/15 x 1/2 = 4/15 <= 1/2: the median is 25 (the median of the reached times alone: 17.5)."""
    reached, censored = [10.0, 17.5, 25.0], [15.0, 40.0]
    assert survival(reached, censored) == [(10.0, Fraction(4, 5)), (17.5, Fraction(8, 15)), (25.0, Fraction(4, 15))]
    assert km_median(reached, censored) == (25.0, False)
    # without censoring, the ordinary median: odd n, and even n (S = 1/2 exactly until the next event: midpoint)
    assert km_median([3.0, 1.0, 2.0], []) == (2.0, False)
    assert km_median([1.0, 2.0, 3.0, 4.0], []) == (2.5, False)
    assert km_median([3.0, 5.0], []) == (4.0, False)
    # S stays above 1/2: the median is censored, > the last time observed
    assert km_median([20.0], [15.0, 40.0, 30.0, 40.0]) == (40.0, True)
    assert km_median([], [7.0, 9.0]) == (9.0, True)
    # a run censored at an event's time is still at risk then: 3 at risk at 5, S = 2/3; at 8: 1 at risk, S = 0
    assert survival([5.0, 8.0], [5.0]) == [(5.0, Fraction(2, 3)), (8.0, Fraction(0))]
    assert km_median([5.0, 8.0], [5.0]) == (8.0, False)
    # censoring early does not hide a later crossing: two of three censored, yet S drops to 0 at 10
    assert km_median([10.0], [5.0, 6.0]) == (10.0, False)
    assert km_median([], []) == (None, False)


# ---------------------------------------------------------------- the table

def test_counts_times_and_the_km_median_of_test_accuracy(made):
    _, rep, md = made
    r = rows_of(rep)[(ASGD, "test_acc")]
    assert (r["clock"], r["n"], r["reached"], r["censored"]) == ("virtual_s", 5, 3, 2)
    assert [(x["seed"], x["time"], x["censored_at"]) for x in r["runs"]] == [
        (0, 10.0, None), (1, None, 15.0), (2, pytest.approx(17.5), None), (3, pytest.approx(25.0), None),
        (4, None, 40.0)]
    assert r["censored_at"] == [15.0, 40.0]
    assert r["median_reached"] == pytest.approx(17.5)
    assert r["time_reached"] == {"mean": pytest.approx(17.5), "std": pytest.approx(7.5), "n": 3}
    assert r["km_median"] == {"time": pytest.approx(25.0), "censored": False}
    assert md_row(md, ASGD, "test") == (f"| {ASGD} | test | virtual s | 5 | 3 | 17.5 | 17.5 ± 7.5 (3) | 25.0 "
                                        "| 2 of 5 censored at 15.0, 40.0 |")


def test_validation_accuracy_has_its_own_row_and_a_censored_median(made):
    _, rep, md = made
    r = rows_of(rep)[(ASGD, "val_acc")]
    assert (r["n"], r["reached"], r["censored"]) == (5, 1, 4)
    assert [x["time"] for x in r["runs"]] == [pytest.approx(20.0), None, None, None, None]
    assert r["censored_at"] == [15.0, 30.0, 40.0, 40.0]      # each run's last evaluation
    assert r["km_median"] == {"time": 40.0, "censored": True}  # S(20) = 3/4 and nothing after: > 40
    assert md_row(md, ASGD, "validation") == (f"| {ASGD} | validation | virtual s | 5 | 1 | 20.0 | 20.0 (1) "
                                              "| > 40.0 | 4 of 5 censored at 15.0, 30.0, 40.0, 40.0 |")
    assert (SGD, "val_acc") not in rows_of(rep)            # no --val-split: no validation row
    assert "| sgd workers=1 runtime=local | validation |" not in md


def test_a_real_runtime_is_timed_on_the_wall_clock(made):
    _, rep, md = made
    r = rows_of(rep)[(SGD, "test_acc")]
    assert r["clock"] == "wall_s" and [x["time"] for x in r["runs"]] == [3.0, pytest.approx(5.0)]
    assert r["km_median"] == {"time": pytest.approx(4.0), "censored": False} and r["censored"] == 0
    assert md_row(md, SGD, "test") == f"| {SGD} | test | wall s | 2 | 2 | 4.00 | 4.00 ± 1.41 (2) | 4.00 | 0 of 2 |"


def test_the_new_section_follows_the_old_table_which_is_unchanged(made):
    _, rep, md = made
    sections = ["## Time to reach test accuracy 0.8000", "## Time to accuracy 0.8000, censored runs counted",
                "## Temporal efficiency"]
    assert [md.index(s) for s in sections] == sorted(md.index(s) for s in sections)
    # the old table: wall s, virtual s, samples, a mean over the seeds that reached it
    old = next(ln for ln in md[md.index(sections[0]):].splitlines() if ln.startswith(f"| {ASGD} |"))
    assert old.endswith("not reached (2 of 5 seeds) |")
    assert "right-censored at each run's last evaluation" in md
    json.loads((made[0] / "report.json").read_text(),
               parse_constant=lambda c: (_ for _ in ()).throw(ValueError(c)))   # strict JSON


def test_many_censoring_times_are_shown_as_their_range():
    row = {"n": 9, "censored": 6, "censored_at": [10.0, 11.0, 12.0, 13.0, 14.0, 150.0]}
    assert censored_cell(row) == "6 of 9 censored at 10.0–150"
    assert censored_cell({"n": 3, "censored": 0, "censored_at": []}) == "0 of 3"


def test_without_a_validation_split_only_test_rows(runs, tmp_path):
    write_report([runs / "local"], tmp_path, target=TARGET)
    rep = json.loads((tmp_path / "report.json").read_text())
    assert [(r["group"], r["accuracy"]) for r in rep["time_to_target_censored"]["rows"]] == [("sgd", "test_acc")]
    assert rep["time_to_target_censored"]["plot"]["panels"] == [{"clock": "wall_s", "accuracy": "test_acc"}]


# ---------------------------------------------------------------- the figure

def test_step_interpolation_and_the_band_over_seeds():
    a = ([0.0, 10.0, 20.0], [0.1, 0.5, 0.9])
    b = ([0.0, 5.0, 15.0, 25.0], [0.2, 0.4, 0.6, 0.8])
    assert np.allclose(step_values([0, 4.9, 5, 12, 25], *b), [0.2, 0.2, 0.4, 0.4, 0.8])
    got = step_values([-1, 25.5, 99], *b)                     # before the first evaluation; after the last, held
    assert np.isnan(got[0]) and got[1:].tolist() == [0.8, 0.8]
    assert np.isnan(step_values([-1, 25.5], *b, hold=False)).all()
    got = band([a, b])
    assert got["grid"].tolist() == [0, 5, 10, 15, 20, 25]      # every evaluation time of either seed
    assert np.allclose(got["values"], [[0.1, 0.1, 0.5, 0.5, 0.9, 0.9], [0.2, 0.4, 0.4, 0.6, 0.6, 0.8]])
    assert np.allclose(got["mean"], [0.15, 0.25, 0.45, 0.55, 0.75, 0.85])
    assert np.allclose(got["low"], [0.1, 0.1, 0.4, 0.5, 0.6, 0.8])
    assert np.allclose(got["high"], [0.2, 0.4, 0.5, 0.6, 0.9, 0.9])
    assert np.allclose(got["std"], np.abs(got["values"][0] - got["values"][1]) / math.sqrt(2))
    assert got["n"].tolist() == [2] * 6
    late = ([5.0, 10.0], [0.3, 0.7])                           # a seed first evaluated at 5: the grid starts there
    got = band([a, late])
    assert got["grid"].tolist() == [5, 10, 20] and np.allclose(got["mean"], [0.2, 0.6, 0.8])
    out = band([a, b, late], grid=[-1.0, 2.0, 22.0])           # a grid of its own
    assert out["n"].tolist() == [0, 2, 3] and np.isnan(out["mean"][0])
    assert out["mean"][1] == pytest.approx(0.15) and out["mean"][2] == pytest.approx((0.9 + 0.6 + 0.7) / 3)
    assert out["std"][1] == pytest.approx(0.1 / math.sqrt(2))
    single = band([a])
    assert single["std"].tolist() == [0.0, 0.0, 0.0] and single["n"].tolist() == [1, 1, 1]


def test_the_figure_is_written_and_listed(made):
    out, rep, md = made
    plot = rep["time_to_target_censored"]["plot"]
    assert plot["file"] == "accuracy_vs_time.png"
    assert plot["panels"] == [{"clock": "virtual_s", "accuracy": "val_acc"},     # every sim run has val_acc
                              {"clock": "wall_s", "accuracy": "test_acc"}]
    data = (out / "accuracy_vs_time.png").read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 5000
    assert "![accuracy against time](accuracy_vs_time.png)" in md
    assert "*Validation accuracy against virtual time; test accuracy against wall time" in md


def test_the_figure_draws_the_band_and_the_target_and_bounds_its_legend(runs, tmp_path, monkeypatch):
    import matplotlib.pyplot as plt
    close, figures = plt.close, []
    monkeypatch.setattr(plt, "close", lambda fig=None: figures.append(fig))

    def ours():   # the figure of accuracy over time, not the report's other figures
        (fig,) = [f for f in figures if f.axes[0].get_xlabel() in ("virtual time (s, simulator)", "wall time (s)")]
        return fig
    write_report([runs / "sim"], tmp_path / "one", target=TARGET)
    fig = ours()
    (ax,) = fig.axes
    assert ax.get_ylabel() == "validation accuracy" and ax.get_xlabel() == "virtual time (s, simulator)"
    target = [ln for ln in ax.get_lines() if ln.get_linestyle() == "--"]
    assert len(target) == 1 and list(target[0].get_ydata()) == [TARGET, TARGET]
    mean = next(ln for ln in ax.get_lines() if ln.get_linestyle() == "-")
    # the validation accuracy of each seed at every evaluation time of any seed (seeds 1 and 3 end early
    # and keep their last accuracy)
    assert list(mean.get_xdata()) == [0, 5, 10, 15, 20, 30, 40]
    seeds = np.array([[0.1, 0.1, 0.6, 0.6, 0.8, 1.0, 0.9],
                      [0.1, 0.4, 0.4, 0.6, 0.6, 0.6, 0.6],
                      [0.1, 0.1, 0.5, 0.5, 0.7, 0.7, 0.75],
                      [0.1, 0.1, 0.5, 0.5, 0.6, 0.7, 0.7],
                      [0.1, 0.1, 0.1, 0.1, 0.5, 0.5, 0.7]])
    assert np.allclose(mean.get_ydata(), seeds.mean(0))
    (shade,) = ax.collections                                  # the band: from the lowest seed to the highest
    ys = np.concatenate([p.vertices[:, 1] for p in shade.get_paths()])
    assert np.isclose(ys.min(), 0.1) and np.isclose(ys.max(), 1.0)
    texts = [t.get_text() for t in ax.get_legend().get_texts()]
    assert texts == ["asgd (5)", "target 0.8000"]
    # many groups: the legend beside the axes, at most LEGEND_MAX of them named
    for k in range(LEGEND_MAX + 5):
        fake(tmp_path / "many" / f"g{k}", "asgd", 4, "sim", 0,
             sim_records([(0, 0.1, 0.1), (10, 0.5 + k / 100, 0.5)]) if k else sim_records(SIM[0]))
        cfg = json.loads((tmp_path / "many" / f"g{k}" / "config.json").read_text())
        cfg["lr"] = 0.01 * (k + 1)
        (tmp_path / "many" / f"g{k}" / "config.json").write_text(json.dumps(cfg))
    for f in figures:
        close(f)
    figures.clear()
    write_report([tmp_path / "many"], tmp_path / "many_out", target=TARGET)
    fig = ours()
    texts = [t.get_text() for t in fig.legends[0].get_texts()]
    assert len(texts) == LEGEND_MAX + 2 and texts[-2:] == ["target 0.8000", "... and 5 more (report.json)"]
    assert fig.axes[0].get_legend() is None
    for f in figures:
        close(f)
