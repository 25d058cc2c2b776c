"""experiments/lambda_sweep.py: DC-ASGD's lambda by lambda and tuned, on a report built by hand in the
format of a protocol grid's report.json (tune = ["lr"], lam and lam0 as cells)."""
import math
import statistics

import pytest

from helpers import experiment

lambda_sweep = experiment("lambda_sweep")

SEEDS = [1, 2, 3]
ASGD = [0.80, 0.82, 0.81]
# lam -> (validation score, selected lr, test accuracies on SEEDS)
DC_C = {0.04: (0.700, 0.1, [0.80, 0.82, 0.81]),       # the placebo: asgd's own figures
        1.0: (0.710, 0.1, [0.81, 0.83, 0.82]),        # best on validation, +0.01 on every seed
        64.0: (0.710, 0.03, [0.70, 0.75, 0.71])}      # ties on validation: the smaller lam must win


def selection(algo, where, score, lr, accs, key=None, value=None, edges=()):
    cell = {"workers": 8, **({key: value} if key else {})}
    label = f"{algo} {where} lr={lr}"
    g = {"label": label, "runs": [{"seed": s, "final_test_acc": a} for s, a in zip(SEEDS, accs)]}
    s = {"algo": algo, "where": where, "tuned": {"lr": lr}, "score": score, "cell": cell, "group": label,
         "edges": list(edges), "report_test_acc": {"mean": statistics.mean(accs), "lo": 0.0, "hi": 1.0, "n": 3}}
    return s, g


def report(tune=("lr",), with_asgd=True):
    sels = [selection("asgd", "workers=8", 0.70, 0.1, ASGD)] if with_asgd else []
    sels += [selection("dcasgd-c", f"lam={v} workers=8", sc, lr, a, "lam", v) for v, (sc, lr, a) in DC_C.items()]
    sels += [selection("dcasgd-a", "eps=1e-07 lam0=2.0 ms_momentum=0.95 workers=8", 0.69, 0.3, [0.79, 0.80, 0.80],
                       "lam0", 2.0, edges=[{"text": "lr 0.3 is the largest"}])]
    return {"protocol": {"selected_on": "validation", "statistic": "mean final_val_acc over the selection seeds",
                         "select_seeds": [0], "report_seeds": SEEDS, "tune": list(tune),
                         "edge_warnings": ["dcasgd-a workers=8: lr 0.3 is the largest"],
                         "selections": [s for s, _ in sels]},
            "groups": [g for _, g in sels], "compared": {"runs": 99}}


def write(tmp_path, rep):
    import json
    (tmp_path / "report").mkdir(parents=True)
    (tmp_path / "report" / "report.json").write_text(json.dumps(rep))
    return tmp_path


def row(text, first, second):
    return next(line for line in text.splitlines() if line.startswith(f"| {first} | {second} |"))


def test_tuned_lambda_is_the_best_validation_score_and_the_smaller_on_a_tie(tmp_path):
    out = tmp_path / "out.md"
    lambda_sweep.main([str(write(tmp_path, report())), "--out", str(out)])
    text = out.read_text()
    tuned = row(text, "**dcasgd-c, lam tuned**", "-> 1")
    # +0.01 on every seed: the interval is the point, above 0
    assert "0.0100 [0.0100, 0.0100] (n=3)" in tuned and tuned.endswith("| holds |")
    placebo = row(text, "dcasgd-c", "lam 0.04")
    assert "0.0000 [0.0000, 0.0000] (n=3)" in placebo and placebo.endswith("| inconclusive |")


def test_each_lambda_and_the_dose_against_an_independent_t_interval(tmp_path):
    out = tmp_path / "out.md"
    lambda_sweep.main([str(write(tmp_path, report())), "--out", str(out)])
    text = out.read_text()
    d = [a - b for a, b in zip(DC_C[64.0][2], ASGD)]            # -0.10, -0.07, -0.10
    mean, sd = statistics.mean(d), statistics.stdev(d)
    half = 4.302652729911275 * sd / math.sqrt(3)               # t(0.975, 2)
    big = row(text, "dcasgd-c", "lam 64")
    assert f"{mean:.4f} [{mean - half:.4f}, {mean + half:.4f}] (n=3)" in big and big.endswith("| does not hold |")
    dose = [a - b for a, b in zip(DC_C[64.0][2], DC_C[0.04][2])]
    assert f"| dcasgd-c: dose | lam 64 - 0.04 |" in text and f"{statistics.mean(dose):.4f} [" in row(
        text, "dcasgd-c: dose", "lam 64 - 0.04")
    assert "| 0.3 (edge) |" in row(text, "dcasgd-a", "lam0 2")
    assert "one lambda at a time: 1 holds, 1 does not hold, 2 inconclusive (of 4)" in text


def test_a_grid_that_tunes_lambda_or_lacks_asgd_is_refused_in_one_line(tmp_path):
    with pytest.raises(SystemExit, match="lam and lam0 as cells"):
        lambda_sweep.main([str(write(tmp_path / "a", report(tune=("lr", "lam")))), "--out", str(tmp_path / "o.md")])
    with pytest.raises(SystemExit, match="no asgd selection at M = 8"):
        lambda_sweep.main([str(write(tmp_path / "b", report(with_asgd=False))), "--out", str(tmp_path / "o.md")])
    assert not (tmp_path / "o.md").exists()


def test_a_fixed_worker_count_comes_from_the_cell_not_the_label(tmp_path):
    # the cnn cell's grid fixes workers = 8: no label names it, the selection's cell does
    rep = report()
    for s in rep["protocol"]["selections"]:
        s["where"] = " ".join(p for p in s["where"].split() if not p.startswith("workers=")) or "all runs"
    out = tmp_path / "out.md"
    lambda_sweep.main([str(write(tmp_path, rep)), "--out", str(out)])
    text = out.read_text()
    assert "### M = 8" in text and row(text, "**dcasgd-c, lam tuned**", "-> 1").endswith("| holds |")


def test_a_lambda_the_grid_fixes_gets_no_tuned_row(tmp_path):
    # dcasgd-a has the one lam0 2 here (a grid that carries lam0 over, as the cnn and 24-epoch cells do):
    # a "tuned" row would present the grid's fixed value as a selection
    rep = report()
    rep["protocol"]["selections"] = [s for s in rep["protocol"]["selections"] if s["algo"] != "dcasgd-c"]
    out = tmp_path / "out.md"
    lambda_sweep.main([str(write(tmp_path, rep)), "--out", str(out)])
    text = out.read_text()
    assert "| dcasgd-a | lam0 2 |" in text and "lam0 tuned" not in text and "dose" not in text
    assert "no lambda was tuned (the grid fixes each algorithm's lambda)" in text and "tuned rows" not in text
    full = tmp_path / "full.md"
    lambda_sweep.main([str(write(tmp_path / "f", report())), "--out", str(full)])
    assert "lam tuned" in full.read_text() and "lam0 tuned" not in full.read_text()


def test_a_lambda_tuned_at_the_end_of_its_sweep_is_marked_and_warned(tmp_path):
    # lam 64, the largest of 0.04, 1, 64, made best on validation: the protocol's no-edge rule for lambda
    rep = report()
    for sel in rep["protocol"]["selections"]:
        if sel["cell"].get("lam") == 64.0:
            sel["score"] = 0.72
    out = tmp_path / "out.md"
    lambda_sweep.main([str(write(tmp_path, rep)), "--out", str(out)])
    text = out.read_text()
    assert row(text, "**dcasgd-c, lam tuned**", "-> 64 (edge)").endswith("| does not hold |")
    assert "**Sweep edges:** M = 8: dcasgd-c's lam tuned to 64, the largest of its sweep, marked (edge)" in text
    # an interior choice (lam 1, the report as built) carries neither the mark nor the warning
    plain = tmp_path / "plain.md"
    lambda_sweep.main([str(write(tmp_path / "p", report())), "--out", str(plain)])
    assert "Sweep edges" not in plain.read_text() and "-> 1 |" in plain.read_text()
