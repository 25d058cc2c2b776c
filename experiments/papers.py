"""The papers' own claims, checked on a grid's runs: ``python experiments/papers.py dcasgd|agn GRID_DIR --out FILE.md``.

dcasgd: Zheng et al. (2017) claim that DC-ASGD closes most of the gap between ASGD and sequential SGD
and beats SSGD. For each delay model and M, this prints every algorithm's final test accuracy (mean
+- std over the reporting seeds) and the gap closure ``(acc_DC - acc_ASGD) / (acc_SGD - acc_ASGD)``,
under two learning-rate rules applied to every algorithm alike:

- *tuned*: each (algorithm, M, delay) at its own selected learning rate;
- *sgd's*: every algorithm at sequential SGD's selected rate, the paper's protocol (DC-ASGD was run
  with the schedule tuned for sequential SGD).

The closure is computed per seed (the runs of one seed share the data order, the shards and the
initial weights) and reported as mean +- std over seeds.

agn: Hermans et al. (2017) claim that AGN is more accurate than AEASGD and more stable than DOWNPOUR
at high worker counts, and that its temporal efficiency against AEASGD is above 1 in most cells of the
n x window grid. This prints per cell (n, window, delay), each algorithm at its own selected rate, the
final accuracies and AGN's temporal efficiency against AEASGD, both variants (``stalegrad report``:
the central model's test accuracy over virtual time; the workers' training accuracy over wall time in
5 s windows), and the share of cells above 1.

Selection (issue 18): the project's protocol, with its one statistic (``stalegrad/study/selection.py``).
Within each cell the learning rate whose runs on the *selection seeds* have the highest mean final
validation accuracy (``final_val_acc``; ties: the smaller rate) is chosen, and everything shown (test
accuracy, closure, temporal efficiency) comes from the chosen rate's runs on the *reporting seeds*,
which the selection never saw. The seeds are ``--select-seeds`` / ``--report-seeds``, else the grid's
[protocol] as GRID_DIR/grid.json records it. Runs without a validation accuracy (grids run without
val_split) are refused: no rate can be selected on them without the test set.

``--select-on-test`` is the superseded rule of docs/results/*/papers.md, kept to reproduce those pages:
the rate with the highest mean final TEST accuracy over every seed, reported on those same seeds, so
the accuracies at the selected rate are optimistic by the selection's noise (docs/results/archive/decisive/
supersedes them). The grids of those pages had one rate per AGN cell, so their AGN tables are the same.
"""
from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
from collections import defaultdict
from pathlib import Path

from stalegrad.errors import StalegradError, UsageError
from stalegrad.run.metrics import temporal_efficiency
from stalegrad.study.report import load_runs
from stalegrad.study.report_curves import central_curve, workers_curve
from stalegrad.run.results import json_text
from stalegrad.study.selection import seed_list, select

DC_ALGOS = ("sgd", "ssgd", "asgd", "dcasgd-c", "dcasgd-a")
AGN_ALGOS = ("agn", "aeasgd", "dynsgd", "downpour")
SUPERSEDED_BY = "docs/results/archive/decisive/"


class Refused(Exception):
    """A mistake in the input; ``main`` says it in one line on stderr and exits 2."""


def mean_std(values) -> tuple[float, float, int]:
    v = [x for x in values if isinstance(x, (int, float)) and math.isfinite(x)]
    if not v:
        return math.nan, math.nan, 0
    return statistics.fmean(v), (statistics.stdev(v) if len(v) > 1 else math.nan), len(v)


def fmt(values, digits: int = 4) -> str:
    m, s, n = mean_std(values)
    if n == 0:
        return "-"
    return f"{m:.{digits}f} ± {s:.{digits}f}" if n > 1 else f"{m:.{digits}f}"


def final_acc(run: dict) -> float:
    return run["summary"]["final_test_acc"]


def cells(runs, keys) -> dict:
    """Runs grouped by the config values ``keys`` -> {seed: run}. Two runs of one group and seed differ in
    a setting that is not among ``keys`` (lam, lam0, momentum, ...): refused, since one would silently
    stand for the other."""
    out: dict = defaultdict(dict)
    for r in runs:
        here = out[tuple(r["flat"].get(k) for k in keys)]
        if (other := here.get(r["seed"])) is not None:
            differ = sorted(k for k in {*r["flat"], *other["flat"]} if r["flat"].get(k) != other["flat"].get(k))
            raise Refused(f"{other['dir']} and {r['dir']} differ in {', '.join(differ) or 'nothing'}, which papers.py "
                          "neither selects over (only the learning rate) nor keeps apart; give it a grid that varies "
                          "no other setting in a cell, or use stalegrad report, whose --tune selects over them")
        here[r["seed"]] = r
    return out


def by_cell(runs, keys) -> dict:
    """Runs grouped by the config values ``keys`` (the cell) -> {lr: {seed: run}}: a cell's rates are
    kept apart, to be selected among, never mixed."""
    out: dict = defaultdict(dict)
    for (*cell, lr), seeds in cells(runs, (*keys, "lr")).items():
        out[tuple(cell)][lr] = seeds
    return out


def seeds_text(seeds) -> str:
    """[0, 1, 2, 5] -> "0-2, 5": the form --select-seeds takes."""
    parts: list[list[int]] = []
    for s in sorted(seeds):
        if parts and s == parts[-1][-1] + 1:
            parts[-1].append(s)
        else:
            parts.append([s])
    return ", ".join(f"{p[0]}-{p[-1]}" if len(p) > 2 else ", ".join(map(str, p)) for p in parts)


def tuned_on_test(by_lr: dict) -> float:
    """The superseded rule: the learning rate with the highest mean final test accuracy over every seed
    (diverged runs left out of the mean; ties: the smaller). Kept as it was, to reproduce the old pages."""
    def score(lr):
        m = mean_std([final_acc(r) for r in by_lr[lr].values()])[0]
        return (m if math.isfinite(m) else -1.0, -lr)
    return max(by_lr, key=score)


class Rule:
    """How a cell's learning rate is selected, and on which seeds the chosen rate's runs are reported:
    on validation (``select_seeds``, ``report_seeds``: the protocol), or on test (``on_test``). A plain
    class, not a dataclass: the tests load this file as a module that is not in sys.modules."""

    def __init__(self, select_seeds=(), report_seeds=(), on_test: bool = False):
        self.select_seeds, self.report_seeds, self.on_test = tuple(select_seeds), tuple(report_seeds), on_test

    def pick(self, by_lr: dict):
        """The selected rate of one cell ({lr: {seed: run}}), or None when no rate has a finite score."""
        if self.on_test:
            return tuned_on_test(by_lr)
        # selection.py's statistic, not a copy of it: a rate lacking a selection seed is no candidate,
        # a diverged run (no finite validation accuracy) ranks its rate below every finite one
        candidates = [{"algo": "", "setting": {"lr": lr},
                       "values": {s: r["summary"].get("final_val_acc") for s, r in seeds.items()
                                  if s in self.select_seeds}} for lr, seeds in by_lr.items()]
        chosen = select(candidates, ("lr",), list(self.select_seeds))[0]["chosen"]
        return chosen["setting"]["lr"] if chosen else None

    def reported(self, seeds: dict) -> dict:
        """The runs ({seed: run}) whose figures are shown: never those the selection saw, on validation."""
        return dict(seeds) if self.on_test else {s: r for s, r in seeds.items() if s in self.report_seeds}

    def at(self, by_lr: dict, lr):
        """(lr, its reported runs), or None when the cell lacks that rate or its reported runs."""
        runs = self.reported(by_lr.get(lr, {})) if lr is not None else {}
        return (lr, runs) if runs else None

    def over(self) -> str:
        return "seeds" if self.on_test else "the reporting seeds"

    def line(self) -> str:
        """The page's first line: which rule selected."""
        if self.on_test:
            return ("**Superseded:** the learning rate here was selected on the TEST set (the highest mean final "
                    "test accuracy over every seed, reported on the same seeds), so the accuracies at the "
                    f"selected rate are optimistic; {SUPERSEDED_BY} supersedes this page (`papers.py "
                    "--select-on-test` reproduces it).")
        return (f"Learning rate selected per cell on validation accuracy: the highest mean final_val_acc over "
                f"the selection seeds {seeds_text(self.select_seeds)} (stalegrad/study/selection.py; ties: the smaller "
                f"rate); test accuracy reported on the reporting seeds {seeds_text(self.report_seeds)} only, "
                "which the selection never saw.")

    def as_json(self) -> dict:
        if self.on_test:
            return {"on": "test", "statistic": "mean final_test_acc over every seed", "select_seeds": "every",
                    "report_seeds": "every", "superseded_by": SUPERSEDED_BY}
        return {"on": "validation", "statistic": "mean final_val_acc over the selection seeds (stalegrad/study/selection.py)",
                "select_seeds": list(self.select_seeds), "report_seeds": list(self.report_seeds)}


def gap_closure(dc: float, asgd: float, sgd: float) -> float:
    gap = sgd - asgd
    return (dc - asgd) / gap if gap > 0 else math.nan


# ---------------------------------------------------------------- DC-ASGD

def dcasgd(runs, rule: Rule) -> tuple[dict, str]:
    grid = by_cell(runs, ("algo", "workers", "delay"))     # (algo, workers, delay) -> {lr: {seed: run}}
    delays = sorted({k[2] for k in grid})
    ms = sorted({k[1] for k in grid if k[0] != "sgd"})
    result: dict = {"selection": rule.as_json(),
                    "rule": f"tuned: each cell's rate selected on {rule.as_json()['statistic']}; sgd's: sgd's "
                            "selected rate",
                    "rows": []}
    lines = []
    for delay in delays:
        sgd = grid.get(("sgd", 1, delay))
        sgd_at = rule.at(sgd, rule.pick(sgd)) if sgd else None
        if not sgd_at:
            continue
        sgd_lr, sgd_runs = sgd_at
        for lr_rule in ("tuned", "sgd's"):
            at_sgd = f" ({sgd_lr:g})" if lr_rule == "sgd's" else ""
            lines += [f"### delay {delay}, learning rate: {lr_rule}{at_sgd}", "",
                      "| M | " + " | ".join(DC_ALGOS) + " | closure dcasgd-c | closure dcasgd-a | DC-a > SSGD |",
                      "|---|" + "---|" * (len(DC_ALGOS) + 3)]
            for m in ms:
                chosen = {"sgd": sgd_at}
                for algo in DC_ALGOS[1:]:
                    by_lr = grid.get((algo, m, delay))
                    if by_lr:
                        here = rule.at(by_lr, rule.pick(by_lr) if lr_rule == "tuned" else sgd_lr)
                        if here:
                            chosen[algo] = here
                accs = {a: [final_acc(r) for r in seeds.values()] for a, (_, seeds) in chosen.items()}
                closure = {}
                for dc in ("dcasgd-c", "dcasgd-a"):
                    if dc in chosen and "asgd" in chosen:
                        seeds = set(chosen[dc][1]) & set(chosen["asgd"][1]) & set(sgd_runs)
                        closure[dc] = [gap_closure(final_acc(chosen[dc][1][s]), final_acc(chosen["asgd"][1][s]),
                                                   final_acc(sgd_runs[s])) for s in sorted(seeds)]
                beats = "-"
                if "dcasgd-a" in accs and "ssgd" in accs:
                    beats = "yes" if mean_std(accs["dcasgd-a"])[0] > mean_std(accs["ssgd"])[0] else "no"
                row = [str(m)] + [f"{fmt(accs[a])} ({chosen[a][0]:g})" if a in accs else "-" for a in DC_ALGOS]
                row += [fmt(closure.get("dcasgd-c", []), 2), fmt(closure.get("dcasgd-a", []), 2), beats]
                lines.append("| " + " | ".join(row) + " |")
                result["rows"].append({"delay": delay, "rule": lr_rule, "workers": m,
                                       "lr": {a: chosen[a][0] for a in chosen},
                                       "seeds": {a: sorted(seeds) for a, (_, seeds) in chosen.items()},
                                       "final_test_acc": {a: mean_std(v)[:2] for a, v in accs.items()},
                                       "closure": {k: mean_std(v)[:2] for k, v in closure.items()},
                                       "diverged": {a: sum(bool(r["summary"].get("diverged")) for r in seeds.values())
                                                    for a, (_, seeds) in chosen.items()}})
            lines.append("")
    head = [rule.line(), "",
            f"Final test accuracy, mean ± std over {rule.over()} (the learning rate in brackets); gap closure "
            "(acc_DC − acc_ASGD) / (acc_SGD − acc_ASGD) per seed, mean ± std; the last column compares "
            "the means of DC-ASGD-a and SSGD.", ""]
    return result, "\n".join(head + lines)


# ---------------------------------------------------------------- AGN

def agn(runs, rule: Rule) -> tuple[dict, str]:
    grid = by_cell(runs, ("algo", "workers", "window", "delay"))  # (algo, n, window, delay) -> {lr: {seed: run}}
    ns = sorted({k[1] for k in grid if k[0] == "agn"})
    windows = sorted({k[2] for k in grid if k[0] == "agn"})
    delays = sorted({k[3] for k in grid if k[0] == "agn"}, key=str)
    # the columns the grid varies: one delay and one rate per cell (the superseded pages) keep their tables
    show_delay, show_lr = len(delays) > 1, any(len(by_lr) > 1 for by_lr in grid.values())
    columns = ["n", "window"] + ["delay"] * show_delay + list(AGN_ALGOS) + ["TE central", "TE workers"]
    brackets = " (the learning rate in brackets)" if show_lr else ""
    lines = [rule.line(), "",
             f"Final test accuracy, mean ± std over {rule.over()}{brackets}; TE = AGN's temporal efficiency against "
             "AEASGD (per seed, then mean): central = test accuracy over virtual time, workers = the workers' "
             "training accuracy over wall time in 5 s windows.", "",
             "| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
    rows, above = [], {"central": [], "workers": []}
    for delay in delays:
        for n in ns:
            for w in windows:
                chosen = {}
                for a in AGN_ALGOS:
                    by_lr = grid.get((a, n, w, delay))
                    if by_lr and (here := rule.at(by_lr, rule.pick(by_lr))):
                        chosen[a] = here
                runs_of = {a: chosen[a][1] if a in chosen else {} for a in AGN_ALGOS}
                te = {}
                for variant, curve in (("central", central_curve), ("workers", workers_curve)):
                    per_seed = []
                    for s in sorted(set(runs_of["agn"]) & set(runs_of["aeasgd"])):
                        a, b = curve(runs_of["agn"][s]), curve(runs_of["aeasgd"][s])
                        if len(a[0]) > 1 and len(b[0]) > 1:
                            per_seed.append(temporal_efficiency(a, b))
                    te[variant] = per_seed
                    m = mean_std(per_seed)[0]
                    if math.isfinite(m):
                        above[variant].append(m > 1)
                accs = {a: [final_acc(r) for r in seeds.values()] for a, seeds in runs_of.items()}
                shown = [fmt(accs[a]) + (f" ({chosen[a][0]:g})" if show_lr and a in chosen else "") for a in AGN_ALGOS]
                lines.append("| " + " | ".join([str(n), str(w)] + ([str(delay)] if show_delay else []) + shown
                                               + [fmt(te["central"], 3), fmt(te["workers"], 3)]) + " |")
                rows.append({"workers": n, "window": w, "delay": delay, "lr": {a: chosen[a][0] for a in chosen},
                             "seeds": {a: sorted(s) for a, s in runs_of.items() if s},
                             "final_test_acc": {a: mean_std(v)[:2] for a, v in accs.items()},
                             "te": {k: mean_std(v)[:2] for k, v in te.items()},
                             "diverged": {a: sum(bool(r["summary"].get("diverged")) for r in s.values())
                                          for a, s in runs_of.items()}})
    share = {k: (sum(v), len(v)) for k, v in above.items()}
    lines += ["", "Cells where AGN's mean TE against AEASGD is above 1: "
              + "; ".join(f"{k}: {a} of {b}" for k, (a, b) in share.items()) + "."]
    return {"selection": rule.as_json(), "rows": rows, "te_above_1": share}, "\n".join(lines)


# ---------------------------------------------------------------- plots

def _panels(n: int, width: float):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, axes = plt.subplots(1, n, figsize=(width * n, 3.8), sharey=True, squeeze=False)
    return plt, fig, axes[0]


def _errorbar(ax, pts, label: str) -> None:
    """One line of (x, mean, std) points; an undefined std (one seed) draws no bar."""
    x, y, e = zip(*pts)
    ax.errorbar(x, y, yerr=[v if math.isfinite(v) else 0 for v in e], marker="o", capsize=3, label=label)


def _save(plt, fig, axes, path: str) -> None:
    axes[0].set_ylabel("final test accuracy")
    axes[0].legend(fontsize=8, loc="lower left")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)

def plot_dcasgd(result: dict, path: str) -> None:
    """Final test accuracy against M, one line per algorithm (mean and std over seeds), one panel per
    delay model and learning-rate rule; sequential SGD as a horizontal line."""
    rows = result["rows"]
    panels = sorted({(r["delay"], r["rule"]) for r in rows}, key=lambda k: (k[0], k[1] != "tuned"))
    plt, fig, axes = _panels(len(panels), 4.2)
    for ax, (delay, rule) in zip(axes, panels):
        here = sorted((r for r in rows if r["delay"] == delay and r["rule"] == rule), key=lambda r: r["workers"])
        ms = [r["workers"] for r in here]
        for algo in DC_ALGOS:
            pts = [(m, *r["final_test_acc"][algo]) for m, r in zip(ms, here) if algo in r["final_test_acc"]]
            if not pts:
                continue
            if algo == "sgd":
                ax.axhline(pts[0][1], color="black", ls="--", lw=1, label="sgd (1 worker)")
                continue
            _errorbar(ax, pts, algo)
        ax.set_title(f"delay {delay}, lr: {rule}", fontsize=10)
        ax.set_xscale("log", base=2)
        ax.set_xticks(ms, [str(m) for m in ms])
        ax.set_xlabel("workers M")
        ax.grid(alpha=0.3)
    _save(plt, fig, axes, path)


def plot_agn(result: dict, path: str) -> None:
    """Final test accuracy against n, one line per algorithm, one panel per window (and delay, when the
    grid has several: a line never joins two delays)."""
    rows = result["rows"]
    panels = sorted({(r["window"], r["delay"]) for r in rows}, key=lambda k: (k[0], str(k[1])))
    several = len({d for _, d in panels}) > 1
    plt, fig, axes = _panels(len(panels), 4.5)
    for ax, (w, delay) in zip(axes, panels):
        here = sorted((r for r in rows if r["window"] == w and r["delay"] == delay), key=lambda r: r["workers"])
        for algo in AGN_ALGOS:
            pts = [(r["workers"], *r["final_test_acc"][algo]) for r in here
                   if math.isfinite(r["final_test_acc"][algo][0])]
            if pts:
                _errorbar(ax, pts, algo)
        ax.set_title(f"window {w}" + (f", delay {delay}" if several else ""), fontsize=10)
        ax.set_xlabel("workers n")
        ax.grid(alpha=0.3)
    _save(plt, fig, axes, path)


# ---------------------------------------------------------------- the selection rule from the command line

def seed_option(flag: str, text: str | None) -> list[int] | None:
    """``stalegrad report``'s parser of "0,1,2" and "3-9" (``stalegrad.study.selection.seed_list``), its usage
    error made ours."""
    try:
        return seed_list(flag, text)
    except UsageError as e:
        raise Refused(str(e)) from None


def recorded_seeds(grid_dir: str) -> tuple | None:
    """(select_seeds, report_seeds) of the grid's [protocol] table, which ``stalegrad grid`` records in
    GRID_DIR/grid.json (``report.protocol``); None when there is none to read."""
    try:
        data = json.loads((Path(grid_dir) / "grid.json").read_text())
        protocol = data["report"]["protocol"]
        sel, rep = protocol.get("select_seeds"), protocol.get("report_seeds")
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return None
    return None if sel is None and rep is None else (sel, rep)


def protocol_seeds(args, runs) -> tuple[list, list]:
    """The selection and reporting seeds: the options, else the grid's protocol; given one, the other is
    every other seed of the runs (as ``stalegrad report`` reads them). Refused unless disjoint and run."""
    sel, rep = seed_option("--select-seeds", args.select_seeds), seed_option("--report-seeds", args.report_seeds)
    if sel is None and rep is None:
        recorded = recorded_seeds(args.grid_dir)
        if recorded is None:
            raise Refused(f"give --select-seeds and --report-seeds (e.g. --select-seeds 0-2 --report-seeds 3-9): "
                          f"{args.grid_dir} has no grid.json with a [protocol] to take them from")
        sel, rep = recorded
    present = sorted({r["seed"] for r in runs})
    sel = sel if sel is not None else [s for s in present if s not in rep]
    rep = rep if rep is not None else [s for s in present if s not in sel]
    if both := set(sel) & set(rep):
        raise Refused(f"seed {min(both)} is both a selection seed and a reporting seed: the reported accuracies "
                      "would be those the selection saw; keep them apart (e.g. --select-seeds 0-2 --report-seeds 3-9)")
    for kind, seeds in (("selection", sel), ("reporting", rep)):
        if not seeds:
            raise Refused(f"no {kind} seed is left: the runs in {args.grid_dir} have seeds {seeds_text(present)}; "
                          "give both --select-seeds and --report-seeds")
        if lacking := [s for s in seeds if s not in present]:
            raise Refused(f"no run of {kind} seed {lacking[0]} in {args.grid_dir} (its runs have seeds "
                          f"{seeds_text(present)})")
    return sel, rep


def selection_rule(args, runs) -> Rule:
    if args.select_on_test:
        if args.select_seeds is not None or args.report_seeds is not None:
            raise Refused("--select-on-test selects and reports on every seed; drop --select-seeds and --report-seeds")
        return Rule(on_test=True)
    if lacking := [r for r in runs if "final_val_acc" not in r["summary"]]:
        which = "the runs" if len(lacking) == len(runs) else f"{len(lacking)} of the {len(runs)} runs"
        raise Refused(f"{which} in {args.grid_dir} have no validation accuracy (run the grid with val_split), so no "
                      "rate can be selected without the test set; --select-on-test reproduces the superseded pages "
                      "that did")
    sel, rep = protocol_seeds(args, runs)
    return Rule(select_seeds=tuple(sel), report_seeds=tuple(rep))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("paper", choices=("dcasgd", "agn"))
    ap.add_argument("grid_dir", help="a grid's --out directory (or any directory of run directories)")
    ap.add_argument("--out", help="write the markdown here (and FILE.json, FILE.png beside it); else print it")
    ap.add_argument("--select-seeds", metavar="SEEDS",
                    help="seeds the selection sees, e.g. 0-2 or 0,1,2  [default: the grid's [protocol] in "
                         "GRID_DIR/grid.json; given --report-seeds only, every other seed]")
    ap.add_argument("--report-seeds", metavar="SEEDS",
                    help="seeds whose test accuracy is reported, e.g. 3-9  [default: the grid's [protocol]; given "
                         "--select-seeds only, every other seed]")
    ap.add_argument("--select-on-test", action="store_true",
                    help="the superseded rule: select on the mean final TEST accuracy over every seed, to reproduce "
                         "docs/results/*/papers.md (runs without a validation accuracy)")
    args = ap.parse_args(argv)
    try:
        runs = load_runs([args.grid_dir])
        rule = selection_rule(args, runs)
        result, text = (dcasgd if args.paper == "dcasgd" else agn)(runs, rule)
    except Refused as e:
        print(f"papers.py: {e}", file=sys.stderr)
        return 2
    except StalegradError as e:
        print(f"papers.py: {' '.join(str(e).split())}", file=sys.stderr)
        return e.exit_code
    if args.out:
        with open(args.out, "w") as f:
            f.write(text + "\n")
        stem = args.out.rsplit(".", 1)[0]
        with open(stem + ".json", "w") as f:
            f.write(json_text(result, indent=1) + "\n")
        (plot_dcasgd if args.paper == "dcasgd" else plot_agn)(result, stem + ".png")
    else:
        print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
