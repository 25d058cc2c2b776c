"""How the report of ``report.py`` looks: table cells, the PNG figures and report.md.

matplotlib (``pip install 'matplotlib>=3.7'``) is imported inside the plotting functions only; without
it the report has its tables and says why it has no figures.
"""
from __future__ import annotations

import math
from collections import Counter
from pathlib import Path

from ..errors import UsageError
from ..run.progress import count
from .report_curves import place_legend

PLOTS = {   # name: (file, caption)
    "accuracy": ("accuracy.png", "Test accuracy against epochs, wall time and virtual time: the mean over seeds, "
                                 "the band from the lowest to the highest seed (where all seeds have data)"),
    "staleness": ("staleness.png", "Staleness histograms per group (all seeds together)"),
    "heatmap": ("heatmap.png", "Heat map"),
    "workers": ("accuracy_vs_workers.png", "Final test accuracy against the number of workers (mean ± std over "
                                           "seeds); dashed: one-worker baselines"),
}


def order(v):
    """A sort key for setting values of any type (None first, numbers by value)."""
    if v is None:
        return (0, 0.0, "")
    if isinstance(v, bool | int | float):
        return (1, float(v), "")
    return (2, 0.0, str(v))


def fmt_value(v) -> str:
    if v is None:
        return "none"
    if isinstance(v, float):
        return f"{v:g}"
    if isinstance(v, tuple):
        return ",".join(fmt_value(x) for x in v) or "-"
    return str(v)


def cell(s: dict, spec: str = ".3f") -> str:
    """``0.853 ± 0.004 (3)``: mean ± std (number of seeds); one seed has no std: ``0.853 (1)``.
    ``spec`` "sig": three significant digits of the mean, the std with as many decimals."""
    if not s or not s["n"]:
        return "n/a"
    if spec == "sig":
        m = abs(s["mean"])
        spec = f".{min(6, max(0, 2 - math.floor(math.log10(m)))) if m else 2}f"
    text = f"{s['mean']:{spec}}"
    return f"{text} (1)" if s["n"] == 1 else f"{text} ± {s['std']:{spec}} ({s['n']})"


def choose_heatmap_axes(axes: dict, requested: str | None) -> tuple[tuple[str, str] | None, str]:
    """The heat map's two axes (X, Y), or None and why there is none. Default: workers x window when
    both vary, else the two settings with the most values."""
    if requested:
        names = [a.strip() for a in requested.split(",")]
        if len(names) != 2 or names[0] == names[1] or not all(names):
            raise UsageError(f"--heatmap {requested!r}: give two different settings, X,Y (e.g. workers,window)")
        for n in names:
            if n not in axes:
                raise UsageError(f"--heatmap: {n!r} does not vary in these runs; the settings that vary: "
                                 f"{', '.join(axes) or 'none'}")
        return (names[0], names[1]), ""
    if "workers" in axes and "window" in axes:
        return ("workers", "window"), ""
    if len(axes) < 2:
        return None, f"it needs two settings that vary, and {'only ' + next(iter(axes)) if axes else 'none'} does"
    prefer = ("workers", "window", "lr", "delay", "algo")
    ranked = sorted(axes, key=lambda a: (-len(axes[a]), prefer.index(a) if a in prefer else len(prefer), a))
    return (ranked[0], ranked[1]), ""


# ---------------------------------------------------------------- figures

def pyplot():
    """matplotlib's pyplot on the file-only Agg backend, or None without matplotlib."""
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return None
    return plt


def palette(plt, n: int):
    """``n`` distinct colours: tab10, or tab20 for more than ten lines."""
    cmap = plt.get_cmap("tab10" if n <= 10 else "tab20")
    return [cmap(i % cmap.N) for i in range(n)]


def _setting(pairs) -> str:
    """``asgd lr=0.1`` from ((axis, value), ...) pairs; ``algo`` by its value alone."""
    return " ".join(fmt_value(v) if a == "algo" else f"{a}={fmt_value(v)}" for a, v in pairs if v is not None)


def _accuracy(plt, groups, report, path) -> str:
    import numpy as np
    fig, axes = plt.subplots(1, 3, figsize=(17, 4.8))
    colors = palette(plt, len(groups))
    for ax, x in zip(axes, ("epoch", "wall_s", "virtual_s")):
        for color, g in zip(colors, groups):
            curves = []
            for r in g["runs"]:
                pts = [(m[x], m["test_acc"]) for m in r["metrics"]
                       if isinstance(m.get(x), int | float) and isinstance(m.get("test_acc"), int | float)]
                if pts:
                    curves.append(np.array(pts, dtype=float).T)
            if not curves:
                continue
            lo, hi = max(c[0][0] for c in curves), min(c[0][-1] for c in curves)
            label = f"{g['label']} ({len(curves)})"
            if len(curves) > 1 and hi > lo:
                grid = np.unique(np.concatenate([c[0][(c[0] >= lo) & (c[0] <= hi)] for c in curves] + [[lo, hi]]))
                ys = np.array([np.interp(grid, c[0], c[1]) for c in curves])
                ax.plot(grid, ys.mean(0), color=color, label=label)
                ax.fill_between(grid, ys.min(0), ys.max(0), color=color, alpha=0.2, linewidth=0)
            else:
                ax.plot(curves[0][0], curves[0][1], color=color, label=label)
        ax.set_xlabel({"epoch": "epochs", "wall_s": "wall time (s)", "virtual_s": "virtual time (s)"}[x])
        ax.set_ylabel("test accuracy")
        ax.grid(alpha=0.3)
    place_legend(fig, axes[-1], fontsize=7 if len(groups) > 8 else 9)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return ""


def _staleness(plt, groups, report, path) -> str:
    from matplotlib.ticker import MaxNLocator
    hists = []
    for g in groups:
        h = Counter()
        for r in g["runs"]:
            for tau, count in ((r.get("staleness") or {}).get("histogram") or {}).items():
                h[int(tau)] += count
        if h:
            hists.append((g, h))
    if not hists:
        return "no run recorded a staleness histogram"
    cols = min(4, len(hists))
    rows = math.ceil(len(hists) / cols)
    fig, axes = plt.subplots(rows, cols, figsize=(4.2 * cols, 3.0 * rows), squeeze=False)
    for ax, color, (g, h) in zip(axes.flat, palette(plt, len(groups)), hists):
        taus, total = sorted(h), sum(h.values())
        ax.bar(taus, [h[t] / total for t in taus], width=0.8, color=color)
        ax.set_title(f"{g['label']}\ntau mean {cell(g['tau_mean'], '.2f')}, max {max(taus)}", fontsize=8)
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        ax.set_xlabel("tau", fontsize=8)
        ax.set_ylabel("fraction of updates", fontsize=8)
    for ax in list(axes.flat)[len(hists):]:
        ax.axis("off")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return ""


def _heatmap(plt, groups, report, path, heat_axes, why) -> str:
    import numpy as np
    if heat_axes is None:
        return why
    x, y = heat_axes
    gs = [g for g in groups if x in g["key"] and y in g["key"]]
    if not gs:
        return f"no group has both {x} and {y}"
    use_te = any(g["temporal_efficiency"]["n"] for g in gs)
    what = f"temporal efficiency against {report['baseline']['algorithm']}" if use_te else "final test accuracy"
    others = [a for a in report["compared"]["axes"] if a not in heat_axes]
    panels: dict = {}
    for g in gs:
        panels.setdefault(tuple((a, g["key"].get(a)) for a in others), []).append(g)
    xs = sorted({g["key"][x] for g in gs}, key=order)
    ys = sorted({g["key"][y] for g in gs}, key=order)
    cols = min(3, len(panels))
    rows = math.ceil(len(panels) / cols)
    fig, axes = plt.subplots(rows, cols, squeeze=False, layout="constrained",
                             figsize=((1.0 * len(xs) + 2.5) * cols + 1.5, (0.55 * len(ys) + 1.8) * rows))
    values = [(g["temporal_efficiency"] if use_te else g["final_test_acc"])["mean"] for g in gs]
    finite = [v for v in values if math.isfinite(v)] or [0.0, 1.0]
    lo, hi = min(finite), max(finite)
    image = None
    for ax, (key, members) in zip(axes.flat, panels.items()):
        grid = np.full((len(ys), len(xs)), np.nan)
        for g in members:
            s = g["temporal_efficiency"] if use_te else g["final_test_acc"]
            grid[ys.index(g["key"][y]), xs.index(g["key"][x])] = s["mean"]
        image = ax.imshow(np.ma.masked_invalid(grid), cmap="viridis", vmin=lo, vmax=hi if hi > lo else lo + 1e-9,
                          aspect="auto", origin="lower")
        for (i, j), v in np.ndenumerate(grid):
            if math.isfinite(v):
                ax.text(j, i, f"{v:.3f}", ha="center", va="center", fontsize=8,
                        color="white" if v < (lo + hi) / 2 else "black")
        ax.set_xticks(range(len(xs)), [fmt_value(v) for v in xs], fontsize=8)
        ax.set_yticks(range(len(ys)), [fmt_value(v) for v in ys], fontsize=8)
        ax.set_xlabel(x)
        ax.set_ylabel(y)
        ax.set_title(_setting(key) or "all groups", fontsize=9)
    for ax in list(axes.flat)[len(panels):]:
        ax.axis("off")
    fig.colorbar(image, ax=list(axes.flat), label=what)
    fig.savefig(path, dpi=100)
    plt.close(fig)
    report["heatmap"] = {"x": x, "y": y, "value": what}
    return ""


def _workers(plt, groups, report, path) -> str:
    if "workers" not in report["compared"]["axes"]:
        return "every run used the same number of workers"
    others = [a for a in report["compared"]["axes"] if a != "workers"]
    series: dict = {}
    for g in groups:
        series.setdefault(tuple((a, g["key"].get(a)) for a in others), []).append(g)
    many = {k: v for k, v in series.items() if len({g["key"]["workers"] for g in v}) > 1}
    if not many:
        return "no algorithm was run with more than one number of workers under the same other settings"
    fig, ax = plt.subplots(figsize=(7.5, 4.8))
    colors = palette(plt, len(series))
    counts = set()
    for color, (key, gs) in zip(colors, series.items()):
        gs = sorted(gs, key=lambda g: g["key"]["workers"])
        ws = [g["key"]["workers"] for g in gs]
        means = [g["final_test_acc"]["mean"] for g in gs]
        errs = [s if math.isfinite(s) else 0.0 for s in (g["final_test_acc"]["std"] for g in gs)]
        if set(ws) == {1}:
            ax.axhline(means[0], linestyle="--", color=color, label=f"{_setting(key)} (1 worker)")
        else:   # a line, or a point where the series has one number of workers
            counts.update(ws)
            ax.errorbar(ws, means, yerr=errs, marker="o" if key in many else "s", capsize=3, color=color,
                        linestyle="-" if key in many else "none", label=_setting(key))
    if max(counts) / max(1, min(counts)) >= 8:
        ax.set_xscale("log", base=2)
    ax.set_xticks(sorted(counts), [str(c) for c in sorted(counts)])
    ax.set_xlabel("workers")
    ax.set_ylabel("final test accuracy")
    ax.grid(alpha=0.3)
    place_legend(fig, ax)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return ""


def make_plots(groups: list[dict], report: dict, out: Path, heat_axes, heat_why: str) -> tuple[dict, dict]:
    """Draw every figure that the data allows into ``out``: ({name: file}, {name: why it was skipped}; the
    caller removes a skipped figure's file, ``PLOTS[name][0]``, left by an earlier report)."""
    plt = pyplot()
    made, skipped = {}, {}
    for name, draw in (("accuracy", _accuracy), ("staleness", _staleness), ("heatmap", _heatmap),
                       ("workers", _workers)):
        path = out / PLOTS[name][0]
        if plt is None:
            why = "matplotlib is not installed (pip install 'matplotlib>=3.7')"
        elif name == "heatmap":
            why = draw(plt, groups, report, path, heat_axes, heat_why)
        else:
            why = draw(plt, groups, report, path)
        if why:
            skipped[name] = why
        else:
            made[name] = path.name
    return made, skipped


# ---------------------------------------------------------------- report.md

def markdown_table(head: list[str], rows: list[list[str]]) -> list[str]:
    """The lines of a Markdown table, and an empty line after it."""
    return ["| " + " | ".join(head) + " |", "|" + "|".join("---" for _ in head) + "|",
            *("| " + " | ".join(r) + " |" for r in rows), ""]


def _time_cell(t: dict, k: str) -> str:
    spec = ".0f" if k == "samples" else "sig"
    missing = t["n"] - t["reached"]
    if not missing:
        return cell(t[k], spec)
    text = f"not reached ({missing} of {t['n']} seeds)"
    return f"{cell(t[k], spec)}; {text}" if t["reached"] else text


def render(rep: dict, after_time=()) -> str:
    """report.md: what was compared, the tables, the plots, the notes; ``after_time``: lines after the
    time-to-target table (report_target.py's section)."""
    c, groups = rep["compared"], rep["groups"]
    axes, fixed = c["axes"], c["fixed"]
    seen = lambda k: fmt_value(fixed[k]) if k in fixed else f"varies ({', '.join(map(fmt_value, axes.get(k, [])))})"
    per_group = sorted({len(g["runs"]) for g in groups})
    epochs = count(fixed["epochs"], "epoch") if "epochs" in fixed else f"epochs {seen('epochs')}"
    out = ["# stalegrad report", "",
           f"**Compared:** {count(c['runs'], 'run')} in {count(c['groups'], 'group')}; data set {seen('dataset')}, "
           f"model {seen('model')}, "
           f"{epochs}; seeds {', '.join(map(fmt_value, c['seeds']))} "
           f"({'-'.join(map(str, per_group))} per group).", "",
           "**Settings that vary:** " + ("; ".join(f"{a} ({', '.join(map(fmt_value, v))})" for a, v in axes.items())
                                         or "none") + ".", "",
           "**Fixed:** " + ", ".join(f"{k} {fmt_value(v)}" for k, v in fixed.items()
                                     if k not in ("dataset", "model", "epochs")) + ".", "",
           f"Each cell: {rep['statistics']} (a cell of one seed has no std).", ""]
    own: dict = {}   # settings of one algorithm only (its parameters), the same in all its groups
    for g in groups:
        for k, v in g["config"].items():
            if k not in fixed and k not in axes and k != "algo":
                own.setdefault(g["algo"], {}).setdefault(k, set()).add(v)
    params = [f"{a}: " + ", ".join(f"{k} {fmt_value(next(iter(v)))}" for k, v in ps.items() if len(v) == 1)
              for a, ps in own.items()]
    if params:
        out[-2:-2] = ["**Parameters of single algorithms:** " + "; ".join(params) + ".", ""]
    out += ["## Test accuracy", ""] + markdown_table(
        ["group", "final test accuracy", "best test accuracy"],
        [[g["label"], cell(g["final_test_acc"]), cell(g["best_test_acc"])] for g in groups])
    t = rep["target"]
    out += [f"## Time to reach test accuracy {t['test_acc']:.4f}", "",
            f"Target: {t['rule']}. Interpolated linearly between evaluations; a mean is over the seeds that "
            "reached the target.", ""]
    out += markdown_table(["group", "wall s", "virtual s", "samples"],
                          [[g["label"], *(_time_cell(g["time_to_target"], k) for k in ("wall_s", "virtual_s",
                                                                                      "samples"))]
                           for g in groups])
    out += list(after_time)
    base, v = rep["baseline"]["algorithm"], rep["variant"]
    out += [f"## Temporal efficiency against {base} (variant: {v['used']})", "",
            "E(a, b) = ∫₀ᵐ f_a dt / ∫₀ᵐ f_b dt (Hermans et al.), m the shorter run's time, "
            "f piecewise linear; "
            f"{v['f']}. Each run against the {base} run of the same seed; E > 1: higher sooner than {base}.", ""]
    if v["note"]:
        out += [f"**Asked for the {v['requested']} variant:** {v['note']}.", ""]
    tm = v.get("time_model")
    if tm is not None and v["used"] == "workers-modelled":
        prov = tm.get("provenance") or {}
        said = "; ".join(f"{k}: {prov[k]}" for k in ("command", "machine", "date", "load") if prov.get(k))
        out += [f"**Modelled time** ({tm['formula']}): V the message's virtual time, W its local steps, step_s "
                "and commit_s the measured seconds of one local step and of one commit's communication (pull, "
                f"push, the server) of its algorithm, from `{tm['file']}`" + (f" ({said})" if said else "") +
                ". The simulated order of messages (and staleness) is kept; each run's axis is stretched by its "
                "algorithm's seconds per virtual second. Column 'E central' is the central variant (the central "
                "model's test accuracy over virtual time), beside it.", ""]
        out += markdown_table(["group", "W", "step s", "commit s", "s per commit", "E (modelled)", "E central",
                               "against"],
                              [[g["label"], str(g["modelled"]["window"]), f"{g['modelled']['step_s']:.5f}",
                                f"{g['modelled']['commit_s']:.5f}", f"{g['modelled']['seconds_per_commit']:.4f}",
                                cell(g["temporal_efficiency"]), cell(g["temporal_efficiency_central"]),
                                g["temporal_efficiency"]["baseline_group"]] for g in groups])
    else:
        out += markdown_table(["group", "E", "against"],
                              [[g["label"], cell(g["temporal_efficiency"]), g["temporal_efficiency"]["baseline_group"]]
                               for g in groups])
    out += ["## Staleness and NaN/Inf updates", ""] + markdown_table(
        ["group", "tau mean", "tau max", "NaN/Inf updates skipped", "diverged runs"],
        [[g["label"], cell(g["tau_mean"], ".2f"), cell(g["tau_max"], ".1f"), cell(g["nonfinite_skipped"], ".1f"),
          f"{len(g['diverged'])} of {len(g['runs'])}"] for g in groups])
    sweep = rep["lr_sweep"]
    out += ["## Learning rates", ""]
    if sweep["rows"]:
        shared = sweep["shared_lr"]
        out += [("Shared learning rate: " + (f"{shared:g}, one that every algorithm was run with"
                                             if shared is not None else "none: no learning rate was used by every "
                                             "algorithm")) + ". The best learning rate is the one with the highest "
                "mean best test accuracy: chosen on TEST accuracy, a description of the sweep, not a valid "
                "selection (the protocol section selects on validation accuracy).", ""]
        shared_head = f"best / final test acc at lr {shared:g}" if shared is not None else "at a shared lr"
        out += markdown_table(["algorithm and settings", "learning rates", "best lr", "its best test acc",
                               "its final test acc", shared_head],
                              [[r["setting"], ", ".join(map(fmt_value, r["lrs"])), fmt_value(r["best_lr"]),
                                cell(r["best_test_acc"]), cell(r["final_test_acc"]),
                                f"{cell(r['shared_lr_test_acc'])} / {cell(r['shared_lr_final_acc'])}"
                                if r["shared_lr_test_acc"] else "none"] for r in sweep["rows"]])
    else:
        out += [f"No learning-rate sweep: {sweep['why_none']}.", ""]
    out += ["## Plots", ""]
    for name, file in rep["plots"].items():
        caption = PLOTS[name][1]
        if name == "heatmap" and rep.get("heatmap"):
            h = rep["heatmap"]
            caption = f"Heat map of the {h['value']} over {h['x']} x {h['y']} (mean over seeds)"
        out += [f"![{name}]({file})", "", f"*{caption}.*", ""]
    for name, why in rep["skipped_plots"].items():
        out += [f"- No {PLOTS[name][0]}: {why}."]
    out += ["", "## Notes", "",
            f"- Variant: {v['used']} ({v['f']})." + (f" Asked for {v['requested']}: {v['note']}." if v["note"] else ""),
            f"- Target: test accuracy {t['test_acc']:.4f}, {t['rule']}.",
            f"- Baseline: {base} ({rep['baseline']['rule']})."]
    diverged = [d for g in groups for d in g["diverged"]]
    out += [f"- Diverged runs: {len(diverged)} of {c['runs']}" + (": " + ", ".join(diverged) if diverged else "") + "."]
    out += [f"- {n}." for n in rep["notes"]]
    return "\n".join(out) + "\n"
