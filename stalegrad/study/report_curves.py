"""The report's curves and temporal efficiency (Hermans et al.) of each variant: the central model's test
accuracy over virtual time, the workers' training accuracy over the simulator's wall time, and (through
``report_time.py``) over modelled cluster time; time to a target accuracy."""
from __future__ import annotations

import math

from ..run.metrics import temporal_efficiency
from .report_time import modelled_te

WINDOW_S = 5.0          # the workers variant: training accuracy averaged over windows of real time
TIMES = ("wall_s", "virtual_s", "samples")
LEGEND_INSIDE = 10      # more labelled lines than this: the legend goes beside the axes, off every curve (as
                        # report_target.py does for accuracy_vs_time.png)
LEGEND_MAX = 20         # and names this many (the palette has 20 colours; report.md's tables name every group)


def _finite(x) -> bool:
    return isinstance(x, int | float) and not isinstance(x, bool) and math.isfinite(x)


def time_to_target(metrics: list[dict], target: float, key: str = "test_acc") -> dict | None:
    """Wall seconds, virtual seconds and samples at which test accuracy (``key``: another accuracy of
    metrics.jsonl, e.g. ``val_acc``) first reaches ``target``, interpolated linearly between the two
    evaluations around it; None if it never does."""
    prev = None
    for m in metrics:
        acc = m.get(key)
        if not _finite(acc) or not all(_finite(m.get(k)) for k in TIMES):
            continue
        if acc >= target:
            if prev is None:
                return {k: m[k] for k in TIMES}
            frac = (target - prev[key]) / (acc - prev[key])
            return {k: prev[k] + frac * (m[k] - prev[k]) for k in TIMES}
        prev = m
    return None


def central_curve(run: dict):
    """The central model's test accuracy over virtual time."""
    pts = [(m["virtual_s"], m["test_acc"]) for m in run["metrics"]
           if _finite(m.get("test_acc")) and _finite(m.get("virtual_s"))]
    return [p[0] for p in pts], [p[1] for p in pts]


def workers_curve(run: dict, window: float = WINDOW_S):
    """The workers' mini-batch training accuracy (``train_acc`` of each message, messages.jsonl) over
    real time, averaged in windows of ``window`` seconds (weighted by the samples each message covers);
    one point per window, at its middle."""
    sums: dict[int, list[float]] = {}
    prev = 0
    for m in run["messages"]:
        samples = m.get("samples") or 0
        weight, prev = samples - prev, samples
        if _finite(m.get("train_acc")) and _finite(m.get("wall_s")) and weight > 0:
            s = sums.setdefault(int(m["wall_s"] // window), [0.0, 0.0])
            s[0] += weight * m["train_acc"]
            s[1] += weight
    ks = sorted(sums)
    return [(k + 0.5) * window for k in ks], [sums[k][0] / sums[k][1] for k in ks]


def logs_train_acc(run: dict) -> bool:
    return any(_finite(m.get("train_acc")) for m in run["messages"])


def efficiencies(g: dict, base: dict, efficiency) -> dict:
    """E(run, baseline run of the same seed) for each seed of ``g`` that the baseline group has;
    ``efficiency(run_a, run_b)``: ``pair_efficiency``'s."""
    by_seed = {r["seed"]: r for r in base["runs"]}
    return {r["seed"]: efficiency(r, by_seed[r["seed"]]) for r in g["runs"] if r["seed"] in by_seed}


def pair_efficiency(variant: str):
    """E(run a, run b) of a variant: central and workers compare each run's own curve; workers-modelled
    puts both runs on one grid of windows of modelled time (report_time.py), from each run's
    ``time_scale`` (modelled seconds per virtual second)."""
    if variant == "workers-modelled":
        return lambda a, b: modelled_te(a, b, a["time_scale"], b["time_scale"])
    curve = workers_curve if variant == "workers" else central_curve
    return lambda a, b: temporal_efficiency(curve(a), curve(b))


def place_legend(fig, ax, fontsize: float = 8):
    """The legend of ``ax``'s labelled lines, never drawn over the plots: inside ``ax``, where matplotlib finds
    room, for up to LEGEND_INSIDE lines; beyond, beside the axes on the right, naming the first LEGEND_MAX lines
    and how many more, with the figure widened by the legend's width so that the caller's ``tight_layout``
    keeps the plots their size."""
    handles, labels = ax.get_legend_handles_labels()
    if len(handles) <= LEGEND_INSIDE:
        return ax.legend(fontsize=fontsize)
    if len(handles) > LEGEND_MAX:
        from matplotlib.lines import Line2D
        more = len(handles) - LEGEND_MAX
        handles = handles[:LEGEND_MAX] + [Line2D([], [], linestyle="none")]
        labels = labels[:LEGEND_MAX] + [f"... and {more} more (report.md's tables name every group)"]
    legend = ax.legend(handles, labels, fontsize=7, loc="upper left", bbox_to_anchor=(1.02, 1.0), borderaxespad=0)
    width, height = fig.get_size_inches()
    fig.set_size_inches(width + legend.get_window_extent(fig.canvas.get_renderer()).width / fig.dpi + 0.3, height)
    return legend
