"""Time to a target accuracy with the runs that never reach it counted (leaving them out would flatter
the groups that fail most): per group and accuracy (test; validation too where the runs have it,
``--val-split``), the runs that reached the target and those censored at their last evaluation, the median
and mean ± std of the times reached, and the Kaplan–Meier median over all of them; and the figure of
accuracy over time, a band over seeds.

The clock is the run's own: virtual seconds for the simulator (``virtual_s``), wall seconds for the real
runtimes, local and Ray (``wall_s``). A crossing is interpolated linearly between the two evaluations
around it (``report_curves.time_to_target``, as in the report's first time-to-target table).
"""
from __future__ import annotations

import math
import statistics
from fractions import Fraction
from pathlib import Path

from .report_curves import TIMES, time_to_target
from .report_plots import cell, markdown_table, palette, pyplot

ACCURACIES = {"test_acc": "test", "val_acc": "validation"}
CLOCKS = {"virtual_s": "virtual s", "wall_s": "wall s"}
FILE = "accuracy_vs_time.png"
LEGEND_INSIDE = 10    # more groups than this: the legend goes beside the axes
LEGEND_MAX = 20       # and names at most this many of them (report.json names every group)
LISTED = 4            # censoring times listed one by one; more: their range


def _finite(x) -> bool:
    return isinstance(x, int | float) and not isinstance(x, bool) and math.isfinite(x)


def clock_of(run: dict) -> str:
    """``virtual_s`` for a run of the simulator (config.json's runtime ``sim``, or none: runs before the
    real runtimes), ``wall_s`` for a real runtime's."""
    return "virtual_s" if (run.get("flat") or {}).get("runtime", "sim") == "sim" else "wall_s"


def _evaluations(run: dict, key: str, clock: str) -> list[tuple[float, float]]:
    """(time, accuracy) of each evaluation with ``key`` and every clock finite (the records that
    ``time_to_target`` reads), in time order."""
    pts = [(float(m[clock]), float(m[key])) for m in run["metrics"]
           if _finite(m.get(key)) and all(_finite(m.get(k)) for k in TIMES)]
    return sorted(pts, key=lambda p: p[0])


# ---------------------------------------------------------------- Kaplan–Meier

def survival(reached: list[float], censored: list[float]) -> list[tuple[float, Fraction]]:
    """The Kaplan–Meier estimate of the fraction of runs not yet at the target: (t, S(t)) at each
    distinct time at which a run reached it. S(t) = prod over those times t_i <= t of (1 - d_i / n_i),
    d_i the runs that reached it at t_i, n_i the runs at risk then (not reached before t_i and not censored
    before it: a run censored at t_i itself is still at risk). Exact fractions."""
    out, s = [], Fraction(1)
    for t in sorted(set(reached)):
        at_risk = sum(x >= t for x in reached) + sum(c >= t for c in censored)
        s *= Fraction(at_risk - reached.count(t), at_risk)
        out.append((t, s))
    return out


def km_median(reached: list[float], censored: list[float]) -> tuple[float | None, bool]:
    """The Kaplan–Meier median time to target: (t, False), the first time at which S drops to 1/2 or
    below (where S is exactly 1/2 until a later time at which a run reached the target: the midpoint of the
    two, so that without censoring it is the ordinary median); or (T, True) when S stays above 1/2 up to
    T, the last time observed (reached or censored): the median is > T. (None, False) with no run."""
    if not reached and not censored:
        return None, False
    curve = survival(reached, censored)
    for i, (t, s) in enumerate(curve):
        if s <= Fraction(1, 2):
            if s == Fraction(1, 2) and i + 1 < len(curve):
                return (t + curve[i + 1][0]) / 2, False
            return t, False
    return max(reached + censored), True


# ---------------------------------------------------------------- the analysis

def _stat(values: list[float]) -> dict:
    return {"mean": statistics.fmean(values) if values else math.nan,
            "std": statistics.stdev(values) if len(values) > 1 else math.nan, "n": len(values)}


def group_times(runs: list[dict], target: float, key: str, clock: str) -> dict | None:
    """One group's time to ``target`` on accuracy ``key`` over ``clock``: None when no run has it."""
    per_run, reached, censored = [], [], []
    for r in runs:
        pts = _evaluations(r, key, clock)
        if not pts:
            continue
        hit = time_to_target(r["metrics"], target, key)
        if hit is not None:
            reached.append(float(hit[clock]))
            per_run.append({"seed": r["seed"], "time": reached[-1], "censored_at": None})
        else:   # never reached: all we know is that it had not by its last evaluation
            censored.append(pts[-1][0])
            per_run.append({"seed": r["seed"], "time": None, "censored_at": censored[-1]})
    if not per_run:
        return None
    median, above = km_median(reached, censored)
    return {"accuracy": key, "clock": clock, "n": len(per_run), "reached": len(reached),
            "median_reached": statistics.median(reached) if reached else None, "time_reached": _stat(reached),
            "censored": len(censored), "censored_at": sorted(censored),
            "km_median": {"time": median, "censored": above},
            "without": len(runs) - len(per_run), "runs": per_run}


def analyse_target(groups: list[dict], target: float) -> dict:
    """report.json's ``time_to_target_censored``: one row per group and accuracy."""
    rows = []
    for g in groups:
        clocks = {clock_of(r) for r in g["runs"]}
        clock = clocks.pop() if len(clocks) == 1 else "wall_s"   # (the runtime is in the group's key)
        for key in ACCURACIES:
            row = group_times(g["runs"], target, key, clock)
            if row is not None:
                rows.append({"group": g["label"], **row})
    return {"target": target, "interpolation": "linear between the two evaluations around the crossing",
            "censoring": "a run that never reaches the target is censored at its last evaluation",
            "median": "Kaplan–Meier, right-censored at each run's last evaluation", "rows": rows}


# ---------------------------------------------------------------- the figure

def step_values(grid, times, accs, hold: bool = True):
    """An accuracy curve at the times ``grid`` by step interpolation: each evaluation's accuracy holds
    until the next one, and the last one after it (the run is over: its model keeps that accuracy; NaN
    there with ``hold=False``); NaN before the first evaluation."""
    import numpy as np
    grid, times, accs = (np.asarray(a, dtype=float) for a in (grid, times, accs))
    if not len(times):
        return np.full(grid.shape, np.nan)
    i = np.searchsorted(times, grid, side="right") - 1   # the last evaluation at or before each time
    return np.where((i >= 0) & (hold | (grid <= times[-1])), accs[np.clip(i, 0, None)], np.nan)


def band(curves: list[tuple], grid=None) -> dict:
    """Seeds' curves [(times, accuracies)] on one grid of times, by ``step_values`` (a seed keeps its last
    accuracy after its last evaluation): ``grid``; ``values`` (seeds x grid); ``mean``, ``std`` (n - 1; 0
    for one seed), ``low``, ``high`` and ``n`` over the seeds that have a value there. The default grid:
    every evaluation time of any seed from the latest first evaluation on, where every seed has data."""
    import warnings

    import numpy as np
    cs = [(np.asarray(t, dtype=float), np.asarray(a, dtype=float)) for t, a in curves if len(t)]
    if grid is None:
        times = np.unique(np.concatenate([t for t, _ in cs])) if cs else np.array([])
        grid = times[times >= max(t[0] for t, _ in cs)] if cs else times
    grid = np.asarray(grid, dtype=float)
    values = np.array([step_values(grid, t, a) for t, a in cs]).reshape(len(cs), len(grid))
    n = np.sum(~np.isnan(values), axis=0)
    with warnings.catch_warnings():   # a time no seed covers: NaN, said by n == 0
        warnings.simplefilter("ignore", RuntimeWarning)
        std = np.where(n > 1, np.nanstd(values, axis=0, ddof=1), np.where(n == 1, 0.0, np.nan))
        return {"grid": grid, "values": values, "mean": np.nanmean(values, axis=0), "std": std,
                "low": np.nanmin(values, axis=0), "high": np.nanmax(values, axis=0), "n": n}


def _panels(groups: list[dict]) -> list[dict]:
    """One panel per clock: its groups, and the accuracy drawn (validation where every run has it)."""
    by_clock: dict = {}
    for g in groups:
        by_clock.setdefault(clock_of(g["runs"][0]), []).append(g)
    out = []
    for clock in (c for c in CLOCKS if c in by_clock):
        gs = by_clock[clock]
        key = "val_acc" if all(_evaluations(r, "val_acc", clock) for g in gs for r in g["runs"]) else "test_acc"
        out.append({"clock": clock, "accuracy": key, "groups": gs})
    return out


def plot_target(groups: list[dict], target: float, out: Path) -> dict:
    """Draw ``FILE`` into ``out``: per group, the mean accuracy over seeds against the run's clock (a step)
    with the band from the lowest to the highest seed, the target a dashed line. {"file", "panels": [{clock,
    accuracy}]}, or {"file": None, "why": ...} (the caller removes a stale file)."""
    plt = pyplot()
    if plt is None:
        return {"file": None, "why": "matplotlib is not installed (pip install 'matplotlib>=3.7')"}
    from matplotlib.lines import Line2D
    panels = _panels(groups)
    fig, axes = plt.subplots(1, len(panels), figsize=(7.5 * len(panels), 4.8), squeeze=False)
    colors = dict(zip(map(id, groups), palette(plt, len(groups))))
    handles = []
    for ax, p in zip(axes[0], panels):
        for g in p["groups"]:
            b = band([tuple(zip(*pts)) for pts in (_evaluations(r, p["accuracy"], p["clock"]) for r in g["runs"])
                      if pts])
            if not len(b["grid"]):
                continue
            color, label = colors[id(g)], f"{g['label']} ({len(b['values'])})"
            line, = ax.step(b["grid"], b["mean"], where="post", color=color, label=label)
            if len(b["values"]) > 1:
                ax.fill_between(b["grid"], b["low"], b["high"], step="post", color=color, alpha=0.2, linewidth=0)
            handles.append(line)
        ax.axhline(target, linestyle="--", color="0.3", linewidth=1)
        ax.set_xlabel({"virtual_s": "virtual time (s, simulator)", "wall_s": "wall time (s)"}[p["clock"]])
        ax.set_ylabel(f"{ACCURACIES[p['accuracy']]} accuracy")
        ax.grid(alpha=0.3)
    handles.append(Line2D([], [], linestyle="--", color="0.3", linewidth=1, label=f"target {target:.4f}"))
    if len(handles) - 1 > LEGEND_MAX:
        more = len(handles) - 1 - LEGEND_MAX
        handles = handles[:LEGEND_MAX] + [handles[-1], Line2D([], [], linestyle="none",
                                                                label=f"... and {more} more (report.json)")]
    if len(groups) <= LEGEND_INSIDE:
        axes[0][-1].legend(handles=handles, fontsize=8, loc="best")
        fig.tight_layout()
    else:
        fig.tight_layout()
        fig.legend(handles=handles, fontsize=7, loc="center left", bbox_to_anchor=(1.0, 0.5))
    fig.savefig(out / FILE, dpi=110, bbox_inches="tight")
    plt.close(fig)
    return {"file": FILE, "panels": [{"clock": p["clock"], "accuracy": p["accuracy"]} for p in panels]}


# ---------------------------------------------------------------- report.md

def fmt_time(t: float) -> str:
    """Three significant digits (at most 6 decimals): 12.5, 0.0123, 1235."""
    m = abs(t)
    return f"{t:.{min(6, max(0, 2 - math.floor(math.log10(m)))) if m else 2}f}"


def censored_cell(row: dict) -> str:
    """``0 of 3``; ``1 of 3 censored at 40.0``; ``2 of 3 censored at 38.0, 40.0``; more than ``LISTED``:
    the range of their censoring times."""
    k, at = row["censored"], row["censored_at"]
    if not k:
        return f"0 of {row['n']}"
    times = ", ".join(map(fmt_time, at)) if k <= LISTED else f"{fmt_time(at[0])}–{fmt_time(at[-1])}"
    return f"{k} of {row['n']} censored at {times}"


def km_cell(row: dict) -> str:
    km = row["km_median"]
    return f"> {fmt_time(km['time'])}" if km["censored"] else fmt_time(km["time"])


def render_target(t: dict) -> list[str]:
    """The report's section of ``analyse_target``'s rows, and its figure (``t["plot"]``, when drawn)."""
    out = [f"## Time to accuracy {t['target']:.4f}, censored runs counted", "",
           "The same target on test accuracy and, where the runs have it (`--val-split`), on validation "
           "accuracy (column 'accuracy'), on each run's clock (column 'clock': virtual seconds for the "
           "simulator, wall seconds for the local and Ray runtimes); interpolated linearly between "
           "evaluations. A run that never reaches the target is censored at its last evaluation: counted in "
           "'runs', not in 'reached', its time in 'censored'. 'median' and 'mean ± std' are over the runs "
           "that reached the target only; 'KM median' is the Kaplan–Meier median over all of them, "
           "right-censored at each run's last evaluation, '> T' when the estimate stays above one half up to "
           "T, the last time observed (the median itself is censored).", ""]
    out += markdown_table(["group", "accuracy", "clock", "runs", "reached", "median", "mean ± std", "KM median",
                           "censored"],
                          [[r["group"], ACCURACIES[r["accuracy"]], CLOCKS[r["clock"]], str(r["n"]), str(r["reached"]),
                            fmt_time(r["median_reached"]) if r["reached"] else "n/a", cell(r["time_reached"], "sig"),
                            km_cell(r), censored_cell(r)] for r in t["rows"]])
    missing = [f"{r['group']} ({r['without']} of {r['n'] + r['without']})" for r in t["rows"]
               if r["accuracy"] == "val_acc" and r["without"]]
    if missing:
        out += ["Runs without validation accuracy, not in their group's validation row: " + ", ".join(missing)
                + ".", ""]
    plot = t.get("plot") or {}
    if plot.get("file"):
        said = "; ".join(f"{ACCURACIES[p['accuracy']]} accuracy against {p['clock'][:-2]} time"
                         for p in plot["panels"])
        out += [f"![accuracy against time]({plot['file']})", "",
                f"*{said[0].upper() + said[1:]} (validation accuracy where every run of the panel has it): per "
                "group the mean over seeds, a step (an accuracy holds until the next evaluation; a run that has "
                "ended keeps its last one), and the band from the lowest to the highest seed; dashed: the "
                "target.*", ""]
    elif plot.get("why"):
        out += [f"- No {FILE}: {plot['why']}.", ""]
    return out
