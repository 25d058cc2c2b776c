"""The thesis's AGN table beside ours, cell by cell:
``python experiments/agn_thesis.py GRID_DIR [GRID_DIR ...] --out FILE.md``.

Hermans's master's thesis (JoeriHermans/master-thesis, chapter "Accumulated Gradient Normalization",
tables ``agn_experiments_summary`` and ``agn_temporal_efficiency``) ran AGN and AEASGD on MNIST for every
n and λ from 10 to 40 in steps of 5: the 4.8M-parameter MLP, 40 epochs, a Spark cluster, one run a cell.
Its "validation accuracy" is measured on MNIST's test set, so it stands beside our test accuracy.

Each GRID_DIR is a finished protocol grid (its report/report.json, selected on validation accuracy:
``shared.load_grid``); the grids' selections are merged, so AGN may come from one grid and AEASGD from
another (the leaderboard splits them) as long as the cell (data set, delay, n, window) is the same. For
every thesis cell that our grids ran, this prints both accuracies, AGN − AEASGD from the thesis (one run)
and ours (the paired per-seed differences on the reporting seeds, 95% t interval, ``stats.verdict``), and
whether the two agree on the direction; then the counts of both, and the differences as an n × λ matrix per
delay model, ours beside the thesis's. Our window is the thesis's λ.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

from shared import difference, load_grid, pct, summary, table

from stalegrad.study.stats import DOES_NOT_HOLD, HOLDS, t_interval, verdict

# (n, λ): (AGN test accuracy, AEASGD test accuracy, AGN's temporal efficiency against AEASGD), in %
THESIS = {
    (10, 10): (98.43, 98.64, 1.009), (10, 15): (98.54, 98.69, 1.012), (10, 20): (98.61, 98.67, 1.003),
    (10, 25): (98.52, 98.74, 0.999), (10, 30): (98.50, 98.64, 0.988), (10, 35): (98.42, 98.62, 0.990),
    (10, 40): (98.43, 98.58, 0.990),
    (15, 10): (98.61, 98.67, 1.008), (15, 15): (98.58, 98.65, 1.015), (15, 20): (98.49, 98.60, 1.009),
    (15, 25): (98.50, 98.62, 1.005), (15, 30): (98.44, 98.58, 1.000), (15, 35): (98.45, 98.45, 0.997),
    (15, 40): (98.42, 98.52, 0.994),
    (20, 10): (98.36, 98.52, 0.983), (20, 15): (98.45, 98.49, 1.018), (20, 20): (98.47, 98.39, 1.022),
    (20, 25): (98.45, 98.34, 1.009), (20, 30): (98.49, 98.33, 1.007), (20, 35): (98.44, 98.33, 1.002),
    (20, 40): (98.34, 98.28, 0.997),
    (25, 10): (97.87, 98.40, 0.954), (25, 15): (98.57, 98.32, 1.021), (25, 20): (98.52, 98.23, 1.017),
    (25, 25): (98.44, 98.26, 1.014), (25, 30): (98.48, 98.14, 1.008), (25, 35): (98.46, 98.02, 1.003),
    (25, 40): (98.35, 98.04, 0.999),
    (30, 10): (97.25, 98.28, 0.926), (30, 15): (98.51, 98.13, 1.017), (30, 20): (98.48, 98.03, 1.045),
    (30, 25): (98.48, 97.96, 1.015), (30, 30): (98.39, 97.77, 1.012), (30, 35): (98.35, 97.86, 1.005),
    (30, 40): (98.30, 97.73, 1.005),
    (35, 10): (96.74, 97.96, 0.881), (35, 15): (98.18, 98.06, 0.997), (35, 20): (98.51, 98.01, 1.017),
    (35, 25): (98.37, 97.81, 1.020), (35, 30): (98.43, 97.82, 1.016), (35, 35): (98.13, 97.84, 1.027),
    (35, 40): (98.17, 97.59, 1.012),
    (40, 10): (95.55, 97.99, 1.044), (40, 15): (97.25, 97.89, 0.964), (40, 20): (98.40, 97.83, 1.027),
    (40, 25): (98.39, 97.67, 1.025), (40, 30): (98.45, 97.67, 0.997), (40, 35): (98.32, 97.60, 1.009),
    (40, 40): (98.18, 97.45, 1.009),
}


def selected(reports: list[dict]) -> dict:
    """(algo, dataset, delay, n, window) -> {seed: final test accuracy} of the selected setting, on the
    reporting seeds, merged over the reports (a cell selected in two reports is an error: which counts?)."""
    out: dict = {}
    for report in reports:
        groups = {g["label"]: g for g in report["groups"]}
        p = report["protocol"]
        for s in p["selections"]:
            g, c = groups.get(s.get("group")), s["cell"]
            if g is None or c.get("window") is None:
                continue
            key = (s["algo"], c.get("dataset"), c.get("delay"), c.get("workers"), c.get("window"))
            if key in out:
                sys.exit(f"agn_thesis.py: {key[0]} at n = {key[3]}, window {key[4]} is selected in two of the grids "
                         "given; give each cell's grid once")
            out[key] = {r["seed"]: r["final_test_acc"] for r in g["runs"] if r["seed"] in p["report_seeds"]}
    return out


def direction(ours: str, thesis_diff: float) -> str:
    """Whether our verdict on "AGN above AEASGD" and the thesis's sign agree."""
    if ours not in (HOLDS, DOES_NOT_HOLD):
        return "- (ours inconclusive)"
    if thesis_diff == 0:
        return "- (thesis tied)"
    return "same" if (ours == HOLDS) == (thesis_diff > 0) else "**opposite**"


def compare(reports: list[dict]) -> tuple[list[dict], list[str]]:
    accs = selected(reports)
    rows, out = [], []
    cells = sorted({k[1:] for k in accs if k[0] == "agn" and k[1] == "mnist" and (k[3], k[4]) in THESIS},
                   key=lambda k: (k[1], k[2], k[3], str(k[0])))
    for dataset, delay, n, w in cells:
        agn, ae = accs.get(("agn", dataset, delay, n, w)), accs.get(("aeasgd", dataset, delay, n, w))
        if not agn or not ae:
            continue
        t_agn, t_ae, t_te = THESIS[(n, w)]
        d = difference(agn, ae)
        v = verdict(d["lo"], d["hi"], 0.0)
        a, b = t_interval(list(agn.values())), t_interval(list(ae.values()))
        thesis = {"agn": t_agn, "aeasgd": t_ae, "te": t_te, "agn_minus_aeasgd": t_agn - t_ae}
        rows.append({"n": n, "window": w, "delay": delay, "thesis": thesis,
                     "agn": a, "aeasgd": b, "agn_minus_aeasgd": d, "verdict": v,
                     "direction": direction(v, thesis["agn_minus_aeasgd"])})
        out.append([str(n), str(w), delay, f"{t_agn:.2f}", pct(a), f"{t_ae:.2f}", pct(b), f"{thesis['agn_minus_aeasgd']:+.2f}",
                    f"{100 * d['mean']:+.2f} [{100 * d['lo']:+.2f}, {100 * d['hi']:+.2f}] (n={d['n']})", v,
                    rows[-1]["direction"]])
    lines = table(out, ["n", "λ (window)", "our delays", "AGN thesis", "AGN ours", "AEASGD thesis", "AEASGD ours",
                        "AGN − AEASGD thesis", "AGN − AEASGD ours", "ours: AGN above AEASGD", "direction"])
    dirs, thesis = [r["direction"] for r in rows], [r["thesis"]["agn_minus_aeasgd"] for r in rows]
    lines.append(f"Ours, AGN above AEASGD: {summary(out, col=9)}; "
                 f"the thesis has AGN ahead in {sum(d > 0 for d in thesis)}, AEASGD ahead in "
                 f"{sum(d < 0 for d in thesis)}, a tie in {sum(d == 0 for d in thesis)}.")
    lines.append(f"{len(rows)} cells: the direction agrees in {dirs.count('same')}, is opposite in "
                 f"{dirs.count('**opposite**')}, ours is inconclusive in "
                 f"{sum(x.startswith('- (ours') for x in dirs)}.")
    return rows, lines


def matrix(rows: list[dict]) -> list[str]:
    """AGN − AEASGD in points as an n × λ table per delay model: ours (bold where our interval excludes 0),
    the thesis's in brackets; a cell we did not run is a dot."""
    out = []
    for delay in sorted({r["delay"] for r in rows}):
        cells = {(r["n"], r["window"]): r for r in rows if r["delay"] == delay}
        ns, ws = sorted({k[0] for k in cells}), sorted({k[1] for k in cells})
        body = []
        for n in ns:
            line = [str(n)]
            for w in ws:
                r = cells.get((n, w))
                if r is None:
                    line.append("·")
                    continue
                ours = f"{100 * r['agn_minus_aeasgd']['mean']:+.2f}"
                ours = f"**{ours}**" if r["verdict"] in (HOLDS, DOES_NOT_HOLD) else ours
                line.append(f"{ours} ({r['thesis']['agn_minus_aeasgd']:+.2f})")
            body.append(line)
        out += ["", f"AGN − AEASGD in points, {delay} delays: ours, in bold where its 95% interval excludes 0, and the "
                    "thesis's in brackets; rows n, columns λ (our window).", ""]
        out += table(body, ["n \\ λ"] + [str(w) for w in ws])
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("grid_dirs", nargs="+", type=Path, help="finished protocol grids (their report/report.json)")
    ap.add_argument("--out", help="write the markdown table here; else print it")
    args = ap.parse_args(argv)
    rows, lines = compare([load_grid(g, "agn_thesis.py") for g in args.grid_dirs])
    if not rows:
        sys.exit("agn_thesis.py: none of the thesis's cells (MNIST, n and window from 10 to 40 in steps of 5, AGN and "
                 "AEASGD both selected) is in these grids")
    head = ["# The thesis's AGN table beside ours, cell by cell", "",
            f"`python experiments/agn_thesis.py {' '.join(str(g) for g in args.grid_dirs)}` (test accuracy, %). The "
            "thesis: the 4.8M-parameter MLP, 40 epochs, a Spark cluster, one run a cell, MNIST's test set. Ours: the "
            "grids' setting (their files say it), each rate selected on validation accuracy, 95% t intervals over the "
            "reporting seeds, AGN − AEASGD paired by seed. Our window is the thesis's λ.", ""]
    text = "\n".join(head + lines + matrix(rows)) + "\n"
    if args.out:
        Path(args.out).write_text(text)
    else:
        print(text, end="")
    return 0


if __name__ == "__main__":
    sys.exit(main())
