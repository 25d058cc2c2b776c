"""DC-ASGD's lambda against ASGD, lambda by lambda and tuned (issue 18):
``python experiments/lambda_sweep.py GRID_DIR --out FILE.md``.

GRID_DIR is a finished ``stalegrad grid`` of a protocol file whose lambda (dcasgd-c) and lambda0 (dcasgd-a)
are cells, not tuned (``experiments/dcasgd_decisive_lambda.toml``: ``tune = ["lr"]``): its report holds,
for every worker count M and every lambda, the rate selected on the mean final validation accuracy of the
selection seeds and the test accuracy of that rate on the reporting seeds. This script writes, per M:

- each lambda against ASGD: the seed-paired difference of final test accuracy, its 95% t interval and the
  verdict (``stalegrad.study.stats``: *holds* when the interval lies above 0, *does not hold* when below,
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

from shared import difference, fmt, iv, load_grid, per_seed, summary, table

from stalegrad.study.stats import verdict

PARAM = {"dcasgd-c": "lam", "dcasgd-a": "lam0"}


def rows_by_workers(report: dict, args_dir="the grid") -> dict:
    """{M: {"asgd": sel, "dcasgd-c": {lam: sel}, "dcasgd-a": {lam0: sel}}}, each ``sel`` the report's
    selection with its per-seed test accuracies added (``acc``). M and lambda come from the selection's
    cell (every setting of its runs), not its label, which names only the settings that vary."""
    accs = per_seed(report)
    out: dict = {}
    for s in report["protocol"]["selections"]:
        m = s["cell"].get("workers")
        if m is None:
            sys.exit(f"lambda_sweep.py: a selection without a worker count ({s['algo']} {s['where']!r}); is "
                     f"{args_dir} a grid of DC-ASGD runs (experiments/dcasgd_decisive_lambda.toml)?")
        sel = {**s, "acc": accs.get((s["algo"], s["where"]), {})}
        if s["algo"] in PARAM:
            out.setdefault(int(m), {}).setdefault(s["algo"], {})[float(s["cell"][PARAM[s["algo"]]])] = sel
        else:
            out.setdefault(int(m), {})[s["algo"]] = sel
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


def section(m: int, cells: dict) -> tuple[list[str], list[list[str]], list[list[str]], list[str]]:
    """The table of one M, its rows against asgd (one lambda at a time, and tuned), and a warning for each
    tuned lambda at the smallest or largest value of a sweep of three or more (the protocol's no-edge rule,
    applied to lambda as to the rate)."""
    asgd = cells.get("asgd")
    if asgd is None:
        sys.exit(f"lambda_sweep.py: no asgd selection at M = {m}; the grid must run asgd beside DC-ASGD")
    rows = [["asgd", "-", lr_of(asgd), fmt(asgd["score"]), iv(asgd["report_test_acc"]), "", ""]]
    fixed, tuned_rows, edges = [], [], []
    for algo in ("dcasgd-c", "dcasgd-a"):
        by_value = cells.get(algo, {})
        if not by_value:
            continue
        each = [[algo, f"{PARAM[algo]} {value:g}", lr_of(sel), fmt(sel["score"]), iv(sel["report_test_acc"]),
                 *claim(sel, asgd)] for value, sel in sorted(by_value.items())]
        rows += each
        fixed += each
        if len(by_value) > 1:   # one value is a fixed setting of the grid: nothing was tuned, no tuned row
            best, sel = tuned(by_value)
            lo, hi = min(by_value), max(by_value)
            at_edge = len(by_value) >= 3 and best in (lo, hi)
            if at_edge:
                edges.append(f"M = {m}: {algo}'s {PARAM[algo]} tuned to {best:g}, the "
                             f"{'largest' if best == hi else 'smallest'} of its sweep")
            best_row = [f"**{algo}, {PARAM[algo]} tuned**", f"-> {best:g}" + (" (edge)" if at_edge else ""),
                        lr_of(sel), fmt(sel["score"]),
                        iv(sel["report_test_acc"]), *claim(sel, asgd)]
            rows.append(best_row)
            tuned_rows.append(best_row)
            rows.append([f"{algo}: dose", f"{PARAM[algo]} {hi:g} - {lo:g}", "", "", "", *claim(by_value[hi],
                                                                                           by_value[lo])])
    head = ["algorithm", "setting", "selected lr", "validation score", "test acc [95% t] (n)",
            "difference from asgd [95% t] (n)", "more accurate than asgd"]
    return [f"### M = {m}", "", *table(rows, head)], fixed, tuned_rows, edges


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("grid_dir", type=Path)
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--title", default="DC-ASGD: lambda by lambda, and tuned, against ASGD")
    args = ap.parse_args(argv)
    report = load_grid(args.grid_dir, "lambda_sweep.py")
    p = report["protocol"]
    if any(k in p["tune"] for k in PARAM.values()):
        sys.exit(f"lambda_sweep.py: {args.grid_dir}'s protocol tunes {', '.join(p['tune'])}; this script needs lam "
                 "and lam0 as cells (tune = [\"lr\"]), as in experiments/dcasgd_decisive_lambda.toml")
    cells = rows_by_workers(report, args.grid_dir)
    some_tuned = any(len(v) > 1 for c in cells.values() for k, v in c.items() if k in PARAM)
    tuned_how = "; the tuned rows: rate and lambda together" if some_tuned else ""
    lines = [f"# {args.title}", "",
             f"Selection: {p['statistic']} {', '.join(map(str, p['select_seeds']))} (the rate, per lambda{tuned_how}); test accuracy on seeds {', '.join(map(str, p['report_seeds']))}; "
             f"{report['compared']['runs']} runs. Differences are paired by seed; 95% t intervals.", ""]
    if p["edge_warnings"]:
        lines += [f"**Grid edges:** {len(p['edge_warnings'])} selected rate(s) at the edge of the grid, marked "
                  "(edge): the optimum may lie outside it, and those rows are provisional.", ""]
    fixed, tuned_rows, edges, body = [], [], [], []
    for m in sorted(cells):
        text, f, t, e = section(m, cells[m])
        body += text
        fixed, tuned_rows, edges = fixed + f, tuned_rows + t, edges + e
    if edges:
        lines += [f"**Sweep edges:** {'; '.join(edges)}, marked (edge): a larger or smaller lambda may do better, "
                  "so those tuned rows are provisional until the sweep is extended past them.", ""]
    lines += body
    tuned_text = (f"with lambda tuned on validation: {summary(tuned_rows)}" if tuned_rows else
                  "no lambda was tuned (the grid fixes each algorithm's lambda)")
    lines += ["### Summary", "",
              f"More accurate than ASGD, one lambda at a time: {summary(fixed)} (of {len(fixed)}); {tuned_text}.", ""]
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text("\n".join(lines))
    print(f"lambda_sweep.py: {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
