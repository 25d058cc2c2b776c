"""Figures from run directories: metric curves and staleness histograms.

Needs matplotlib (``pip install 'stalegrad[plot]'``); it is imported only here.
"""
from __future__ import annotations

from pathlib import Path

from .errors import UsageError
from .results import read_run

X_AXES = ("virtual_s", "wall_s", "epoch", "updates", "samples")
Y_AXES = ("test_acc", "test_loss", "train_loss", "tau_mean", "lr")


class PlotError(UsageError):
    """Runs that cannot be plotted (one-line message)."""


def _label(run: dict) -> str:
    cfg = run["config"]
    return f"{cfg['algorithm']['name']} x{cfg['workers']}"


def plot_runs(run_dirs: list[str | Path], out: str | Path, x: str = "virtual_s", y: str = "test_acc",
              staleness: bool = True, title: str | None = None) -> Path:
    """Plot ``y`` over ``x`` for every run (and their tau histograms) into ``out``."""
    if str(out) == "":
        raise PlotError("--out is empty; give an image file name (.png, .pdf, .svg)")
    if x not in X_AXES:
        raise PlotError(f"--x {x!r}: choose one of {', '.join(X_AXES)}")
    if y not in Y_AXES:
        raise PlotError(f"--y {y!r}: choose one of {', '.join(Y_AXES)}")
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        raise PlotError("plotting needs matplotlib: pip install 'stalegrad[plot]'") from None
    runs = [read_run(d) for d in run_dirs]
    if not runs:
        raise PlotError("give at least one run directory")
    cols = 2 if staleness else 1
    fig, axes = plt.subplots(1, cols, figsize=(6.5 * cols, 4.2), squeeze=False)
    ax = axes[0][0]
    for run in runs:
        points = [(m[x], m[y]) for m in run["metrics"] if m.get(x) is not None and m.get(y) is not None]
        if points:
            xs, ys = zip(*points)
            ax.plot(xs, ys, marker=".", label=_label(run))
    ax.set_xlabel(x.replace("_", " "))
    ax.set_ylabel(y.replace("_", " "))
    ax.grid(alpha=0.3)
    ax.legend()
    if staleness:
        hx = axes[0][1]
        for run in runs:
            hist = run["staleness"]["histogram"]
            if hist:
                taus = [int(t) for t in hist]
                total = sum(hist.values())
                hx.plot(taus, [hist[str(t)] / total for t in taus], marker="o", label=_label(run))
        hx.set_xlabel("staleness tau (server updates since the pull)")
        hx.set_ylabel("fraction of updates")
        hx.grid(alpha=0.3)
        hx.legend()
    if title:
        fig.suptitle(title)
    fig.tight_layout()
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=120)
    plt.close(fig)
    return out
