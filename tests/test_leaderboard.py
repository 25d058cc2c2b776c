"""experiments/leaderboard.py on grids built by hand: report.json files whose per-seed accuracies and times
to target are known, so every interval, pairing, winner, verdict, edge flag and "never reached" can be
checked against its definition (the t quantile below is the textbook value, not the code's)."""
import json
import math
from pathlib import Path

import pytest

from helpers import experiment

lb = experiment("leaderboard")

T975_2 = 4.302652729911275   # t(0.975, 2 degrees of freedom): 3 reporting seeds
SHARED = {"dataset": "fashion-mnist", "model": "mlp", "epochs": 5, "batch_size": 128, "val_split": 10000}


def hand_interval(values):
    n = len(values)
    mean = sum(values) / n
    s = math.sqrt(sum((v - mean) ** 2 for v in values) / (n - 1))
    half = T975_2 * s / math.sqrt(n)
    assert n == 3
    return mean, mean - half, mean + half


def shown(mean, lo, hi, spec=".4f"):
    return f"{mean:{spec}} [{lo:{spec}}, {hi:{spec}}] (n=3)"


def sel(algo, acc, *, workers=8, delay="gamma:2", lr=0.1, score=0.8, ttt=None, edge=None, order=(1, 2, 3), **cell):
    """One selected setting: ``acc`` {seed: final test accuracy}, ``ttt`` {seed: virtual s or None}; the runs
    are listed in ``order`` (not the seeds' order, to catch a pairing by position)."""
    ttt = ttt or {s: 100.0 for s in acc}
    values = [0.01, 0.03, 0.1, 0.3]
    edges = [] if edge is None else [{"axis": "lr", "value": lr, "side": edge, "values": values, "suggest": 1.0,
                                      "text": "..."}]
    label = f"{algo} workers={workers} delay={delay} lr={lr}"
    return {"group": {"label": label, "algo": algo,
                      "runs": [{"seed": 0, "final_test_acc": 0.5, "time_to_target": None}] +
                              [{"seed": s, "final_test_acc": acc[s],
                                "time_to_target": None if ttt[s] is None else {"virtual_s": ttt[s], "samples": 1.0}}
                               for s in order]},
            "selection": {"algo": algo, "cell": {**SHARED, "workers": workers, "delay": delay, **cell},
                          "tuned": {"lr": lr}, "score": score, "edges": edges, "group": label,
                          "scores": [{"tuned": {"lr": v}, "score": 0.5, "missing": []} for v in values]}}


def write_grid(root: Path, name: str, sels, target=0.8, counts=None) -> Path:
    d = root / name
    (d / "report").mkdir(parents=True)
    (d / "grid.json").write_text(json.dumps({"counts": counts or {"done": 4 * len(sels), "not selected": 3}}))
    report = {"compared": {"runs": 4 * len(sels)}, "target": {"test_acc": target},
              "groups": [s["group"] for s in sels],
              "protocol": {"selected_on": "validation", "select_seeds": [0], "report_seeds": [1, 2, 3],
                           "selections": [s["selection"] for s in sels]}}
    (d / "report" / "report.json").write_text(json.dumps(report))
    return d


def rows_of(root):
    reports, skipped = lb.load(root)
    return [e for n, r in reports.items() for e in lb.entries(n, r)], skipped


def line(lines, *parts):
    return next(ln for ln in lines if all(p in ln for p in parts))


OLD = {1: 0.80, 2: 0.85, 3: 0.90}      # dcasgd-a
NEW = {1: 0.79, 2: 0.83, 3: 0.885}     # sasgd: 0.010, 0.020, 0.015 below on the same seed


def two_grids(root, new=NEW, old_score=0.85, **kw):
    write_grid(root, "grad_asgd", [sel("dcasgd-a", OLD, score=old_score, order=(3, 1, 2), **kw),
                               sel("dcasgd-c", {1: 0.70, 2: 0.72, 3: 0.74}, score=0.6)])
    write_grid(root, "grad_sasgd", [sel("sasgd", new, score=0.84, order=(2, 3, 1))])
    return rows_of(root)[0]


def test_the_accuracy_interval_is_the_t_interval_over_the_reporting_seeds(tmp_path):
    rows = two_grids(tmp_path)
    e = next(r for r in rows if r["algo"] == "dcasgd-a")
    assert sorted(e["acc"]) == [1, 2, 3]                 # the selection seed 0 is not reported
    mean, lo, hi = hand_interval(list(OLD.values()))
    f = lb.accuracy(e)
    assert (f["mean"], f["lo"], f["hi"]) == pytest.approx((mean, lo, hi), abs=1e-9)
    table = lb.cell_table(lb.cells(rows)[("gradient", "fashion-mnist", "gamma:2", 8)])
    assert shown(mean, lo, hi) in line(table, "| dcasgd-a |")


def test_differences_pair_the_runs_by_seed_across_grids(tmp_path):
    rows = two_grids(tmp_path)
    old, new = (next(r for r in rows if r["algo"] == a) for a in ("dcasgd-a", "sasgd"))
    d = lb.difference(old, new)
    mean, lo, hi = hand_interval([OLD[s] - NEW[s] for s in (1, 2, 3)])
    assert d["seeds"] == [1, 2, 3] and (d["mean"], d["lo"], d["hi"]) == pytest.approx((mean, lo, hi), abs=1e-9)
    assert lo > 0   # paired, the 1-2 point gain is established although the seeds spread over 10 points
    _, later, _ = lb.who_wins(("gradient", "fashion-mnist", "gamma:2", 8), lb.cells(rows)[("gradient", "fashion-mnist", "gamma:2", 8)])
    assert later == [["gamma:2, M = 8", "dcasgd-a more accurate than sasgd",
                      shown(mean, lo, hi) + ", seeds 1, 2, 3", "holds"]]
    # a seed only one grid ran is left out of the pair, and the interval is over the rest
    new_two = {s: v for s, v in NEW.items() if s != 2}
    new["acc"] = new_two
    assert lb.difference(old, new)["seeds"] == [1, 3] and lb.difference(old, new)["n"] == 2


def test_the_winner_and_who_cannot_be_told_from_it(tmp_path):
    rows = two_grids(tmp_path / "a")
    win, _, _ = lb.who_wins(("gradient", "fashion-mnist", "gamma:2", 8), lb.cells(rows)[("gradient", "fashion-mnist", "gamma:2", 8)])
    # dcasgd-a has the highest mean; sasgd is below it on every seed (holds), dcasgd-c far below
    assert win == ["gamma:2, M = 8", f"dcasgd-a {sum(OLD.values()) / 3:.4f}", "none", "dcasgd-a vs sasgd"]
    close = {1: 0.81, 2: 0.84, 3: 0.89}      # mean 0.8467 < 0.85, but above on seed 1: cannot be told apart
    rows = two_grids(tmp_path / "b", new=close)
    win, later, _ = lb.who_wins(("gradient", "fashion-mnist", "gamma:2", 8), lb.cells(rows)[("gradient", "fashion-mnist", "gamma:2", 8)])
    assert win[1].startswith("dcasgd-a ") and win[2] == "sasgd"
    assert later[0][-1] == "inconclusive"


def test_the_2017_method_is_chosen_on_validation_not_on_test(tmp_path):
    # dcasgd-c is more accurate on the test seeds, but dcasgd-a has the better validation score: dcasgd-a stands
    write_grid(tmp_path, "grad_asgd", [sel("dcasgd-a", OLD, score=0.85), sel("dcasgd-c", {1: 0.95, 2: 0.95, 3: 0.96},
                                                                              score=0.80)])
    write_grid(tmp_path, "grad_dana", [sel("dana-zero", NEW, score=0.90), sel("dana-dc", {1: 0.9, 2: 0.9, 3: 0.9},
                                                                              score=0.70)])
    rows, _ = rows_of(tmp_path)
    win, later, _ = lb.who_wins(("gradient", "fashion-mnist", "gamma:2", 8), lb.cells(rows)[("gradient", "fashion-mnist", "gamma:2", 8)])
    assert win[1].startswith("dcasgd-c ") and win[3] == "dcasgd-a vs dana-zero"
    assert later[0][1] == "dcasgd-a more accurate than dana-zero"


def test_verdicts_against_the_papers_baselines_and_sgd_in_every_m(tmp_path):
    below = {s: v - d for (s, v), d in zip(OLD.items(), (0.02, 0.03, 0.025))}   # asgd below dcasgd-a: holds
    above = {s: v + d for (s, v), d in zip(OLD.items(), (0.02, 0.03, 0.025))}   # ssgd above: does not hold
    write_grid(tmp_path, "grad_asgd", [sel("dcasgd-a", OLD, workers=w) for w in (4, 8)] +
               [sel("asgd", below, workers=w) for w in (4, 8)])
    write_grid(tmp_path, "grad_sgd", [sel("ssgd", above, workers=8), sel("sgd", {1: 0.5, 2: 0.9, 3: 0.6}, workers=1),
                                      sel("sgd", OLD, workers=1, delay="round-robin")])
    rows, _ = rows_of(tmp_path)
    by_cell = lb.cells(rows)
    assert sorted(by_cell) == [("gradient", "fashion-mnist", "gamma:2", 4), ("gradient", "fashion-mnist", "gamma:2", 8)]   # no round-robin cell
    assert [e["algo"] for e in by_cell[("gradient", "fashion-mnist", "gamma:2", 4)]].count("sgd") == 1        # gamma:2's sgd only
    _, _, papers = lb.who_wins(("gradient", "fashion-mnist", "gamma:2", 8), by_cell[("gradient", "fashion-mnist", "gamma:2", 8)])
    got = {r[1]: r[-1] for r in papers}
    assert got == {"dcasgd-a more accurate than sgd": "inconclusive",
                   "dcasgd-a more accurate than ssgd": "does not hold", "dcasgd-a more accurate than asgd": "holds"}
    assert "sgd (M = 1)" in "\n".join(lb.cell_table(by_cell[("gradient", "fashion-mnist", "gamma:2", 4)]))


def test_the_grid_edge_is_flagged_only_at_an_edge(tmp_path):
    write_grid(tmp_path, "grad_asgd", [sel("asgd", OLD, lr=0.3, edge="largest"), sel("dcasgd-a", OLD, lr=0.03)])
    rows, _ = rows_of(tmp_path)
    table = lb.cell_table(lb.cells(rows)[("gradient", "fashion-mnist", "gamma:2", 8)])
    assert line(table, "| asgd |").endswith("| **edge**: lr 0.3, the largest of 0.01-0.3 |")
    assert line(table, "| dcasgd-a |").endswith("| - |")
    assert "lr 0.03 (of 4)" in line(table, "| dcasgd-a |")    # the selected rate and how many were tried


def test_a_target_never_reached_is_counted_never_averaged(tmp_path):
    write_grid(tmp_path, "commit_agn", [sel("agn", OLD, window=10, ttt={1: 120.0, 2: None, 3: 100.0}),
                                        sel("dynsgd", OLD, window=10, ttt={1: None, 2: None, 3: None}),
                                        sel("downpour", OLD, window=10, ttt={1: 90.0, 2: 110.0, 3: 130.0})],
               target=0.95)
    rows, _ = rows_of(tmp_path)
    es = lb.cells(rows)[("commit", "fashion-mnist", 10, 8)]
    table = lb.cell_table(es)
    assert "| 2 of 3 reached (100, 120) |" in line(table, "| agn |")
    assert "| 0 of 3 reached |" in line(table, "| dynsgd |")
    assert f"| {shown(*hand_interval([90.0, 110.0, 130.0]), '.0f')} |" in line(table, "| downpour |")
    assert "test acc 0.95" in table[0]


def test_a_diverged_run_leaves_no_mean(tmp_path):
    write_grid(tmp_path, "grad_asgd", [sel("asgd", {1: 0.8, 2: None, 3: 0.9})])
    rows, _ = rows_of(tmp_path)
    text = lb.acc_text(rows[0])
    assert text.startswith("no mean (n=3)") and "diverged on seed 2" in text


def test_cells_that_differ_in_a_shared_setting_are_not_paired(tmp_path):
    write_grid(tmp_path, "grad_asgd", [sel("dcasgd-a", OLD)])
    write_grid(tmp_path, "grad_sasgd", [sel("sasgd", NEW, epochs=8)])
    rows, _ = rows_of(tmp_path)
    win, later, papers = lb.who_wins(("gradient", "fashion-mnist", "gamma:2", 8), lb.cells(rows)[("gradient", "fashion-mnist", "gamma:2", 8)])
    assert win[1] == "not paired: the methods differ in epochs" and later == papers == []


def test_unfinished_grids_are_named_and_skipped_and_missing_ones_stop(tmp_path, capsys):
    write_grid(tmp_path, "grad_asgd", [sel("dcasgd-a", OLD)])
    write_grid(tmp_path, "grad_sgd", [sel("sgd", OLD, workers=1)], counts={"done": 10, "running": 2, "pending": 5})
    (tmp_path / "grad_dana").mkdir()
    (tmp_path / "grad_dana" / "grid.json").write_text(json.dumps({"counts": {"done": 3}}))   # no report yet
    reports, skipped = lb.load(tmp_path)
    why = dict(skipped)
    assert list(reports) == ["grad_asgd"]
    assert why["grad_sgd"] == "still running: 5 pending, 2 running" and "no report" in why["grad_dana"]
    assert why["commit_agn"] == "not run (no directory)"
    with pytest.raises(SystemExit, match="no such directory"):
        lb.load(tmp_path / "nothing")
    with pytest.raises(SystemExit, match="no finished grid"):
        lb.load(tmp_path / "grad_sgd")
    with pytest.raises(SystemExit) as e:
        lb.main([str(tmp_path / "nothing"), "--out", str(tmp_path / "x.md")])
    assert e.value.code != 0 and "\n" not in str(e.value.code)


def test_the_page_and_the_plot_are_written(tmp_path):
    two_grids(tmp_path)
    write_grid(tmp_path, "commit_agn", [sel("agn", OLD, window=w, workers=n) for w in (10, 40) for n in (8, 16)])
    out = tmp_path / "docs" / "leaderboard.md"
    assert lb.main([str(tmp_path), "--out", str(out)]) == 0
    text = out.read_text()
    assert (tmp_path / "docs" / "leaderboard.png").stat().st_size > 1000
    assert "sh experiments/leaderboard.sh" in text and "## What was cut" in text and "![" in text
    assert f"{3 * 4 + 4 * 4} runs" in text     # the reports' own counts, summed
    assert "## Gradient rules" in text and "## Commit rules" in text and "### window 40, n = 16" in text


def test_a_method_moved_to_its_own_grid_counts_only_there(tmp_path):
    """gap-aware's first sweep (grad_asgd) selected an edge, so its range moved to grad_gap: only grad_gap's
    row may reach the tables, and the page says where it came from."""
    write_grid(tmp_path, "grad_asgd", [sel("asgd", {1: 0.80, 2: 0.81, 3: 0.82}),
                                       sel("gap-aware", {1: 0.50, 2: 0.51, 3: 0.52}, lr=0.3, edge="largest")])
    write_grid(tmp_path, "grad_gap", [sel("gap-aware", {1: 0.84, 2: 0.85, 3: 0.86}, lr=1.0)])
    reports, _ = lb.load(tmp_path)
    rows = lb.rows_of(reports)
    gap = [e for e in rows if e["algo"] == "gap-aware"]
    assert [e["grid"] for e in gap] == ["grad_gap"] and gap[0]["acc"] == {1: 0.84, 2: 0.85, 3: 0.86}
    lines = lb.page(reports, [], None, ["- a cut"])
    assert any("`gap-aware` is taken from `grad_gap` only" in ln for ln in lines)
    assert "- a cut" in lines
    assert not any("0.5100" in ln for ln in lines), "the first sweep's row leaked into a table"
    assert "0.8500" in line(lines, "| gap-aware")


def test_a_later_rule_is_set_against_its_control(tmp_path):
    """DANA against asgd with the same momentum (a grid's arm), paired by seed, with the hand interval."""
    write_grid(tmp_path, "grad_dana", [sel("dana-zero", {1: 0.85, 2: 0.86, 3: 0.84}, lr=0.01)])
    write_grid(tmp_path, "grad_momentum", [sel("asgd-momentum", {1: 0.84, 2: 0.84, 3: 0.845}, lr=0.01)])
    reports, _ = lb.load(tmp_path)
    lines = lb.page(reports, [], None)
    row = line(lines, "dana-zero more accurate than asgd-momentum")
    mean, lo, hi = hand_interval([0.85 - 0.84, 0.86 - 0.84, 0.84 - 0.845])
    assert shown(mean, lo, hi) in row and "inconclusive" in row


def test_each_data_set_is_a_cell_and_a_section_of_its_own(tmp_path):
    """The commit grids run twice, on MNIST and on Fashion-MNIST, with the same windows and n: the cells must
    not mix them (a pairing across data sets would compare different runs), and sgd stands only in its own
    data set's cells."""
    write_grid(tmp_path, "commit_agn", [sel("agn", OLD, window=10, dataset="mnist"),
                                        sel("dynsgd", NEW, window=10, dataset="mnist")])
    write_grid(tmp_path, "commit_agn_fashion", [sel("agn", NEW, window=10), sel("dynsgd", OLD, window=10)])
    write_grid(tmp_path, "grad_sgd", [sel("sgd", OLD, workers=1, dataset="mnist")])
    write_grid(tmp_path, "grad_asgd", [sel("asgd", NEW)])
    reports, _ = lb.load(tmp_path)
    by_cell = lb.cells(lb.rows_of(reports))
    assert list(by_cell) == [("gradient", "fashion-mnist", "gamma:2", 8), ("commit", "mnist", 10, 8),
                             ("commit", "fashion-mnist", 10, 8)]
    assert [e["algo"] for e in by_cell[("gradient", "fashion-mnist", "gamma:2", 8)]] == ["asgd"]   # no MNIST sgd
    mnist, fashion = by_cell[("commit", "mnist", 10, 8)], by_cell[("commit", "fashion-mnist", 10, 8)]
    assert {e["grid"] for e in mnist} == {"commit_agn"} and {e["grid"] for e in fashion} == {"commit_agn_fashion"}
    assert lb.who_wins(("commit", "mnist", 10, 8), mnist)[0][1] == f"agn {sum(OLD.values()) / 3:.4f}"
    assert lb.who_wins(("commit", "fashion-mnist", 10, 8), fashion)[0][1] == f"dynsgd {sum(OLD.values()) / 3:.4f}"
    lines = lb.page(reports, [], None)
    heads = [ln for ln in lines if ln.startswith("## ") and "rules" in ln]
    assert heads == ["## Gradient rules, Fashion-MNIST", "## Commit rules, MNIST", "## Commit rules, Fashion-MNIST"]


def test_grids_with_different_reporting_seeds_say_which(tmp_path):
    write_grid(tmp_path, "grad_asgd", [sel("asgd", OLD)])
    d = write_grid(tmp_path, "grad_sasgd", [sel("sasgd", NEW)])
    report = json.loads((d / "report" / "report.json").read_text())
    report["protocol"]["report_seeds"] = [1, 2, 3, 4, 5, 6, 7]
    (d / "report" / "report.json").write_text(json.dumps(report))
    reports, _ = lb.load(tmp_path)
    text = "\n".join(lb.page(reports, [], None))
    assert "reporting seeds 1, 2, 3 in `grad_asgd`; 1, 2, 3, 4, 5, 6, 7 in `grad_sasgd`." in text


def test_each_dc_variant_is_set_against_asgd_on_its_own(tmp_path):
    """Issue 18's RQ1 asks it of each variant: the page pairs dcasgd-c and dcasgd-a with asgd, seed by seed."""
    asgd = {1: 0.80, 2: 0.82, 3: 0.81}
    write_grid(tmp_path, "grad_asgd", [sel("asgd", asgd), sel("dcasgd-c", {1: 0.80, 2: 0.83, 3: 0.815}),
                                       sel("dcasgd-a", {1: 0.82, 2: 0.84, 3: 0.83})])
    reports, _ = lb.load(tmp_path)
    lines = lb.page(reports, [], None)
    c, a = line(lines, "dcasgd-c more accurate than asgd"), line(lines, "dcasgd-a more accurate than asgd")
    assert shown(*hand_interval([0.0, 0.01, 0.005])) in c and "inconclusive" in c
    assert shown(*hand_interval([0.02, 0.02, 0.02])) in a and "holds" in a
