"""``stalegrad report``: tables and plots over many runs and seeds."""
from __future__ import annotations

import click

from ..errors import StalegradError, UsageError
from ..study import selection


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
              help="accuracy for the time-to-target tables: test accuracy, and validation accuracy where the runs "
                   "have --val-split (runs that never reach it are counted as censored)  [default: 0.9 x the best "
                   "group's mean best accuracy]")
@click.option("--baseline", default=None,
              help="algorithm of the temporal efficiency  [default: sgd if present, else the first algorithm in the "
                   "order of 'stalegrad algorithms']")
@click.option("--variant", type=click.Choice(["central", "workers", "workers-modelled"]), default=None,
              help="temporal efficiency of the central model's test accuracy over virtual time, of the workers' "
                   "training accuracy over the simulator's real time, or of the workers' training accuracy over "
                   "modelled cluster time (--time-model; the central variant is shown beside it); the workers "
                   "variants need messages.jsonl (stalegrad >= 0.3)  [default: workers-modelled with "
                   "--time-model, else central]")
@click.option("--time-model", type=click.Path(dir_okay=False), default=None, metavar="FILE.json",
              help="measured seconds per local step and per commit of each algorithm (benchmarks/throughput.py "
                   "writes one): a message at virtual time V of a run with W local steps per message is put at "
                   "T = V x (step_s x W + commit_s) / (step_time x W) seconds")
@click.option("--heatmap", default=None, metavar="X,Y",
              help="the heat map's two settings  [default: workers,window if both vary, else the two with most values]")
@click.option("--select-seeds", default=None, metavar="SEEDS",
              help="seeds the selection sees, e.g. 0-2 or 0,1,2 (at most 10000 seeds)  [default: every seed not in "
                   "--report-seeds]")
@click.option("--report-seeds", default=None, metavar="SEEDS",
              help="seeds whose test accuracy is reported for the selected settings, e.g. 3-9 (at most 10000)  "
                   "[default: every "
                   "seed not in --select-seeds; given neither, both are every seed, and the report says so]")
@click.option("--tune", default=None, metavar="AXES",
              help="the settings selected over, e.g. lr,lam,lam0  [default: lr]")
@click.option("--compare", "claims", default=None, metavar="A>B,...",
              help="claims to test, 'A>B': A more accurate than B  [default: every algorithm against --baseline]")
@click.option("--closure", default=None, metavar="LOW,HIGH",
              help="the gap closure (acc - acc_LOW) / (acc_HIGH - acc_LOW) of the other algorithms  [default: "
                   "asgd,sgd when both ran]")
def report(dirs, out, target, baseline, variant, time_model, heatmap, select_seeds, report_seeds, tune, claims,
           closure):
    """Which algorithm, under which staleness, reaches which accuracy, how fast: tables and plots over seeds.

    The protocol section selects, per algorithm and cell, the --tune settings with the highest mean final
    validation accuracy over --select-seeds (runs made with --val-split; a cell whose runs have none is
    selected on test accuracy, and the report says, cell by cell, that this is not a valid protocol),
    reports their test accuracy on --report-seeds with 95% intervals, tests the claims (--compare,
    --closure) and warns of selected values at a grid edge. A claim that names no algorithm, compares one
    with itself or tunes the seed is refused; one the runs cannot evaluate is a warning line.

    Temporal efficiency (Hermans et al.): with --time-model, the workers' training accuracy over modelled
    cluster time, in which each algorithm runs at its measured cost (seconds per local step and per commit),
    beside the central model's test accuracy over virtual time (equal speed for every algorithm).

    Each DIR is a run directory or holds run directories at any depth. Runs that differ only by
    their seed form one group; every cell is mean ± std over seeds (number of seeds). A damaged run
    is left out with one line on stderr saying why; with no usable run left, nothing is written.
    """
    from ..study.report import write_report

    def skipped(run_dir, reason):
        click.echo(f"stalegrad: warning: skipped {run_dir}: {reason}", err=True)

    def warn(line):
        click.echo(f"stalegrad: warning: {line}", err=True)
    both = set(seed_list("--select-seeds", select_seeds) or ()) & set(seed_list("--report-seeds", report_seeds) or ())
    if both:
        raise click.UsageError(f"--select-seeds and --report-seeds share seed {min(both)}; keep them apart, "
                               "e.g. --select-seeds 0-2 --report-seeds 3-9")
    protocol = {k: v for k, v in {"select_seeds": seed_list("--select-seeds", select_seeds),
                                  "report_seeds": seed_list("--report-seeds", report_seeds),
                                  "tune": names(tune), "compare": names(claims), "closure": names(closure)}.items()
                if v is not None}
    try:
        if variant is None:
            variant = "workers-modelled" if time_model is not None else "central"
        path = write_report(list(dirs), out, target=target, baseline=baseline, variant=variant, heatmap=heatmap,
                            on_skip=skipped, protocol=protocol, time_model=time_model, on_warning=warn)
    except StalegradError as e:
        raise _Failed(e) from None
    click.echo(f"wrote {path}")


def names(text: str | None) -> list[str] | None:
    return None if text is None else [t.strip() for t in text.split(",") if t.strip()]


def seed_list(flag: str, text: str | None) -> list[int] | None:
    """``0-2,5`` -> [0, 1, 2, 5] (``stalegrad.study.selection.seed_list``), its error as click's usage error."""
    try:
        return selection.seed_list(flag, text)
    except UsageError as e:
        raise click.UsageError(str(e)) from None
