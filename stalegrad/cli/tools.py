"""``stalegrad plot``, ``stalegrad algorithms`` and ``stalegrad data fetch``."""
from __future__ import annotations

import json
from pathlib import Path

import click

from ..algorithms import ALGORITHMS
from ..data import DATASETS


@click.command()
@click.argument("runs", nargs=-1, required=True, type=click.Path(file_okay=False))
@click.option("--out", type=click.Path(dir_okay=False), required=True, help="image file (.png, .pdf, .svg)")
@click.option("--x", "x_axis", default="virtual_s", show_default=True, help="virtual_s, wall_s, epoch, updates or samples")
@click.option("--y", "y_axis", default="test_acc", show_default=True, help="test_acc, test_loss, train_loss, tau_mean or lr")
@click.option("--no-staleness", is_flag=True, help="leave out the staleness histogram panel")
@click.option("--title", default=None)
def plot(runs, out, x_axis, y_axis, no_staleness, title):
    """Plot the metric curves (and tau histograms) of run directories.

    A compare directory stands for all its runs.
    """
    from ..study.plot import plot_runs
    dirs = []
    for r in map(Path, runs):
        inner = sorted(p.parent for p in r.glob("*/summary.json")) if not (r / "summary.json").exists() else []
        dirs.extend(inner or [r])
    path = plot_runs(dirs, out, x=x_axis, y=y_axis, staleness=not no_staleness, title=title)
    click.echo(f"wrote {path}")


@click.command("algorithms")
@click.option("--json", "as_json", is_flag=True, help="machine-readable output")
def algorithms(as_json):
    """Every algorithm with its update rule, parameters and defaults."""
    if as_json:
        click.echo(json.dumps({n: {"summary": c.summary, "rule": c.rule, "synchronous": c.synchronous,
                                   "parameters": {f.name: {"default": f.default, "flag": f.metadata["flag"],
                                                           "help": f.metadata["help"]} for f in c.hyperparameters()}}
                               for n, c in ALGORITHMS.items()}, indent=2))
        return
    for name, cls in ALGORITHMS.items():
        kind = "synchronous" if cls.synchronous else ("sequential" if cls.sequential else "asynchronous")
        click.echo(f"{name}  ({kind})\n  {cls.summary}\n  rule: {cls.rule}")
        for f in cls.hyperparameters():
            choices = f.metadata.get("choices")
            extra = f"  one of {', '.join(choices)}" if choices else ""
            click.echo(f"    {f.metadata['flag']:<20} {f.default!s:<8} {f.metadata['help']}{extra}")
        click.echo("")
    click.echo(server_kernels_line())


def server_kernels_line() -> str:
    """Which path the parameter server takes here for float32 weights on the CPU."""
    from ..algorithms import fused
    info = fused.describe()
    if info["server_kernels"] == "numba":
        return (f"server kernels: fused (numba {info['numba']}, {info['threading_layer']} threads, loaded in "
                f"{info['load_s']:.1f} s); STALEGRAD_KERNELS=torch for torch operators")
    return f"server kernels: torch operators ({info['why']})"


@click.group()
def data():
    """Data sets: fetch them into the cache."""


@data.command("fetch")
@click.argument("name", type=click.Choice(DATASETS))
@click.option("--dest", type=click.Path(file_okay=False), default=None, help="target directory [default: the user cache]")
def data_fetch(name, dest):
    """Download a data set from its canonical source, checking its checksums."""
    from ..data import FILE_DATASETS, fetch
    path = fetch(name, Path(dest) if dest else None)
    if name in FILE_DATASETS:
        click.echo(f"{name}: ready in {path}")
