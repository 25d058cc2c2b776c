"""experiments/selection_seeds.py: two selections of the same runs compared, on reports built by hand."""

import pytest

from helpers import experiment

selection_seeds = experiment("selection_seeds")


def iv(mean):
    return {"mean": mean, "lo": mean - 0.01, "hi": mean + 0.01, "n": 7}


def report(select_seeds, agn_lr, verdict, report_seeds=(1, 2, 3)):
    where = "outer_lr=1.0 window=10 workers=8"     # an algorithm's own fixed settings are no part of the cell
    sel = [{"algo": "agn", "where": where, "tuned": {"lr": agn_lr}, "report_test_acc": iv(0.97)},
           {"algo": "aeasgd", "where": "window=10 workers=8", "tuned": {"lr": 0.003}, "report_test_acc": iv(0.96)}]
    fig = [{"claim": "agn more accurate than aeasgd", "where": where, "verdict": verdict, **iv(0.01)}]
    return {"protocol": {"selected_on": "validation", "select_seeds": list(select_seeds),
                         "report_seeds": list(report_seeds), "selections": sel, "figures": fig}}


def test_changed_selections_and_verdicts_are_counted():
    summary, lines = selection_seeds.compare(report([0], 0.01, "holds"), report([0, 8, 9], 0.003, "inconclusive"))
    assert summary == {"selections": 2, "selections_changed": 1, "verdicts": 1, "verdicts_changed": 1}
    text = "\n".join(lines)
    assert "| agn | window=10 workers=8 | lr 0.01 | lr 0.003 | **changed** |" in text
    assert "| aeasgd | window=10 workers=8 | lr 0.003 | lr 0.003 | same |" in text
    assert "The selection changes in 1 of 2" in text and "The verdict changes in 1 of 1 claims." in text


def test_same_selection_same_verdict():
    summary, _ = selection_seeds.compare(report([0], 0.01, "holds"), report([0, 8, 9], 0.01, "holds"))
    assert summary["selections_changed"] == 0 and summary["verdicts_changed"] == 0


def test_reports_on_different_reporting_seeds_are_refused(tmp_path):
    with pytest.raises(SystemExit, match="reporting seeds differ"):
        selection_seeds.compare(report([0], 0.01, "holds"), report([0, 8], 0.01, "holds", report_seeds=(1, 2)))
    (tmp_path / "r.json").write_text('{"protocol": {"selected_on": "TEST"}}')
    with pytest.raises(SystemExit, match="no protocol selected on validation"):
        selection_seeds.load(tmp_path / "r.json")
