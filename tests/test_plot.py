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
