"""experiments/guide.py, the guide "Which rule for M workers, on which evidence": the committed page regenerates
byte for byte from the committed runs; a rule is named for M only where a claim at that M holds, never on a claim
over several M together, and an M that no claim covers is "no evidence"."""
from pathlib import Path

from helpers import experiment

ROOT = Path(__file__).resolve().parents[1]
guide = experiment("guide")


def claim(id, a, b, verdict, workers=(8,), choice=True, goal="accuracy"):
    return guide.evidence(id, "FINDINGS", goal, f"{a} against {b}", workers, a, b, verdict, "+1.00 points", choice)


def test_the_committed_guide_regenerates_byte_for_byte():
    assert guide.render() == (ROOT / "docs" / "guide.md").read_text()


def test_a_rule_is_named_only_where_a_claim_at_that_m_holds():
    assert guide.decide([]) == "no evidence"
    assert guide.decide([claim("C1", "x", "y", "inconclusive")]) == "inconclusive (C1)"
    assert guide.decide([claim("C1", "x", "y", "holds"), claim("C2", "x", "z", "does not hold")]) == \
        "**x** (over y: C1); undecided: C2"
    # ahead of y but behind z: only z is named
    assert guide.decide([claim("C1", "x", "y", "holds"), claim("C2", "z", "x", "holds")]) == "**z** (over x: C2)"
    # two rules that no claim compared with each other: both named, and said so
    assert guide.decide([claim("C1", "x", "y", "holds"), claim("C2", "z", "w", "holds: z sooner")]) == \
        "**x** (over y: C1), **z** (over w: C2); not compared with each other"
    # a two-sided claim names the side its verdict puts ahead
    assert guide.decide([claim("C1", "x", "y", "holds: b ahead")]) == "**y** (over x: C1)"
    # a claim that chooses no rule (against a control, a probe) names none, whatever its verdict
    assert guide.decide([claim("C1", "x", "x-control", "holds", choice=False)]) == "no evidence"


def test_a_claim_over_several_m_decides_none_of_them(monkeypatch, tmp_path):
    monkeypatch.setattr(guide, "speed_data", lambda: ({}, {}, {}))
    monkeypatch.setattr(guide, "speed_evidence", lambda *args: [claim("T1", "p", "q", "holds", (32,), goal="time")])
    monkeypatch.setattr(guide, "soonest_arms", lambda *args: {})
    monkeypatch.setattr(guide, "confirm_evidence", lambda root: [
        claim("P1", "x", "y", "holds", workers=(8, 16)), claim("S1", "x", "y", "inconclusive", workers=(16,)),
        claim("Q1", "x", "x", "holds", workers=(20,), choice=False)])
    page = guide.render(tmp_path)     # no leaderboard under tmp_path
    rows = [line for line in page.splitlines() if line.startswith("| ") and line.split(" | ")[0][2:].isdigit()]
    assert rows[:6] == ["| 1 | no evidence | no evidence |", "| 4 | no evidence | no evidence |",
                        "| 8 | no evidence | no evidence |", "| 16 | inconclusive (S1) | no evidence |",
                        "| 32 | no evidence | **p** (over q: T1) |",
                        "| 16 | accuracy | [S1](results/FINDINGS.md#the-claims) | x against y | **inconclusive** | "
                        "+1.00 points |"]
    pooled = page[page.index("## The claims over several M together"):]
    assert "| 8, 16 | accuracy | [P1](results/FINDINGS.md#the-claims) | x against y | **holds** |" in pooled
    # an M covered only by a claim that chooses no rule gets no row of its own in the first table
    assert "| 20 | no evidence" not in page and "| 20 | accuracy | [Q1]" in page


def test_the_cli_writes_the_page(tmp_path, monkeypatch):
    monkeypatch.setattr(guide, "render", lambda root=ROOT: "page\n")
    assert guide.main(["--out", str(tmp_path / "g.md")]) == 0
    assert (tmp_path / "g.md").read_text() == "page\n"
