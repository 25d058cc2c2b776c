"""DC-ASGD's lambda against ASGD, lambda by lambda and tuned (issue 18):
``python experiments/lambda_sweep.py GRID_DIR --out FILE.md``.

GRID_DIR is a finished ``stalegrad grid`` of a protocol file whose lambda (dcasgd-c) and lambda0 (dcasgd-a)
are cells, not tuned (``experiments/dcasgd_decisive_lambda.toml``: ``tune = ["lr"]``): its report holds,
for every worker count M and every lambda, the rate selected on the mean final validation accuracy of the
selection seeds and the test accuracy of that rate on the reporting seeds. This script writes, per M:

- each lambda against ASGD: the seed-paired difference of final test accuracy, its 95% t interval and the
  verdict (``stalegrad.stats``: *holds* when the interval lies above 0, *does not hold* when below,
  *inconclusive* when it holds 0);
- the **tuned** lambda: the (rate, lambda) pair with the best validation statistic, chosen from the same
  per-lambda selections (the best pair over both is always one of them, so the grid's second stage ran
  it), against ASGD the same way: what a user who tunes lambda on validation data gets;
- the **dose**: the largest lambda against the smallest, paired by seed. If the correction did nothing at
  every lambda, this difference would be noise around 0; a verdict other than *inconclusive* says lambda
  changes the result.

No correction for multiple comparisons.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

from stalegrad.stats import verdict

sys.path.insert(0, str(Path(__file__).resolve().parent))
from decisive import cell, difference, fmt, iv, load, per_seed, table  # noqa: E402

PARAM = {"dcasgd-c": "lam", "dcasgd-a": "lam0"}


def rows_by_workers(report: dict, args_dir="the grid") -> dict:
    """{M: {"asgd": sel, "dcasgd-c": {lam: sel}, "dcasgd-a": {lam0: sel}}}, each ``sel`` the report's
    selection with its per-seed test accuracies added (``acc``)."""
    accs = per_seed(report)
    out: dict = {}
    for s in report["protocol"]["selections"]:
        where = cell(s["where"])
        m = where.get("workers", s["cell"].get("workers"))    # a fixed worker count is in no label
        if m is None:
            sys.exit(f"lambda_sweep.py: a selection without a worker count ({s['algo']} {s['where']!r}); is "
                     f"{args_dir} a grid of DC-ASGD runs (experiments/dcasgd_decisive_lambda.toml)?")
        m = int(m)
        sel = {**s, "acc": accs.get((s["algo"], s["where"]), {})}
        if s["algo"] in PARAM:
            key = PARAM[s["algo"]]
            value = float(where.get(key, s["cell"].get(key, "nan")))
            out.setdefault(m, {}).setdefault(s["algo"], {})[value] = sel
        else:
            out.setdefault(m, {})[s["algo"]] = sel
    return out


def tuned(by_value: dict) -> tuple[float, dict]:
    """The (value, selection) with the best validation score; ties go to the smaller value."""
    return max(sorted(by_value.items()), key=lambda kv: kv[1]["score"])


def claim(a: dict, b: dict) -> list[str]:
    d = difference(a["acc"], b["acc"])
    return [iv(d), verdict(d["lo"], d["hi"], 0.0)]


def lr_of(sel: dict) -> str:
    """The selected rate, marked when it is the smallest or largest of its grid (the row is provisional)."""
    lr = sel["tuned"].get("lr")
    return (f"{lr:g}" if isinstance(lr, (int, float)) else "-") + (" (edge)" if sel.get("edges") else "")


def section(m: int, cells: dict) -> tuple[list[str], list[tuple]]:
    asgd = cells.get("asgd")
    if asgd is None:
        sys.exit(f"lambda_sweep.py: no asgd selection at M = {m}; the grid must run asgd beside DC-ASGD")
    rows = [["asgd", "-", lr_of(asgd), fmt(asgd["score"]), iv(asgd["report_test_acc"]), "", ""]]
    verdicts = []
    for algo in ("dcasgd-c", "dcasgd-a"):
        by_value = cells.get(algo, {})
        if not by_value:
            continue
        for value, sel in sorted(by_value.items()):
            c = claim(sel, asgd)
            rows.append([algo, f"{PARAM[algo]} {value:g}", lr_of(sel), fmt(sel["score"]),
                         iv(sel["report_test_acc"]), *c])
            verdicts.append((m, algo, f"{value:g}", c[1]))
        best, sel = tuned(by_value)
        c = claim(sel, asgd)
        rows.append([f"**{algo}, {PARAM[algo]} tuned**", f"-> {best:g}", lr_of(sel), fmt(sel["score"]),
                     iv(sel["report_test_acc"]), *c])
        verdicts.append((m, algo, "tuned", c[1]))
        if len(by_value) > 1:
            lo, hi = min(by_value), max(by_value)
            d = difference(by_value[hi]["acc"], by_value[lo]["acc"])
            rows.append([f"{algo}: dose", f"{PARAM[algo]} {hi:g} - {lo:g}", "", "", "", iv(d),
                         verdict(d["lo"], d["hi"], 0.0) if d["n"] > 1 else "-"])
    head = ["algorithm", "setting", "selected lr", "validation score", "test acc [95% t] (n)",
            "difference from asgd [95% t] (n)", "more accurate than asgd"]
    return [f"### M = {m}", "", *table(rows, head)], verdicts


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("grid_dir", type=Path)
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--title", default="DC-ASGD: lambda by lambda, and tuned, against ASGD")
    args = ap.parse_args(argv)
    report = load(args.grid_dir)
    p = report["protocol"]
    if any(k in p["tune"] for k in PARAM.values()):
        sys.exit(f"lambda_sweep.py: {args.grid_dir}'s protocol tunes {', '.join(p['tune'])}; this script needs lam "
                 "and lam0 as cells (tune = [\"lr\"]), as in experiments/dcasgd_decisive_lambda.toml")
    cells = rows_by_workers(report, args.grid_dir)
    lines = [f"# {args.title}", "",
             f"Selection: {p['statistic']} {', '.join(map(str, p['select_seeds']))} (the rate, per lambda; the "
             f"tuned rows: rate and lambda together); test accuracy on seeds {', '.join(map(str, p['report_seeds']))}; "
             f"{report['compared']['runs']} runs. Differences are paired by seed; 95% t intervals.", ""]
    if p["edge_warnings"]:
        lines += [f"**Grid edges:** {len(p['edge_warnings'])} selected rate(s) at the edge of the grid, marked "
                  "(edge): the optimum may lie outside it, and those rows are provisional.", ""]
    verdicts = []
    for m in sorted(cells):
        text, v = section(m, cells[m])
        lines += text
        verdicts += v
    count = lambda rows: ", ".join(f"{sum(r[3] == x for r in rows)} {x}" for x in   # noqa: E731
                                   ("holds", "does not hold", "inconclusive") if any(r[3] == x for r in rows))
    fixed = [v for v in verdicts if v[2] != "tuned"]
    lines += ["### Summary", "",
              f"More accurate than ASGD, one lambda at a time: {count(fixed) or 'no figure'} "
              f"(of {len(fixed)}); with lambda tuned on validation: {count([v for v in verdicts if v[2] == 'tuned']) or 'no figure'}.", ""]
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text("\n".join(lines))
    print(f"lambda_sweep.py: {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
