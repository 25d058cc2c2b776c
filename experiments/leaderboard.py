"""The leaderboard of issue 20, from its protocol grids:
``python experiments/leaderboard.py runs/leaderboard --out docs/results/leaderboard.md``.

ROOT holds the fourteen ``stalegrad grid`` directories of ``experiments/leaderboard.sh`` (or any grids with a
``[protocol]`` table). A grid is *finished* when grid.json has no cell pending, running, interrupted or
waiting for stage 2 and ``report/report.json`` holds a protocol selected on validation accuracy; the
others are skipped and named on the page. From each finished grid's report this script takes, per
algorithm and cell, the selected setting (the report's selection: mean final validation accuracy over
the selection seeds), its final test accuracy and its time to target on each reporting seed, and puts
the grids side by side:

- **Cells.** Gradient rules: (data set, delay model, M); sgd runs with one worker and stands in every M
  of its data set and delay model as the sequential reference. Commit rules: (data set, window, n). Each
  family and data set gets its own section, "who wins" table and plot row.
- **Final test accuracy**: the mean over the reporting seeds with its 95% t interval
  (``stalegrad.study.stats.t_interval``). A diverged run (no finite accuracy) makes the interval NaN: shown,
  never averaged away.
- **Time to target**: the simulator's virtual seconds at which the central model's test accuracy first
  reaches the grid's ``[report] target`` (interpolated linearly between the two evaluations around it:
  ``stalegrad.study.report_curves.time_to_target``, the per-run figure of report.json). The mean and its t interval
  only when every reporting seed reached the target; otherwise "k of n reached" and the times of those
  that did, no mean.
- **Pairing.** A reporting seed fixes the initial weights, the shards, the mini-batch order and the
  delay draws of every grid (the same data set, model, batch, partition, epochs and validation split:
  checked per cell, else the cell is not paired), so a difference between two methods is taken seed by
  seed, across grids, and its t interval is over the per-seed differences.
- **Who wins.** The best method of a cell: the highest mean test accuracy; "not separable" lists the
  methods whose paired difference from it has an interval that holds 0. The 2017 method (the better of
  dcasgd-c and dcasgd-a; agn) and the best later method are chosen by the *validation* score, so the
  test figures that compare them are not the ones that chose them; the claim "the 2017 method is more
  accurate" gets ``stalegrad.study.stats.verdict``: holds (interval above 0), does not hold (below 0),
  inconclusive (holds 0). The same against each baseline of its own paper. No correction for
  multiple comparisons.
- **Grid edge**: a selected rate at the smallest or largest value of the method's rate list (the
  report's ``edges``): the optimum may lie outside, so that row is provisional.
"""
from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path

import shared
from shared import fmt, table

from stalegrad.study.stats import HOLDS, t_interval, verdict

GRIDS = ("grad_asgd", "grad_sgd", "grad_dana", "grad_momentum", "grad_gap", "grad_sasgd", "commit_agn", "commit_outer",
         "commit_downpour", "commit_agn_fashion", "commit_outer_fashion", "commit_downpour_fashion",
         "time_rules", "time_rules_ringmaster")   # (the last two: issue 41, added, not yet run)
DATASETS = {"mnist": "MNIST", "fashion-mnist": "Fashion-MNIST", "cifar10": "CIFAR-10", "digits": "digits"}
# A method whose rate range moved to a grid of its own (the protocol's no-edge rule): only that grid's rows
# count; its first sweep stays on disk and is named on the page.
OWNER = {"gap-aware": "grad_gap"}
ERA = {"sgd": "baseline", "ssgd": "baseline", "asgd": "baseline", "asgd-momentum": "baseline", "dcasgd-c": "2017", "dcasgd-a": "2017",
       "sasgd": "later", "gap-aware": "later", "dana-zero": "later", "dana-dc": "later",
       "aeasgd": "baseline", "dynsgd": "baseline", "downpour": "baseline", "agn": "2017",
       "async-local-sgd": "later", "diloco": "later", "ringmaster": "later", "rennala": "later", "m-ssgd": "later"}
PAPER_BASELINES = {"dcasgd-c": ("sgd", "ssgd", "asgd"), "dcasgd-a": ("sgd", "ssgd", "asgd"),
                   "agn": ("aeasgd", "dynsgd", "downpour")}
# A staleness treatment against the same update without it: what the treatment itself adds (for DC-ASGD:
# issue 18's RQ1, each variant on its own).
CONTROLS = {"dcasgd-c": ("asgd",), "dcasgd-a": ("asgd",), "sasgd": ("asgd",), "gap-aware": ("asgd",),
            "dana-zero": ("asgd-momentum",),
            "dana-dc": ("asgd-momentum", "dana-zero"),
            # dropping stale gradients (issue 41): ringmaster against asgd, rennala and m-ssgd against ssgd
            "ringmaster": ("asgd",), "rennala": ("ssgd",), "m-ssgd": ("ssgd",)}
COMMIT = ("agn", "aeasgd", "dynsgd", "downpour", "easgd", "async-local-sgd", "diloco")
SHARED = ("dataset", "model", "epochs", "batch_size", "partition", "val_split", "val_split_seed", "lr_milestones",
          "lr_gamma", "init", "local_opt", "hidden", "train_samples", "test_samples", "step_time", "eval_every")
UNFINISHED = ("pending", "running", "interrupted", "stage 2")


def fail(msg: str):
    sys.exit(f"leaderboard.py: {msg}")


# ---------------------------------------------------------------- reading the grids

def unfinished(grid_dir: Path) -> str | None:
    """Why a grid directory cannot be read yet (None: it is finished)."""
    try:
        counts = json.loads((grid_dir / "grid.json").read_text()).get("counts", {})
    except (OSError, ValueError) as e:
        return f"no readable grid.json ({e.__class__.__name__})"
    left = {k: counts[k] for k in UNFINISHED if counts.get(k)}
    if left:
        named = {"stage 2": "cells for stage 2"}
        return "still running: " + ", ".join(f"{n} {named.get(k, k)}" for k, n in left.items())
    try:
        report = json.loads((grid_dir / "report" / "report.json").read_text())
    except (OSError, ValueError):
        return "no report/report.json (the grid writes it at its end)"
    if (report.get("protocol") or {}).get("selected_on") != "validation":
        return "its report has no protocol selected on validation accuracy"
    return None


def load(root: Path) -> tuple[dict, list]:
    """{grid name: report} of the finished grids under ``root``, and [(name, why)] of the others."""
    if not root.is_dir():
        fail(f"{root}: no such directory")
    dirs = [root] if (root / "grid.json").exists() else sorted(p for p in root.iterdir() if (p / "grid.json").exists())
    names = {p.name for p in dirs}
    skipped = [] if dirs == [root] else [(n, "not run (no directory)") for n in GRIDS if n not in names]
    reports = {}
    for d in dirs:
        why = unfinished(d)
        if why:
            skipped.append((d.name, why))
        else:
            reports[d.name] = json.loads((d / "report" / "report.json").read_text())
    skipped.sort(key=lambda nw: (GRIDS.index(nw[0]) if nw[0] in GRIDS else len(GRIDS), nw[0]))
    if not reports:
        fail(f"{root}: no finished grid ({'; '.join(f'{n}: {w}' for n, w in skipped) or 'no grid.json below it'})")
    return reports, skipped


def num(x) -> float:
    return float(x) if isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x) else math.nan


def entries(grid: str, report: dict) -> list[dict]:
    """One row per selection: the method, its cell, the selected setting and its per-seed figures."""
    p = report["protocol"]
    groups = {g["label"]: g for g in report["groups"]}
    out = []
    for s in p["selections"]:
        runs = [r for r in groups[s["group"]]["runs"] if r["seed"] in p["report_seeds"]] if s.get("group") else []
        out.append({"algo": s["algo"], "grid": grid, "cell": s["cell"], "tuned": s["tuned"], "score": num(s["score"]),
                    "tried": len(s["scores"]), "edges": s["edges"],
                    "report_seeds": list(p["report_seeds"]), "target": report["target"]["test_acc"],
                    "acc": {r["seed"]: num(r["final_test_acc"]) for r in runs},
                    "ttt": {r["seed"]: (r.get("time_to_target") or {}).get("virtual_s") for r in runs}})
    return out


def rows_of(reports: dict) -> list[dict]:
    """Every selection of every finished grid, but a method's rows only from its OWNER grid, if it has one."""
    return [e for name, r in reports.items() for e in entries(name, r) if OWNER.get(e["algo"], name) == name]


def family(e: dict) -> str:
    return "commit" if e["algo"] in COMMIT or "window" in e["cell"] else "gradient"


def dataset_name(ds) -> str:
    return DATASETS.get(ds, str(ds))


def section_order(fam: str, ds) -> tuple:
    """Gradient before commit; within a family MNIST, then Fashion-MNIST, then the rest by name."""
    return (fam != "gradient", list(DATASETS).index(ds) if ds in DATASETS else len(DATASETS), str(ds))


def cells(rows: list[dict]) -> dict:
    """{(family, data set, panel, x): [rows]}: panel the delay model (gradient) or the window (commit), x = M
    or n. A one-worker run (sgd) joins every M of its data set and delay model."""
    out: dict = {}
    for e in rows:
        f = family(e)
        panel = e["cell"].get("window") if f == "commit" else e["cell"].get("delay")
        if f == "gradient" and e["cell"].get("workers") == 1:
            continue
        out.setdefault((f, e["cell"].get("dataset"), panel, e["cell"].get("workers")), []).append(e)
    for e in rows:
        if family(e) == "gradient" and e["cell"].get("workers") == 1:
            for (f, ds, panel, x), es in out.items():
                if f == "gradient" and (ds, panel) == (e["cell"].get("dataset"), e["cell"].get("delay")):
                    es.append(e)
    return dict(sorted(out.items(), key=lambda kv: (*section_order(kv[0][0], kv[0][1]), str(kv[0][2]),
                                                    kv[0][3] or 0)))


# ---------------------------------------------------------------- the figures of a cell

def accuracy(e: dict) -> dict:
    return t_interval([e["acc"][s] for s in sorted(e["acc"])])


def difference(a: dict, b: dict) -> dict:
    """a - b paired by reporting seed (the seeds both ran), with its t interval."""
    return shared.difference(a["acc"], b["acc"])


def mismatch(es: list[dict]) -> list[str]:
    """The settings in which the cell's methods differ though a seed should mean the same run for all."""
    return [k for k in SHARED if len({json.dumps(e["cell"].get(k)) for e in es if k in e["cell"]}) > 1]


def iv(f: dict, spec: str = ".4f") -> str:
    """``shared.iv``, saying so where a diverged run leaves no mean or no interval."""
    if not math.isfinite(f["mean"]):
        return f"no mean (n={f['n']})"
    if not (math.isfinite(f["lo"]) and math.isfinite(f["hi"])):
        return f"{fmt(f['mean'], spec)} (no interval, n={f['n']})"
    return shared.iv(f, spec)


def acc_text(e: dict) -> str:
    bad = [s for s, a in sorted(e["acc"].items()) if not math.isfinite(a)]
    lost = [s for s in e["report_seeds"] if s not in e["acc"]]
    text = iv(accuracy(e))
    if bad:
        text += f"; diverged on seed {', '.join(map(str, bad))}"
    if lost:
        text += f"; no run of seed {', '.join(map(str, lost))}"
    return text


def ttt_text(e: dict) -> str:
    """Time to target: mean and t interval when every seed reached it, else how many did and their times."""
    times = [e["ttt"][s] for s in sorted(e["ttt"])]
    reached = [t for t in times if t is not None]
    if not times:
        return "no run"
    if len(reached) == len(times):
        return iv(t_interval(reached), ".0f")
    shown = f" ({', '.join(format(t, '.0f') for t in sorted(reached))})" if reached else ""
    return f"{len(reached)} of {len(times)} reached{shown}"


def edge_text(e: dict) -> str:
    """``**edge**: lr 0.3, the largest of 0.01-0.3`` for each tuned value at the edge of its list, else ``-``."""
    return "; ".join(f"**edge**: {x['axis']} {x['value']:g}, the {x['side']} of {x['values'][0]:g}-{x['values'][-1]:g}"
                     for x in e["edges"]) or "-"


def tuned(e: dict) -> str:
    parts = (f"{k} {v:g}" if isinstance(v, (int, float)) else f"{k} {v}" for k, v in e["tuned"].items())
    return ", ".join(parts) or "none"


def ranked(es: list[dict]) -> list[dict]:
    key = lambda e: accuracy(e)["mean"]   # noqa: E731
    return sorted(es, key=lambda e: (not math.isfinite(key(e)), -key(e) if math.isfinite(key(e)) else 0, e["algo"]))


def cell_table(es: list[dict]) -> list[str]:
    rows = []
    for i, e in enumerate(ranked(es), 1):
        m = f"{e['algo']} (M = 1)" if e["cell"].get("workers") == 1 else e["algo"]
        rows.append([str(i), m, ERA.get(e["algo"], "-"), e["grid"], f"{tuned(e)} (of {e['tried']})",
                     acc_text(e), ttt_text(e), edge_text(e)])
    target = sorted({e["target"] for e in es})
    return table(rows, ["#", "method", "era", "grid", "selected (values tried)", "final test acc [95% t] (n)",
                        f"virtual s to test acc {'/'.join(f'{t:g}' for t in target)} [95% t] (n)", "grid edge"])


def by_validation(es: list[dict], era: str) -> dict | None:
    """The method of ``era`` with the highest validation score in the cell (the protocol's statistic)."""
    cands = [e for e in es if ERA.get(e["algo"]) == era and math.isfinite(e["score"])]
    return max(cands, key=lambda e: e["score"], default=None)


def claim(where: str, a: dict, b: dict) -> list[str]:
    """The row of the claim "a is more accurate than b": the paired difference and its verdict."""
    d = difference(a, b)
    return [where, f"{a['algo']} more accurate than {b['algo']}",
            iv(d) + f", seeds {', '.join(map(str, d['seeds']))}", verdict(d["lo"], d["hi"], 0.0)]


def controlled(where: str, es: list[dict]) -> list[list[str]]:
    """Each rule against its CONTROLS in the cell (the same update without the staleness treatment)."""
    by = {e["algo"]: e for e in es}
    return [claim(where, by[a], by[c]) for a in CONTROLS if a in by for c in CONTROLS[a] if c in by]


def who_wins(key: tuple, es: list[dict]) -> tuple[list[str], list[list[str]], list[list[str]]]:
    """One cell: (the winner's row, the 2017 method against the best later one, against its paper's baselines)."""
    where = cell_name(key)
    bad = mismatch(es)
    if bad:
        return [where, f"not paired: the methods differ in {', '.join(bad)}", "-", "-"], [], []
    order = [e for e in ranked(es) if math.isfinite(accuracy(e)["mean"])]
    if not order:
        return [where, "no finite accuracy", "-", "-"], [], []
    best = order[0]
    tied = []
    for e in order[1:]:
        d = difference(best, e)
        if verdict(d["lo"], d["hi"], 0.0) != HOLDS:
            tied.append(e["algo"])
    old, new = by_validation(es, "2017"), by_validation(es, "later")
    later = [claim(where, old, new)] if old and new else []
    papers = [claim(where, old, e) for b in PAPER_BASELINES.get(old["algo"], ()) for e in es
              if e["algo"] == b] if old else []
    return ([where, f"{best['algo']} {fmt(accuracy(best)['mean'])}", ", ".join(tied) or "none",
             f"{old['algo'] if old else '-'} vs {new['algo'] if new else '-'}"], later, papers)


def cell_name(key: tuple) -> str:
    """The cell within its section (the section names the family and the data set)."""
    f, _, panel, x = key
    return f"{panel}, M = {x}" if f == "gradient" else f"window {panel}, n = {x}"


def tally(rows: list[list[str]]) -> str:
    return shared.tally([r[-1] for r in rows])


# ---------------------------------------------------------------- the plot

def plot(by_cell: dict, path: Path) -> bool:
    """Test accuracy against M (gradient, a panel per delay model) and n (commit, a panel per window), one
    line per method, the 95% t interval as error bars; sgd (M = 1) a dashed line across its panel."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    panels = sorted({(f, ds, p) for f, ds, p, _ in by_cell}, key=lambda k: (*section_order(k[0], k[1]), str(k[2])))
    fams = list(dict.fromkeys((f, ds) for f, ds, _ in panels))   # one row of panels per family and data set
    ncols = max(sum(1 for f, ds, _ in panels if (f, ds) == fam) for fam in fams)
    fig, axes = plt.subplots(len(fams), ncols, figsize=(6 * ncols, 4.5 * len(fams)), squeeze=False)
    for ax in axes.flat:
        ax.set_visible(False)
    for (fam, ds, panel) in panels:
        ax = axes[fams.index((fam, ds))][[p for f, d, p in panels if (f, d) == (fam, ds)].index(panel)]
        ax.set_visible(True)
        lines: dict = {}
        for (f, d, p, x), es in by_cell.items():
            if (f, d, p) == (fam, ds, panel):
                for e in es:
                    lines.setdefault(e["algo"], {})[x if e["cell"].get("workers") != 1 else 1] = accuracy(e)
        xs_all = sorted({x for (f, d, p, x) in by_cell if (f, d, p) == (fam, ds, panel)})
        for i, (algo, pts) in enumerate(sorted(lines.items())):
            style = {"2017": "-", "later": "--", "baseline": ":"}.get(ERA.get(algo), "-")
            if set(pts) == {1}:
                ax.axhline(pts[1]["mean"], color="k", ls="--", lw=1, label=f"{algo} (M = 1)")
                continue
            xs = sorted(x for x in pts if x != 1)
            shift = 2 ** (0.04 * (i - len(lines) / 2))   # spread the error bars a little
            ys = [pts[x]["mean"] for x in xs]
            err = [[pts[x]["mean"] - pts[x]["lo"] if math.isfinite(pts[x]["lo"]) else 0 for x in xs],
                   [pts[x]["hi"] - pts[x]["mean"] if math.isfinite(pts[x]["hi"]) else 0 for x in xs]]
            ax.errorbar([x * shift for x in xs], ys, yerr=err, ls=style, marker="o", ms=4, capsize=3, label=algo)
        ax.set_xscale("log", base=2)
        ax.minorticks_off()
        ax.set_xticks(xs_all, [str(x) for x in xs_all])
        ax.set_xlabel("M (workers)" if fam == "gradient" else "n (workers)")
        ax.set_ylabel("final test accuracy (reporting seeds)")
        ax.set_title(f"{dataset_name(ds)}: " + (f"gradient rules, delay {panel}" if fam == "gradient"
                                                 else f"commit rules, window {panel}"))
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return True


# ---------------------------------------------------------------- the page

def page(reports: dict, skipped: list, plot_name: str | None, notes: list[str] | None = None) -> list[str]:
    rows = rows_of(reports)
    by_cell = cells(rows)
    runs = sum(r["compared"]["runs"] for r in reports.values())
    by_seeds: dict = {}
    for n, r in reports.items():
        by_seeds.setdefault(", ".join(map(str, r["protocol"]["report_seeds"])), []).append(n)
    seeds = next(iter(by_seeds)) if len(by_seeds) == 1 else "; ".join(
        f"{s} in {', '.join(f'`{n}`' for n in ns)}" for s, ns in by_seeds.items())
    sel = sorted({s for r in reports.values() for s in r["protocol"]["select_seeds"]})
    tried = {}
    for e in rows:
        tried.setdefault(e["algo"], set()).add(e["tried"])
    counts = ", ".join(f"`{n}` ({r['compared']['runs']})" for n, r in reports.items())
    out = ["# Leaderboard: every rule, tuned alike (issue 20)", "",
           "```sh", "sh experiments/leaderboard.sh     # the fourteen grids, then this page:",
           "python experiments/leaderboard.py runs/leaderboard --out docs/results/leaderboard.md \\", "  --notes experiments/leaderboard_cuts.md", "```", "",
           f"{len(reports)} grid(s), {runs} runs: {counts}."]
    if skipped:
        out += ["", "**Not included** (unfinished): " + "; ".join(f"`{n}`: {w}" for n, w in skipped) + "."]
    out += ["", f"Protocol: each method's rate selected per cell on the mean final validation accuracy of seed(s) "
            f"{', '.join(map(str, sel))}; test figures of the selected rate on reporting seeds "
            f"{seeds}. Equal tuning effort, values tried per method: "
            + ", ".join(f"{a} {'/'.join(map(str, sorted(v)))}" for a, v in tried.items()) + ".",
            "", "Intervals: 95% t intervals over the reporting seeds (`stalegrad.study.stats.t_interval`), "
            "mean ± t(0.975, n−1)·s/√n; a difference between two methods is paired by seed across grids (a seed "
            "fixes the initial weights, shards, mini-batch order and delay draws of every grid; the cells' data set, "
            "model, batch, epochs and split are checked equal) and its interval is over the per-seed differences. "
            "Verdicts (`stalegrad.study.stats.verdict`): *holds* when the whole interval lies above 0, *does not hold* when "
            "below, *inconclusive* when it holds 0. No correction for multiple comparisons.", "",
            "Time to target: the virtual seconds (the simulator's clock) at which the central model's test accuracy "
            "first reaches the grid's `[report] target`, interpolated between the two evaluations around it (one "
            "evaluation an epoch); a mean only when every reporting seed reached it, else \"k of n reached\" and "
            "their times. Grid edge: the selected rate is the smallest or largest of the method's list (provisional).",
            *[f"`{a}` is taken from `{g}` only (its rate range moved there: see that grid file); its first sweep "
              f"in another grid is left out." for a, g in OWNER.items() if g in reports],
            "", "## What was cut", "", *(notes or ["(not given: `--notes FILE`)"]), ""]
    if plot_name:
        out += [f"![final test accuracy against M and n]({plot_name})", ""]
    for fam, ds in dict.fromkeys(k[:2] for k in by_cell):
        keys = [k for k in by_cell if k[:2] == (fam, ds)]
        out += [f"## {'Gradient' if fam == 'gradient' else 'Commit'} rules, {dataset_name(ds)}", ""]
        wins, later, papers, controls = [], [], [], []
        for k in keys:
            out += [f"### {cell_name(k)}", "", *cell_table(by_cell[k])]
            w, lt, pp = who_wins(k, by_cell[k])
            wins.append(w)
            later += lt
            papers += pp
            controls += [] if mismatch(by_cell[k]) else controlled(cell_name(k), by_cell[k])
        out += ["### Who wins", "", *table(wins, ["cell", "best (mean test acc)", "not separable from it (paired "
                                                  "interval holds 0)", "2017 vs later (chosen on validation)"])]
        out += ["2017 method against the best later method (both chosen by validation score in the cell):", "",
                *table(later, ["cell", "claim", "difference [95% t] (n), seeds", "verdict"]),
                f"Summary: {tally(later)}.", "", "2017 method against its own paper's baselines:", "",
                *table(papers, ["cell", "claim", "difference [95% t] (n), seeds", "verdict"]),
                f"Summary: {tally(papers)}.", ""]
        if controls:
            out += ["Each staleness treatment against the same update without it (both DC-ASGD variants, sasgd, "
                    "gap-aware, ringmaster: asgd; DANA: asgd with the same server momentum, and DANA-DC also against "
                    "DANA-Zero; rennala, m-ssgd: ssgd):", "",
                    *table(controls, ["cell", "claim", "difference [95% t] (n), seeds", "verdict"]),
                    f"Summary: {tally(controls)}.", ""]
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("root", type=Path, help="the directory of the grids (runs/leaderboard), or one grid")
    ap.add_argument("--out", type=Path, required=True, help="the page (its plot: the same name, .png)")
    ap.add_argument("--no-plot", action="store_true")
    ap.add_argument("--notes", type=Path, help="markdown for the page's 'What was cut' section")
    args = ap.parse_args(argv)
    reports, skipped = load(args.root)
    png = args.out.with_suffix(".png")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    try:
        notes = args.notes.read_text().splitlines() if args.notes else None
    except OSError as e:
        fail(f"--notes {args.notes}: {e.strerror}")
    lines = page(reports, skipped, None if args.no_plot else png.name, notes)
    if not args.no_plot:
        plot(cells(rows_of(reports)), png)
    args.out.write_text("\n".join(lines) + "\n")
    for n, why in skipped:
        print(f"leaderboard.py: skipped {n}: {why}", file=sys.stderr)
    print(f"leaderboard.py: {args.out}" + ("" if args.no_plot else f", {png}"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
