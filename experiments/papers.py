"""The papers' own claims, checked on a grid's runs: ``python experiments/papers.py dcasgd|agn GRID_DIR --out FILE.md``.

dcasgd: Zheng et al. (2017) claim that DC-ASGD closes most of the gap between ASGD and sequential SGD
and beats SSGD. For each delay model and M, this prints every algorithm's final test accuracy (mean
+- std over seeds) and the gap closure ``(acc_DC - acc_ASGD) / (acc_SGD - acc_ASGD)``, under two
learning-rate rules applied to every algorithm alike:

- *tuned*: each (algorithm, M, delay) at the learning rate of the sweep with the highest mean final
  test accuracy over seeds (ties: the smaller rate);
- *sgd's*: every algorithm at sequential SGD's tuned rate, the paper's protocol (DC-ASGD was run with
  the schedule tuned for sequential SGD).

The closure is computed per seed (the runs of one seed share the data order, the shards and the
initial weights) and reported as mean +- std over seeds.

agn: Hermans et al. (2017) claim that AGN is more accurate than AEASGD and more stable than DOWNPOUR
at high worker counts, and that its temporal efficiency against AEASGD is above 1 in most cells of the
n x window grid. This prints per cell the final accuracies and AGN's temporal efficiency against
AEASGD, both variants (``stalegrad report``: the central model's test accuracy over virtual time; the
workers' training accuracy over wall time in 5 s windows), and the share of cells above 1.

The learning rate is selected on the test set (the grids have no validation split); the rule is the
same for every algorithm, so the selection favours none of them, but the absolute accuracies at the
tuned rate are optimistic by the selection's noise.
"""
from __future__ import annotations

import argparse
import math
import statistics
import sys
from collections import defaultdict

from stalegrad.metrics import temporal_efficiency
from stalegrad.report import load_runs
from stalegrad.report_curves import central_curve, workers_curve
from stalegrad.results import json_text

DC_ALGOS = ("sgd", "ssgd", "asgd", "dcasgd-c", "dcasgd-a")
AGN_ALGOS = ("agn", "aeasgd", "dynsgd", "downpour")


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
    """Runs grouped by the config values ``keys`` -> {seed: run}."""
    out: dict = defaultdict(dict)
    for r in runs:
        out[tuple(r["flat"].get(k) for k in keys)][r["seed"]] = r
    return out


def tuned_lr(by_lr: dict) -> float:
    """The learning rate with the highest mean final test accuracy over seeds (ties: the smaller)."""
    def score(lr):
        m = mean_std([final_acc(r) for r in by_lr[lr].values()])[0]
        return (m if math.isfinite(m) else -1.0, -lr)
    return max(by_lr, key=score)


def gap_closure(dc: float, asgd: float, sgd: float) -> float:
    gap = sgd - asgd
    return (dc - asgd) / gap if gap > 0 else math.nan


# ---------------------------------------------------------------- DC-ASGD

def dcasgd(runs) -> tuple[dict, str]:
    by = cells(runs, ("algo", "workers", "delay", "lr"))
    grid: dict = defaultdict(dict)          # (algo, workers, delay) -> {lr: {seed: run}}
    for (algo, workers, delay, lr), seeds in by.items():
        grid[(algo, workers, delay)][lr] = seeds
    delays = sorted({k[2] for k in grid})
    ms = sorted({k[1] for k in grid if k[0] != "sgd"})
    result: dict = {"rule": "tuned: argmax over lr of the mean final test accuracy over seeds; sgd's: sgd's tuned lr",
                    "rows": []}
    lines = []
    for delay in delays:
        sgd = grid.get(("sgd", 1, delay))
        if not sgd:
            continue
        sgd_lr = tuned_lr(sgd)
        for rule in ("tuned", "sgd's"):
            lines += [f"### delay {delay}, learning rate: {rule}" + (f" ({sgd_lr:g})" if rule == "sgd's" else ""), "",
                      "| M | " + " | ".join(DC_ALGOS) + " | closure dcasgd-c | closure dcasgd-a | DC-a > SSGD |",
                      "|---|" + "---|" * (len(DC_ALGOS) + 3)]
            for m in ms:
                chosen = {"sgd": (sgd_lr, sgd[sgd_lr])}
                for algo in DC_ALGOS[1:]:
                    by_lr = grid.get((algo, m, delay))
                    if by_lr:
                        lr = tuned_lr(by_lr) if rule == "tuned" else sgd_lr
                        if lr in by_lr:
                            chosen[algo] = (lr, by_lr[lr])
                accs = {a: [final_acc(r) for r in seeds.values()] for a, (_, seeds) in chosen.items()}
                closure = {}
                for dc in ("dcasgd-c", "dcasgd-a"):
                    if dc in chosen and "asgd" in chosen:
                        seeds = set(chosen[dc][1]) & set(chosen["asgd"][1]) & set(sgd[sgd_lr])
                        closure[dc] = [gap_closure(final_acc(chosen[dc][1][s]), final_acc(chosen["asgd"][1][s]),
                                                   final_acc(sgd[sgd_lr][s])) for s in sorted(seeds)]
                beats = "-"
                if "dcasgd-a" in accs and "ssgd" in accs:
                    beats = "yes" if mean_std(accs["dcasgd-a"])[0] > mean_std(accs["ssgd"])[0] else "no"
                row = [str(m)] + [f"{fmt(accs[a])} ({chosen[a][0]:g})" if a in accs else "-" for a in DC_ALGOS]
                row += [fmt(closure.get("dcasgd-c", []), 2), fmt(closure.get("dcasgd-a", []), 2), beats]
                lines.append("| " + " | ".join(row) + " |")
                result["rows"].append({"delay": delay, "rule": rule, "workers": m,
                                       "lr": {a: chosen[a][0] for a in chosen},
                                       "final_test_acc": {a: mean_std(v)[:2] for a, v in accs.items()},
                                       "closure": {k: mean_std(v)[:2] for k, v in closure.items()},
                                       "diverged": {a: sum(bool(r["summary"].get("diverged")) for r in seeds.values())
                                                    for a, (_, seeds) in chosen.items()}})
            lines.append("")
    head = ["Final test accuracy, mean ± std over seeds (the learning rate in brackets); gap closure "
            "(acc_DC − acc_ASGD) / (acc_SGD − acc_ASGD) per seed, mean ± std; the last column compares "
            "the means of DC-ASGD-a and SSGD.", ""]
    return result, "\n".join(head + lines)


# ---------------------------------------------------------------- AGN

def agn(runs) -> tuple[dict, str]:
    by = cells(runs, ("algo", "workers", "window"))
    ns = sorted({k[1] for k in by if k[0] == "agn"})
    windows = sorted({k[2] for k in by if k[0] == "agn"})
    lines = ["Final test accuracy, mean ± std over seeds; TE = AGN's temporal efficiency against AEASGD "
             "(per seed, then mean): central = test accuracy over virtual time, workers = the workers' training "
             "accuracy over wall time in 5 s windows.", "",
             "| n | window | " + " | ".join(AGN_ALGOS) + " | TE central | TE workers |",
             "|---|---|" + "---|" * (len(AGN_ALGOS) + 2)]
    rows, above = [], {"central": [], "workers": []}
    for n in ns:
        for w in windows:
            here = {a: by.get((a, n, w), {}) for a in AGN_ALGOS}
            te = {}
            for variant, curve in (("central", central_curve), ("workers", workers_curve)):
                seeds = sorted(set(here["agn"]) & set(here["aeasgd"]))
                per_seed = []
                for s in seeds:
                    a, b = curve(here["agn"][s]), curve(here["aeasgd"][s])
                    if len(a[0]) > 1 and len(b[0]) > 1:
                        per_seed.append(temporal_efficiency(a, b))
                te[variant] = per_seed
                m = mean_std(per_seed)[0]
                if math.isfinite(m):
                    above[variant].append(m > 1)
            accs = {a: [final_acc(r) for r in seeds.values()] for a, seeds in here.items()}
            lines.append("| " + " | ".join([str(n), str(w)] + [fmt(accs[a]) for a in AGN_ALGOS]
                                           + [fmt(te["central"], 3), fmt(te["workers"], 3)]) + " |")
            rows.append({"workers": n, "window": w, "final_test_acc": {a: mean_std(v)[:2] for a, v in accs.items()},
                         "te": {k: mean_std(v)[:2] for k, v in te.items()},
                         "diverged": {a: sum(bool(r["summary"].get("diverged")) for r in s.values())
                                      for a, s in here.items()}})
    share = {k: (sum(v), len(v)) for k, v in above.items()}
    lines += ["", "Cells where AGN's mean TE against AEASGD is above 1: "
              + "; ".join(f"{k}: {a} of {b}" for k, (a, b) in share.items()) + "."]
    return {"rows": rows, "te_above_1": share}, "\n".join(lines)


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
    """Final test accuracy against n, one line per algorithm, one panel per window."""
    rows = result["rows"]
    windows = sorted({r["window"] for r in rows})
    plt, fig, axes = _panels(len(windows), 4.5)
    for ax, w in zip(axes, windows):
        here = sorted((r for r in rows if r["window"] == w), key=lambda r: r["workers"])
        for algo in AGN_ALGOS:
            pts = [(r["workers"], *r["final_test_acc"][algo]) for r in here
                   if math.isfinite(r["final_test_acc"][algo][0])]
            if pts:
                _errorbar(ax, pts, algo)
        ax.set_title(f"window {w}", fontsize=10)
        ax.set_xlabel("workers n")
        ax.grid(alpha=0.3)
    _save(plt, fig, axes, path)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("paper", choices=("dcasgd", "agn"))
    ap.add_argument("grid_dir", help="a grid's --out directory (or any directory of run directories)")
    ap.add_argument("--out", help="write the markdown here (and FILE.json, FILE.png beside it); else print it")
    args = ap.parse_args(argv)
    runs = load_runs([args.grid_dir])
    result, text = (dcasgd if args.paper == "dcasgd" else agn)(runs)
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
