"""Figures from run directories: metric curves and staleness histograms.

Needs matplotlib (``pip install 'matplotlib>=3.7'``); it is imported only here.
"""
from __future__ import annotations

from pathlib import Path

from ..errors import RunError, UsageError
from ..run.files import StagedFiles, disk_full
from ..run.results import read_run

X_AXES = ("virtual_s", "wall_s", "epoch", "updates", "samples")
Y_AXES = ("test_acc", "test_loss", "train_loss", "tau_mean", "lr")
# Settings that do not tell runs apart in a legend: where files went, and what follows from the data set.
NOT_LABELS = ("algo", "workers", "data_dir", "checkpoint_every", "record_trace", "probe_every", "train_samples",
              "test_samples")
LABEL_FIRST = ("window", "lr", "delay")


class PlotError(UsageError):
    """Runs that cannot be plotted (one-line message)."""


def labels(runs: list[dict]) -> list[str]:
    """A legend label per run: ``algo xM`` and the settings in which the plotted runs differ (``lr=0.1``,
    ``seed=2``; a setting only some runs have counts where they disagree), the directory as a last resort."""
    from .report import flat_config
    from .report_plots import fmt_value
    flats = [flat_config(r["config"])[0] for r in runs]
    values: dict = {}
    for f in flats:
        for k, v in f.items():
            values.setdefault(k, set()).add(v)
    differ = sorted((k for k, vs in values.items() if len(vs) > 1 and k not in NOT_LABELS),
                    key=lambda k: (LABEL_FIRST.index(k) if k in LABEL_FIRST else len(LABEL_FIRST), k == "seed", k))
    out = [" ".join([f"{fmt_value(f.get('algo'))} x{fmt_value(f.get('workers'))}",
                     *(f"{k}={fmt_value(f[k])}" for k in differ if k in f)]) for f in flats]
    for tell in (lambda r: r["dir"].name, lambda r: str(r["dir"])):
        if len(set(out)) == len(out):
            break
        out = [f"{label} ({tell(r)})" if out.count(label) > 1 else label for label, r in zip(out, runs)]
    return out


def tau_bins(histogram: dict) -> tuple[list[float], list[float]]:
    """(edges, fractions) of a staleness histogram ({"tau": count}): one bin per tau from 0 (or the
    least) to the largest, empty bins included, so that a plot shows them as empty."""
    counts = {int(t): c for t, c in histogram.items()}
    low, high, total = min(0, *counts), max(counts), sum(counts.values()) or 1
    return ([t - 0.5 for t in range(low, high + 2)],
            [counts.get(t, 0) / total for t in range(low, high + 1)])


def figure(runs: list[dict], x: str = "virtual_s", y: str = "test_acc", staleness: bool = True,
           title: str | None = None):
    """The matplotlib figure of ``plot_runs`` for runs read with ``read_run``."""
    from .report_plots import pyplot
    plt = pyplot()
    names = labels(runs)
    cols = 2 if staleness else 1
    fig, axes = plt.subplots(1, cols, figsize=(6.5 * cols, 4.2), squeeze=False)
    ax = axes[0][0]
    for run, name in zip(runs, names):
        points = [(m[x], m[y]) for m in run["metrics"] if m.get(x) is not None and m.get(y) is not None]
        if points:
            xs, ys = zip(*points)
            ax.plot(xs, ys, marker=".", label=name)
    ax.set_xlabel(x.replace("_", " "))
    ax.set_ylabel(y.replace("_", " "))
    ax.grid(alpha=0.3)
    ax.legend()
    if staleness:
        hx = axes[0][1]
        for run, name in zip(runs, names):
            hist = run["staleness"].get("histogram")
            if hist:     # steps over every tau bin: an empty bin is drawn at zero, not bridged by a line
                edges, fractions = tau_bins(hist)
                hx.stairs(fractions, edges, label=name, linewidth=1.5)
        hx.set_xlabel("staleness tau (server updates since the pull)")
        hx.set_ylabel("fraction of updates")
        hx.grid(alpha=0.3)
        hx.legend()
    if title:
        fig.suptitle(title)
    fig.tight_layout()
    return fig


def plot_runs(run_dirs: list[str | Path], out: str | Path, x: str = "virtual_s", y: str = "test_acc",
              staleness: bool = True, title: str | None = None) -> Path:
    """Plot ``y`` over ``x`` for every run (and their tau histograms) into ``out``."""
    if str(out) == "":
        raise PlotError("--out is empty; give an image file name (.png, .pdf, .svg)")
    if x not in X_AXES:
        raise PlotError(f"--x {x!r}: choose one of {', '.join(X_AXES)}")
    if y not in Y_AXES:
        raise PlotError(f"--y {y!r}: choose one of {', '.join(Y_AXES)}")
    from .report_plots import pyplot
    plt = pyplot()
    if plt is None:
        raise PlotError("plotting needs matplotlib: pip install 'matplotlib>=3.7'")
    kind = Path(out).suffix.lower().lstrip(".") or "png"   # (no suffix: a PNG, matplotlib's default)
    if kind not in image_formats():
        raise PlotError(f"--out {out}: .{kind} is not an image format matplotlib writes; use .png, .pdf or .svg "
                        f"(or {', '.join('.' + k for k in image_formats() if k not in ('png', 'pdf', 'svg'))})")
    for d in map(Path, run_dirs):
        if not d.is_dir():
            raise PlotError(f"{d}: no such directory" if not d.exists() else f"{d}: not a directory")
    runs = [read_run(d) for d in run_dirs]
    if not runs:
        raise PlotError("give at least one run directory")
    fig = figure(runs, x, y, staleness, title)
    out = Path(out)
    try:
        with StagedFiles(out.parent) as files:   # the image whole or not at all, and no folder made for nothing
            fig.savefig(files.dir / out.name, dpi=120, format=kind)
    except OSError as e:
        if disk_full(e):
            raise RunError(f"--out {out}: cannot write it ({e.strerror}); nothing was written: free space there, "
                           "or give another --out") from None
        raise PlotError(f"--out {out}: cannot write it ({e.strerror or e}); give another --out") from None
    finally:
        plt.close(fig)
    return out


def image_formats() -> list[str]:
    """The file suffixes matplotlib writes images in (png, pdf, svg, ...): ``--out``'s choices."""
    from matplotlib.backend_bases import FigureCanvasBase
    return list(FigureCanvasBase.get_supported_filetypes())
