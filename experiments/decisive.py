"""The research questions of issue 18, answered from a protocol grid:
``python experiments/decisive.py dcasgd|agn GRID_DIR --out FILE.md``.

GRID_DIR is a finished ``stalegrad grid`` directory of a file with a ``[protocol]`` table
(``experiments/dcasgd_decisive_cut.toml``, ``experiments/agn_decisive_cut.toml``): its report
(GRID_DIR/report/report.json) holds the selection (validation accuracy, selection seeds) and the
figures on the reporting seeds (paired differences with t intervals, gap closures with bootstrap
intervals, temporal efficiencies). This script only groups those figures by research question and
adds the few that need two cells at once (AGN's drop from n = 8 to n = 16), with the same interval
(``stalegrad.study.stats.t_interval``) and the same verdict rule (``stalegrad.study.stats.verdict``): *holds* when
the whole 95% interval lies on the claim's side of "no effect", *does not hold* when it lies wholly on
the other side, *inconclusive* when it contains it. No correction for multiple comparisons.

"As close as" claims (DC-ASGD against sequential SGD, AGN across windows) need a margin: we take half a
point of accuracy (``MARGIN``), fixed before the runs, and say *holds* when the whole interval of the
difference lies within it, *does not hold* when it lies wholly outside, else *inconclusive*.

Questions that the grids do not measure (DC-ASGD RQ4, AGN RQ4: the probes of docs/results/probes_*.md,
one seed each) are answered from those measurements, with what they lack said in the verdict.
"""
from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path

from shared import cell, difference, fmt, iv, load_grid, per_seed, shown, summary, table

from stalegrad.study.stats import DOES_NOT_HOLD, HOLDS, INCONCLUSIVE, t_interval, verdict

MARGIN = 0.005


def load(grid_dir: Path) -> dict:
    return load_grid(grid_dir, "decisive.py")


def within(f: dict, margin: float = MARGIN) -> str:
    """The verdict of "the difference is within +-margin"."""
    if not (math.isfinite(f["lo"]) and math.isfinite(f["hi"])):
        return INCONCLUSIVE
    if -margin <= f["lo"] and f["hi"] <= margin:
        return HOLDS
    return DOES_NOT_HOLD if f["lo"] > margin or f["hi"] < -margin else INCONCLUSIVE


def figures(report: dict, kind: str, claim: str) -> list[dict]:
    return [f for f in report["protocol"]["figures"] if f["kind"] == kind and f["claim"].startswith(claim)]


def claim_rows(report: dict, kind: str, claims: list[str]) -> list[list[str]]:
    rows = []
    for c in claims:
        for f in figures(report, kind, c):
            why = f" ({f['why']})" if f.get("why") else ""
            rows.append([f["claim"], shown(f["where"]), iv(f), f["verdict"] + why])
    return rows


def selections(report: dict) -> list[str]:
    rows = []
    for s in report["protocol"]["selections"]:
        tuned = ", ".join(f"{k} {v:g}" if isinstance(v, float) else f"{k} {v}" for k, v in s["tuned"].items())
        rows.append([s["algo"], shown(s["where"]), tuned or "-", fmt(s["score"]), iv(s["report_test_acc"])
                     if s.get("report_test_acc") else "-", "; ".join(e["text"] for e in s["edges"]) or "-"])
    seeds = ", ".join(map(str, report["protocol"]["select_seeds"]))
    return table(rows, ["algorithm", "cell", "selected", f"validation score (seeds {seeds})",
                        "test acc, reporting seeds", "grid edge"])


def dcasgd(report: dict, probes: dict | None) -> list[str]:
    seeds = per_seed(report)
    out = ["## RQ1: does delay compensation improve ASGD's accuracy and convergence?", ""]
    rows = claim_rows(report, "difference", ["dcasgd-c more accurate than asgd", "dcasgd-a more accurate than asgd"])
    placebo = claim_rows(report, "difference", ["dcasgd-c-placebo more accurate than asgd"])
    speed = claim_rows(report, "temporal efficiency", ["dcasgd-c reaches higher accuracy sooner than asgd ",
                                                       "dcasgd-a reaches higher accuracy sooner than asgd "])
    out += table(rows + placebo + speed, ["claim", "cell", "estimate [95% interval] (seeds)", "verdict"])
    out += [f"Final accuracy: {summary(rows)}. Convergence (temporal efficiency of the central model's test "
            f"accuracy over virtual time, E > 1: higher accuracy sooner): {summary(speed)}. The placebo (dcasgd-c "
            f"with lam = 0, asgd bit for bit, selected apart): {summary(placebo)}: what selection noise alone "
            "produces.", ""]
    out += ["## RQ2: how does DC-ASGD compare with synchronous SGD and plain ASGD?", ""]
    rows = claim_rows(report, "difference", ["dcasgd-a more accurate than ssgd", "dcasgd-c more accurate than ssgd",
                                             "asgd more accurate than ssgd"])
    out += table(rows, ["claim", "cell", "estimate [95% interval] (seeds)", "verdict"])
    out += [f"Against SSGD: {summary(rows)} (against ASGD: RQ1).", ""]
    out += ["## RQ3: how close does DC-ASGD come to sequential SGD?", ""]
    rows = []
    by_cell = lambda kv: (kv[0][0], int(cell(kv[0][1]).get("workers", 0)))   # noqa: E731
    for (algo, where), acc in sorted(seeds.items(), key=by_cell):
        sgd = next((v for (a, _), v in seeds.items() if a == "sgd"), None)
        if algo in ("dcasgd-c", "dcasgd-a", "asgd") and sgd:
            d = difference(acc, sgd)
            rows.append([f"{algo} - sgd", shown(where), iv(d), within(d)])
    closure = claim_rows(report, "gap closure", ["dcasgd-a closes", "dcasgd-c closes"])
    out += table(rows, ["difference", "cell", "estimate [95% interval] (seeds)",
                        f"as accurate as sgd (within {MARGIN:g})"])
    out += table(closure, ["claim", "cell", "closure [95% bootstrap interval] (seeds)", "verdict"])
    out += [f"As accurate as sequential SGD within half a point: {summary(rows)}. Closure of the ASGD-SGD gap: "
            f"{summary(closure)}.", ""]
    out += ["## RQ4: how well does the Hessian approximation model the effect of the delay?", ""]
    out += rq4_dc(probes)
    return out


def wilson(k: int, n: int, z: float = 1.959964) -> tuple[float, float]:
    if n == 0:
        return math.nan, math.nan
    p = k / n
    c = (p + z * z / (2 * n)) / (1 + z * z / n)
    h = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / (1 + z * z / n)
    return c - h, c + h


def rq4_dc(probes: dict | None) -> list[str]:
    """From the probes' report (docs/results/probes_dc_fashion/report.json): per M, over the probes with
    tau >= 1, the share on which the correction brings the stale gradient closer to the fresh one (a
    Wilson interval over probes), and the median relative error it leaves against full H's."""
    if probes is None:
        return ["Not measured here (no probes report given: --probes).", ""]
    rows = []
    for run in probes["probes"]["compensation"]:
        bins = [b for b in run["bins"] if b["tau"][0] >= 1 and b["n"]]
        n = sum(b["n"] for b in bins)
        for key, name in (("dc_a", "DC-ASGD-a"), ("dc_c", "DC-ASGD-c"), ("full_h", "full H")):
            k = round(sum(b[f"better_{key}"] * b["n"] for b in bins))
            lo, hi = wilson(k, n)
            cut = [1 - b[f"err_{key}"] / b["err_g"] for b in bins if b["err_g"] > 0]
            rows.append([name, f"workers={run['workers']}", f"{k / n:.3f} [{lo:.3f}, {hi:.3f}] (n={n} probes)",
                         f"{min(cut):.1%} to {max(cut):.1%}",
                         verdict(lo, hi, 0.5)])
    ranges = {}
    for run in probes["probes"]["compensation"]:
        for key in ("dc_a", "dc_c", "full_h"):
            ranges.setdefault(key, []).extend(1 - b[f"err_{key}"] / b["err_g"] for b in run["bins"]
                                              if b["tau"][0] >= 1 and b["n"] and b["err_g"] > 0)
    r = {k: f"{min(v):.1%} to {max(v):.1%}" for k, v in ranges.items()}
    return table(rows, ["correction", "cell", "share of probes it improves [95% Wilson interval]",
                        "error it removes (median per tau bin, range over bins)", "improves more often than not"]) + [
        "One asgd run per M (seed 0), its stale gradients corrected after the fact on the same mini-batch "
        "(docs/results/probes_dc.md, `stalegrad grid experiments/probes_dc_fashion.toml`). The interval is over "
        "probes of one run, not over seeds. Over every M and tau bin, DC-ASGD-a's correction removes "
        f"{r['dc_a']} of the stale gradient's error, DC-ASGD-c's (lam 0.04) {r['dc_c']}, one exact Hessian-vector "
        f"product (full H) {r['full_h']}. Verdict on RQ4, from those figures: the `g*g` approximation moves the "
        "stale gradient the right way on most probes (holds, one seed), but models a small part of the delay's "
        "effect where the first-order term with the true Hessian models a large one.", ""]


def agn(report: dict, workers_report: dict | None = None) -> list[str]:
    seeds = per_seed(report)
    out = ["## RQ1: how does normalising the accumulated gradient affect convergence and stability?", ""]
    rows = claim_rows(report, "difference", ["agn more accurate than downpour"])
    speed = claim_rows(report, "temporal efficiency", ["agn reaches higher accuracy sooner than downpour"])
    out += table(rows + speed, ["claim", "cell", "estimate [95% interval] (seeds)", "verdict"])
    div = {}
    for g in report["groups"]:
        if g["algo"] in ("agn", "downpour"):
            d = div.setdefault(g["algo"], [0, 0])
            d[0] += sum(1 for r in g["runs"] if r.get("diverged"))
            d[1] += len(g["runs"])
    out += [f"Against DOWNPOUR (the same commit, not divided by the window): {summary(rows)}; sooner: "
            f"{summary(speed)}. Diverged runs over the whole grid: "
            + ", ".join(f"{a} {k} of {n}" for a, (k, n) in div.items()) + ".", ""]
    out += ["## RQ2: does it reduce the harm of staleness at high concurrency?", ""]
    rows = []
    cells = {(algo, cell(where).get("workers"), cell(where).get("window")): acc for (algo, where), acc in seeds.items()}
    ns = sorted({n for (_, n, _) in cells if n is not None}, key=int)
    windows = sorted({w for (_, _, w) in cells if w is not None}, key=int)
    lo_n, hi_n = (ns[0], ns[-1]) if ns else (None, None)
    for w in windows if len(ns) > 1 else []:
        drop = {}
        for algo in ("agn", "downpour", "dynsgd", "aeasgd"):
            a, b = cells.get((algo, lo_n, w)), cells.get((algo, hi_n, w))
            if a and b:
                drop[algo] = {s: b[s] - a[s] for s in set(a) & set(b)}
        for other in ("downpour", "dynsgd", "aeasgd"):
            if "agn" in drop and other in drop:
                d = difference(drop["agn"], drop[other])
                rows.append([f"agn's change from n = {lo_n} to {hi_n} minus {other}'s", f"window={w}", iv(d),
                             verdict(d["lo"], d["hi"], 0.0)])
        if "agn" in drop:
            d = t_interval(list(drop["agn"].values()))
            rows.append([f"agn's change from n = {lo_n} to {hi_n}", f"window={w}", iv(d),
                         f"{verdict(d['lo'], d['hi'], 0.0)} (claim: it improves)"])
    out += table(rows, ["figure", "cell", "estimate [95% interval] (seeds)", "verdict (claim: agn suffers less)"])
    out += [f"{summary(rows)}. The changes pair the runs of one reporting seed at n = {lo_n} and n = {hi_n} "
            "(independent runs; the pairing only orders them).", ""]
    out += ["## RQ3: how does it compare with (A)EASGD and DynSGD?", ""]
    rows = claim_rows(report, "difference", ["agn more accurate than aeasgd", "agn more accurate than dynsgd"])
    speed = claim_rows(report, "temporal efficiency", ["agn reaches higher accuracy sooner than aeasgd",
                                                       "agn reaches higher accuracy sooner than dynsgd"])
    out += table(rows + speed, ["claim", "cell", "estimate [95% interval] (seeds)", "verdict"])
    out += [f"Final accuracy: {summary(rows)}; convergence (central model, virtual time): {summary(speed)}.", ""]
    if workers_report is not None:
        te = claim_rows(workers_report, "temporal efficiency", ["agn reaches higher accuracy sooner than aeasgd",
                                                                "agn reaches higher accuracy sooner than dynsgd"])
        out += ["The paper's variant (the workers' mini-batch training accuracy in 5 s windows of wall time; "
                "`stalegrad report --variant workers`, the same selection):", ""]
        out += table(te, ["claim", "cell", "estimate [95% interval] (seeds)", "verdict"])
        out += [f"{summary(te)}. The wall time is the simulator's own (each algorithm's compute on this machine, "
                "no network), not a cluster's: AGN and AEASGD ship the same model per commit, so on a cluster "
                "their communication differs only by when they commit; the paper measured up to 1.9x between "
                "them in wall time, which a simulator with equal throughput cannot show. Inconclusive for the "
                "paper's exact figure.", ""]
    else:
        out += ["The paper's temporal efficiency (workers' training accuracy over wall time) was not computed "
                "(no --workers-report): inconclusive here.", ""]
    out += ["## RQ4: does it align the workers' update directions better?", "",
            "Not measured by this grid. docs/results/probes_agn.md measured it on one seed per cell (Fashion-MNIST, "
            "round-robin delays): no interval, so inconclusive by this document's rule.", ""]
    out += ["## RQ5: does it keep its performance across windows and worker counts?", ""]
    rows = []
    first = (lo_n, windows[0] if windows else None)
    base = cells.get(("agn", *first))
    for (algo, n, w), acc in sorted(cells.items(), key=lambda kv: (kv[0][0], int(kv[0][1] or 0), int(kv[0][2] or 0))):
        if algo == "agn" and base and (n, w) != first:
            d = difference(acc, base)
            rows.append([f"agn n = {n}, window {w} minus agn n = {first[0]}, window {first[1]}", f"workers={n} window={w}",
                         iv(d), within(d)])
    out += table(rows, ["difference", "cell", "estimate [95% interval] (seeds)", f"as accurate (within {MARGIN:g})"])
    out += [f"{summary(rows)}.", ""]
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("paper", choices=("dcasgd", "agn"))
    ap.add_argument("grid_dir", type=Path)
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--probes", type=Path, default=None, help="dcasgd: a probes report.json for RQ4")
    ap.add_argument("--workers-report", type=Path, default=None,
                    help="agn: the report.json of `stalegrad report --variant workers` on the same runs")
    ap.add_argument("--title", default=None)
    args = ap.parse_args(argv)
    report = load(args.grid_dir)
    probes = json.loads(args.probes.read_text()) if args.probes else None
    p = report["protocol"]
    lines = [f"# {args.title or args.paper}", "",
             f"Selection: {p['statistic']} {', '.join(map(str, p['select_seeds']))}; test accuracy of the selected "
             f"settings on seeds {', '.join(map(str, p['report_seeds']))}; {report['compared']['runs']} runs.", "",
             "### Selected settings", "", *selections(report)]
    if p["edge_warnings"]:
        lines += [f"**Grid edges** ({len(p['edge_warnings'])}): a selected value at the edge of its grid; the "
                  "optimum may lie outside it, and verdicts in those cells are provisional.", ""]
    workers = json.loads(args.workers_report.read_text()) if args.workers_report else None
    lines += dcasgd(report, probes) if args.paper == "dcasgd" else agn(report, workers)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text("\n".join(lines))
    print(f"decisive.py: {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
