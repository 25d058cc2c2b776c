"""A report's legends stay off its plots: up to report_curves.LEGEND_INSIDE groups inside the axes, more beside
them, naming the first LEGEND_MAX and how many more, in a figure widened to hold them. Checked on reports of 30
and of 3 groups (copies of one run at other rates), each legend's box against every axes' box and the figure's."""
import json
import shutil
from pathlib import Path

import pytest

from stalegrad.cli import main
from stalegrad.study.report import write_report
from stalegrad.study.report_curves import LEGEND_INSIDE, LEGEND_MAX

pytest.importorskip("matplotlib")
from matplotlib.figure import Figure  # noqa: E402

MANY, FEW = 30, 3


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    out = tmp_path_factory.mktemp("one") / "run"
    assert main(["train", "--algo", "asgd", "--workers", "2", "--dataset", "synthetic", "--model", "logreg",
                 "--epochs", "0.5", "--eval-every", "0.125", "--quiet", "--out", str(out)]) == 0
    return out


def groups_of(run: Path, root: Path, n: int) -> Path:
    """``n`` copies of ``run``, each at its own rate in config.json: ``n`` groups for the report."""
    for i in range(n):
        copy = root / f"lr{i}"
        shutil.copytree(run, copy)
        config = json.loads((copy / "config.json").read_text())
        config["lr"] = 0.001 * (i + 1)
        (copy / "config.json").write_text(json.dumps(config))
    return root


def boxes(monkeypatch) -> dict:
    """{file name: (figure box, [axes boxes], [(legend box, [its texts])])} of every figure the report saves,
    measured as it is saved."""
    seen, save = {}, Figure.savefig

    def record(fig, fname, *args, **kwargs):
        fig.canvas.draw()
        r = fig.canvas.get_renderer()
        legends = [leg for leg in [ax.get_legend() for ax in fig.axes] + list(fig.legends) if leg is not None]
        seen[Path(fname).name] = (fig.bbox, [ax.get_window_extent(r) for ax in fig.axes],
                                  [(leg.get_window_extent(r), [t.get_text() for t in leg.get_texts()])
                                   for leg in legends])
        return save(fig, fname, *args, **kwargs)
    monkeypatch.setattr(Figure, "savefig", record)
    return seen


def test_the_legend_of_many_groups_lies_beside_the_axes_and_names_at_most_the_cap(run, tmp_path, monkeypatch):
    assert LEGEND_INSIDE < MANY and LEGEND_MAX < MANY
    seen = boxes(monkeypatch)
    write_report([groups_of(run, tmp_path / "runs", MANY)], tmp_path / "report")
    figure, axes, legends = seen["accuracy.png"]
    assert len(legends) == 1 and len(axes) == 3
    box, texts = legends[0]
    for ax in axes:
        assert not box.overlaps(ax), (box, ax)
    # wholly inside the saved figure: nothing of it cut off
    assert figure.x0 <= box.x0 and box.x1 <= figure.x1 and figure.y0 <= box.y0 and box.y1 <= figure.y1
    assert len(texts) == LEGEND_MAX + 1
    assert texts[-1] == f"... and {MANY - LEGEND_MAX} more (report.md's tables name every group)"
    # the three plots keep a usable width beside it: together at least half the figure
    assert sum(ax.width for ax in axes) > figure.width / 2


def test_the_legend_of_a_few_groups_stays_inside_the_axes(run, tmp_path, monkeypatch):
    seen = boxes(monkeypatch)
    write_report([groups_of(run, tmp_path / "runs", FEW)], tmp_path / "report")
    figure, axes, legends = seen["accuracy.png"]
    (box, texts), = legends
    assert len(texts) == FEW
    last = axes[-1]
    assert last.x0 <= box.x0 and box.x1 <= last.x1 and last.y0 <= box.y0 and box.y1 <= last.y1
