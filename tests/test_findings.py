"""experiments/findings.py, the confirmatory study's findings page (issue 31): the committed page regenerates byte
for byte; on synthetic runs, each claim's estimate, p value, Holm adjustment, verdict, failure count and missing-run
row match figures computed by hand; the study's grids are valid."""
import json
import math
import re
import subprocess
import sys
from pathlib import Path

import pytest

from helpers import experiment

ROOT = Path(__file__).resolve().parents[1]
findings = experiment("findings")


def test_the_committed_page_regenerates_byte_for_byte():
    assert findings.render(ROOT) == (ROOT / "docs/results/FINDINGS.md").read_text()


def test_every_registered_claim_has_a_row():
    page = (ROOT / "docs/results/FINDINGS.md").read_text()
    plan = findings.tomllib.loads((ROOT / "experiments/confirm/claims.toml").read_text())
    for claim in plan["claim"]:
        row = next(line for line in page.splitlines() if line.startswith(f"| {claim['id']} |"))
        assert re.search(r"\*\*(holds|does not hold|inconclusive|missing: \d+ of \d+ runs)", row), row


@pytest.mark.parametrize("grid", sorted((ROOT / "experiments/confirm").glob("*.toml")), ids=lambda p: p.stem)
def test_the_study_grids_are_valid(grid):
    if grid.stem in ("claims", "descriptive"):
        pytest.skip("not a grid")
    proc = subprocess.run([sys.executable, "-m", "stalegrad", "grid", str(grid), "--out", "/nonexistent/dry",
                           "--dry-run"], capture_output=True, text=True, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr


# ---- synthetic runs ------------------------------------------------------------------------------------
CLAIMS_HEAD = """
[rules]
alpha = 0.05
level = 0.95
chance = 0.10
failed_at_most = 0.15

[seeds]
three = [1, 2, 3]

{claims}
[thesis]
cells = []
"""
CLAIM = """
[[claim]]
id = "{id}"
question = "Q"
text = "{a} ahead of y"
seeds = "three"
a = {{ grid = "g", algo = "{a}" }}
b = {{ grid = "g", algo = "y" }}
cells = [{{ workers = 4 }}]
direction = 1
paper = "-"
"""
CLAIMS = CLAIMS_HEAD.replace("{claims}", "".join(CLAIM.format(id=i, a=a) for i, a in (("X1", "x"), ("X2", "z"),
                                                                                    ("X3", "w"))))


def write_run(root, grid, algo, seed, acc, loss=0.3, workers=4):
    d = root / "docs/results/confirm/runs" / grid / f"{algo}-s{seed}"
    d.mkdir(parents=True)
    (d / "config.json").write_text(json.dumps({"algorithm": {"name": algo}, "workers": workers, "seed": seed,
                                               "numerics": {"cpu_vendor": "V", "cpu_model": "M"}}))
    (d / "summary.json").write_text(json.dumps({"final_test_acc": acc, "final_test_loss": loss, "diverged": False,
                                                "wall_s": 3600.0}))


@pytest.fixture
def root(tmp_path):
    (tmp_path / "experiments/confirm").mkdir(parents=True)
    (tmp_path / "docs/results/confirm").mkdir(parents=True)
    (tmp_path / "experiments/confirm/claims.toml").write_text(CLAIMS)
    (tmp_path / "experiments/confirm/descriptive.toml").write_text("")
    (tmp_path / "docs/results/confirm/registration.toml").write_text('commit = "abc1234"\ndate = "D"\n')
    for seed, (x, y, z) in zip([1, 2, 3], [(0.91, 0.90, 0.905), (0.92, 0.90, 0.89), (0.93, 0.90, 0.91)]):
        write_run(tmp_path, "g", "x", seed, x)
        write_run(tmp_path, "g", "y", seed, y)
        write_run(tmp_path, "g", "z", seed, z)
    write_run(tmp_path, "g", "w", 1, 0.95)
    write_run(tmp_path, "g", "w", 2, float("nan"), loss=float("nan"))   # failed: enters at chance, 0.10
    return tmp_path


def row(page, claim_id):
    return next(line for line in page.splitlines() if line.startswith(f"| {claim_id} |")).split(" | ")


def test_estimates_p_values_holm_and_verdicts_match_hand_computation(root):
    page = findings.render(root)
    # X1: x - y = 0.01, 0.02, 0.03 -> mean 0.02, sd 0.01, t = 0.02 / (0.01 / sqrt 3) = 3.4641 with 2 df;
    # one-sided p = 0.5 * (1 - t / sqrt(2 + t^2)) (the t distribution with 2 df in closed form) = 0.03709.
    t = 0.02 / (0.01 / math.sqrt(3))
    p1 = 0.5 * (1 - t / math.sqrt(2 + t * t))
    # the 95% interval: 0.02 +- 4.3027 * 0.01 / sqrt 3
    half = 4.302653 * 0.01 / math.sqrt(3)
    r1 = row(page, "X1")
    assert r1[4] == f"{100 * 0.02:+.2f} [{100 * (0.02 - half):+.2f}, {100 * (0.02 + half):+.2f}] (3 seeds)"
    # X2: z - y = 0.005, -0.01, 0.01 -> mean 0.001667, sd 0.010408
    d2 = [0.005, -0.01, 0.01]
    m2 = sum(d2) / 3
    sd2 = math.sqrt(sum((d - m2) ** 2 for d in d2) / 2)
    t2 = m2 / (sd2 / math.sqrt(3))
    p2 = 0.5 * (1 - t2 / math.sqrt(2 + t2 * t2))
    # X3 lacks seed 3's w run: missing, p = 1. Holm over 3: sorted p1 < p2 < 1 -> 3 * p1, max(3 p1, 2 p2), 1.
    assert r1[5] == f"{p1:.3g} ({min(1, 3 * p1):.3g})"
    assert row(page, "X2")[5] == f"{p2:.3g} ({min(1, max(3 * p1, 2 * p2)):.3g})"
    # 3 * p1 = 0.111 > 0.05: not rejected; the interval holds 0 -> inconclusive
    assert r1[3] == "**inconclusive**"
    assert row(page, "X3")[3] == "**missing: 1 of 6 runs**"
    assert "A claim marked *missing* waits for runs not made yet" in page   # said once, under the table
    assert page.count("enters Holm's correction at p = 1") == 1


def test_a_failed_run_enters_at_chance_and_is_counted(root):
    write_run(root, "g", "w", 3, 0.95)
    r3 = row(findings.render(root), "X3")
    # w - y = 0.05, 0.10 - 0.90 = -0.80, 0.05: mean -0.2333
    assert r3[4].startswith(f"{100 * (0.05 - 0.80 + 0.05) / 3:+.2f} [")
    assert r3[6] == "1 of 3; 0 of 3"                         # a (w) failed once; b (y) never


def test_a_claim_that_holds_after_holm(root):
    # a large, consistent effect: x - y = 0.02 +- 0.0001 on 3 seeds gives p far below 0.05 / 3
    for seed, acc in zip([1, 2, 3], (0.9201, 0.9199, 0.9200)):
        (root / f"docs/results/confirm/runs/g/x-s{seed}/summary.json").write_text(json.dumps(
            {"final_test_acc": acc, "final_test_loss": 0.3, "diverged": False, "wall_s": 1.0}))
    assert row(findings.render(root), "X1")[3] == "**holds**"


def test_the_cli_writes_the_page(root, tmp_path):
    out = tmp_path / "F.md"
    assert findings.main(["--root", str(root), "--out", str(out)]) == 0
    assert out.read_text() == findings.render(root)
    assert "`abc1234`" in out.read_text()


def test_a_failed_run_enters_a_probe_claim_at_its_null(root):
    """PLAN.md, change 1: a failed run's probe share is the claim's ``failed`` value, not its finite probes'."""
    plan = CLAIMS_HEAD.replace("{claims}", """
[[claim]]
id = "P1"
question = "Q"
text = "share above one half"
kind = "probe_share"
seeds = "three"
a = { grid = "p", algo = "x" }
field = "e"
than = "g"
cells = [{}]
direction = 1
margin = 0.5
failed = 0.5
paper = "-"
""")
    (root / "experiments/confirm/claims.toml").write_text(plan)
    probes = {1: [(0.1, 1.0)] * 9 + [(2.0, 1.0)],            # 9 of 10 below: 0.9
              2: [(0.1, 1.0)] * 8 + [(2.0, 1.0)] * 2,        # 0.8
              3: [(0.1, 1.0)] * 10}                          # finite probes all below, but the run failed
    for seed, rows in probes.items():
        failed = seed == 3
        write_run(root, "p", "x", seed, float("nan") if failed else 0.9, loss=float("nan") if failed else 0.3)
        (root / f"docs/results/confirm/runs/p/x-s{seed}/probes.jsonl").write_text(
            "".join(json.dumps({"e": e, "g": g}) + "\n" for e, g in rows))
    r = row(findings.render(root), "P1")
    assert r[4].startswith(f"{(0.9 + 0.8 + 0.5) / 3:.3f} [")   # seed 3 enters at 0.5, not at 1.0
    assert r[6] == "1 of 3"


def test_spearman_ranks_ties_by_their_mean_and_matches_the_textbook_formula():
    assert findings.ranks([3.0, 1.0, 3.0, 2.0]) == [3.5, 1.0, 3.5, 2.0]
    # without ties, rho = 1 - 6 * sum(d^2) / (n (n^2 - 1)); here the rank differences are 0, 1, -1, 0, 0
    x, y = [0.1, 0.5, 0.2, 0.9, 1.5], [10.0, 30.0, 40.0, 50.0, 60.0]
    assert findings.spearman(x, y) == pytest.approx(1 - 6 * 2 / (5 * 24))
    assert findings.spearman(x, [-v for v in y]) == pytest.approx(-(1 - 6 * 2 / (5 * 24)))


def paired_claim(cid: str, grid: str, a: str, b: str, **extra) -> str:
    """One claim of side a against side b in one grid, over the seeds "three", with ``extra`` keys (kind, field...)."""
    keys = {"id": cid, "question": "Q", "text": f"{a} ahead of {b}", "seeds": "three", **extra}
    return ("\n[[claim]]\n" + "".join(f"{k} = {json.dumps(v)}\n" for k, v in keys.items())
            + f'a = {{ grid = "{grid}", algo = "{a}" }}\nb = {{ grid = "{grid}", algo = "{b}" }}\n'
            + 'cells = [{}]\ndirection = 1\npaper = "-"\n')


def test_a_probe_mean_claim_is_shown_in_its_own_unit_not_in_points(root):
    """AG7's kind: the per-run mean cosine of side a minus side b, shown as a cosine (0.220), not x 100."""
    plan = CLAIMS_HEAD.replace("{claims}", paired_claim("P2", "p", "x", "y", kind="probe_mean", field="c", failed=0.0))
    (root / "experiments/confirm/claims.toml").write_text(plan)
    for seed, (ca, cb) in {1: (0.30, 0.10), 2: (0.32, 0.10), 3: (0.34, 0.10)}.items():
        for algo, c in (("x", ca), ("y", cb)):
            write_run(root, "p", algo, seed, 0.9)
            (root / f"docs/results/confirm/runs/p/{algo}-s{seed}/probes.jsonl").write_text(
                "".join(json.dumps({"c": v}) + "\n" for v in (c - 0.05, c + 0.05)))
    r = row(findings.render(root), "P2")
    half = 4.302653 * 0.02 / 3 ** 0.5   # differences 0.20, 0.22, 0.24: mean 0.22, sd 0.02, t(2) 97.5%
    assert r[4] == f"+0.220 [{0.22 - half:+.3f}, {0.22 + half:+.3f}] (3 seeds)"


def test_the_headline_cells_levels_stand_beside_the_thesis_table_at_its_cell(root):
    plan = CLAIMS_HEAD.replace("{claims}", paired_claim("AG2", "h", "agn", "aeasgd")).replace(
        "cells = []", "cells = [[4, 2, 98.00, 97.00]]")
    (root / "experiments/confirm/claims.toml").write_text(plan)
    assert "The headline cell's levels (AG2) wait for its runs." in findings.render(root)
    for seed, (a, b) in {1: (0.981, 0.971), 2: (0.983, 0.973), 3: (0.985, 0.975)}.items():
        for algo, acc in (("agn", a), ("aeasgd", b)):
            write_run(root, "h", algo, seed, acc)
            config = root / f"docs/results/confirm/runs/h/{algo}-s{seed}/config.json"
            config.write_text(json.dumps({**json.loads(config.read_text()), "window": 2, "model": "m"}))
    assert ("The headline cell with the thesis's own model (AG2: m, n = 4, λ = 2), mean over the 3 seeds: "
            "AGN 98.30 (thesis 98.00), AEASGD 97.30 (thesis 97.00).") in findings.render(root)
