"""``stalegrad report``: tables and plots over many runs and seeds."""
from __future__ import annotations

import click

from ..errors import StalegradError


class _Failed(click.ClickException):
    """A library error as click's one-line error, with the library's exit code (2 for bad input)."""

    def __init__(self, error: StalegradError):
        super().__init__(" ".join(str(error).split()) or type(error).__name__)
        self.exit_code = error.exit_code


@click.command()
@click.argument("dirs", nargs=-1, required=True, type=click.Path(file_okay=False))
@click.option("--out", type=click.Path(file_okay=False), required=True,
              help="directory for report.md, report.json and the PNG plots")
@click.option("--target", type=float, default=None,
              help="test accuracy for the time-to-target table  [default: 0.9 x the best group's mean best accuracy]")
@click.option("--baseline", default=None,
              help="algorithm of the temporal efficiency  [default: sgd if present, else the first algorithm in the "
                   "order of 'stalegrad algorithms']")
@click.option("--variant", type=click.Choice(["central", "workers"]), default="central", show_default=True,
              help="temporal efficiency of the central model's test accuracy over virtual time, or of the "
                   "workers' training accuracy over real time (needs messages.jsonl, stalegrad >= 0.3)")
@click.option("--heatmap", default=None, metavar="X,Y",
              help="the heat map's two settings  [default: workers,window if both vary, else the two with most values]")
def report(dirs, out, target, baseline, variant, heatmap):
    """Which algorithm, under which staleness, reaches which accuracy, how fast: tables and plots over seeds.

    Each DIR is a run directory or holds run directories at any depth. Runs that differ only by
    their seed form one group; every cell is mean ± std over seeds (number of seeds). A damaged run
    is left out with one line on stderr saying why; with no usable run left, nothing is written.
    """
    from ..report import write_report

    def skipped(run_dir, reason):
        click.echo(f"stalegrad: warning: skipped {run_dir}: {reason}", err=True)
    try:
        path = write_report(list(dirs), out, target=target, baseline=baseline, variant=variant, heatmap=heatmap,
                            on_skip=skipped)
    except StalegradError as e:
        raise _Failed(e) from None
    click.echo(f"wrote {path}")
