"""stalegrad plot: a real image from real runs."""
import pytest

from stalegrad.cli import main

pytest.importorskip("matplotlib")


def test_plot_of_a_comparison(tmp_path, capsys):
    assert main(["compare", "--algos", "asgd,dcasgd-a", "--workers", "3", "--dataset", "synthetic", "--model",
                 "logreg", "--epochs", "2", "--eval-every", "0.5", "--quiet", "--out", str(tmp_path / "cmp")]) == 0
    png = tmp_path / "fig.png"
    assert main(["plot", str(tmp_path / "cmp"), "--out", str(png), "--y", "test_loss"]) == 0
    data = png.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 10_000
    # width x height from the IHDR chunk: two panels side by side
    width, height = int.from_bytes(data[16:20], "big"), int.from_bytes(data[20:24], "big")
    assert width > 1.8 * height


def test_plot_bad_input(tmp_path, capsys):
    code = main(["plot", str(tmp_path), "--out", str(tmp_path / "f.png")])
    err = capsys.readouterr().err
    assert code == 2 and "not a finished stalegrad run" in err
    (tmp_path / "r").mkdir()
    code = main(["plot", str(tmp_path), "--out", str(tmp_path / "f.png"), "--y", "colour"])
    assert code == 2


RUN = ["--dataset", "synthetic", "--model", "logreg", "--epochs", "0.5", "--eval-every", "0.25", "--quiet"]


@pytest.fixture(scope="module")
def three(tmp_path_factory):
    """dcasgd-a with 4 workers: seed 0 at lr 0.1 and 0.05, and seed 1 at lr 0.1."""
    root = tmp_path_factory.mktemp("plot")
    for name, extra in (("a", []), ("b", ["--lr", "0.05"]), ("c", ["--seed", "1"])):
        assert main(["train", "--algo", "dcasgd-a", "--workers", "4", *RUN, *extra, "--out", str(root / name)]) == 0
    return root


def test_a_missing_run_directory_is_said_to_be_missing(tmp_path, capsys):
    code = main(["plot", str(tmp_path / "nope"), "--out", str(tmp_path / "f.png")])
    err = capsys.readouterr().err
    assert code == 2 and err.count("\n") == 1 and f"{tmp_path / 'nope'}: no such directory" in err, err
    assert not (tmp_path / "f.png").exists()


def test_legend_labels_say_what_differs_between_the_runs(three, tmp_path):
    import shutil

    from stalegrad.study.plot import figure, labels
    from stalegrad.run.results import read_run
    runs = [read_run(three / n) for n in "abc"]
    assert labels(runs) == ["dcasgd-a x4 lr=0.1 seed=0", "dcasgd-a x4 lr=0.05 seed=0", "dcasgd-a x4 lr=0.1 seed=1"]
    fig = figure(runs)
    for ax in fig.axes:     # the curves and the histograms
        assert [t.get_text() for t in ax.get_legend().get_texts()] == labels(runs)
    assert labels(runs[:2]) == ["dcasgd-a x4 lr=0.1", "dcasgd-a x4 lr=0.05"]     # the seed is the same
    shutil.copytree(three / "a", tmp_path / "twin")
    assert labels([runs[0], read_run(tmp_path / "twin")]) == ["dcasgd-a x4 (a)", "dcasgd-a x4 (twin)"]


def test_the_tau_histogram_shows_empty_bins_as_empty(three, tmp_path):
    import json
    import shutil

    from stalegrad.study.plot import figure, tau_bins
    from stalegrad.run.results import read_run
    assert tau_bins({"0": 3, "2": 1}) == ([-0.5, 0.5, 1.5, 2.5], [0.75, 0.0, 0.25])
    shutil.copytree(three / "a", tmp_path / "gap")
    st = json.loads((tmp_path / "gap" / "staleness.json").read_text())
    st["histogram"] = {"0": 2, "1": 2, "4": 4}
    (tmp_path / "gap" / "staleness.json").write_text(json.dumps(st))
    fig = figure([read_run(tmp_path / "gap"), read_run(three / "b")])
    hx = fig.axes[1]
    assert not hx.get_lines()                                    # no line bridging the empty bins
    values = [list(p.get_data().values) for p in hx.patches]
    assert values[0] == [0.25, 0.25, 0.0, 0.0, 0.5]
