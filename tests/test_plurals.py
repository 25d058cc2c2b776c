"""Counts read as English: "1 epoch", "0.5 epochs", "1 cell", wherever stalegrad prints them."""
import pytest

from stalegrad.cli import main
from stalegrad.run.progress import count

RUN = ["--dataset", "synthetic", "--model", "logreg", "--quiet"]


def test_count():
    assert [count(n, "epoch") for n in (1, 1.0, 0.5, 2, 0)] == ["1 epoch", "1 epoch", "0.5 epochs", "2 epochs",
                                                                 "0 epochs"]
    assert count(1.00001, "epoch", ".4g") == "1 epoch" and count(1.5, "epoch", ".4g") == "1.5 epochs"


def test_one_epoch_in_compare_and_report(tmp_path, capsys):
    pytest.importorskip("matplotlib")
    assert main(["compare", "--algos", "sgd", *RUN, "--epochs", "1", "--out", str(tmp_path / "cmp")]) == 0
    assert "synthetic / logreg, 1 epoch, batch 128" in capsys.readouterr().out
    assert main(["report", str(tmp_path / "cmp"), "--out", str(tmp_path / "rep")]) == 0
    md = (tmp_path / "rep" / "report.md").read_text()
    assert "**Compared:** 1 run in 1 group; data set synthetic, model logreg, 1 epoch; seeds 0" in md


def test_resume_says_one_epoch(tmp_path, capsys):
    out = str(tmp_path / "r")
    assert main(["train", "--algo", "asgd", "--workers", "2", *RUN, "--epochs", "1", "--checkpoint-every", "4",
                 "--out", out]) == 0
    capsys.readouterr()
    assert main(["train", "--resume", out, "--epochs", "0.5"]) == 2
    assert "the run to resume is configured for 1 epoch, and a resumed run" in capsys.readouterr().err


def test_a_grid_of_one_cell(tmp_path, capsys):
    grid = tmp_path / "g.toml"
    grid.write_text('[fixed]\ndataset = "synthetic"\nmodel = "logreg"\n[axes]\nseeds = [0]\n')
    assert main(["grid", str(grid), "--dry-run"]) == 0
    assert f"{grid}: 1 cell (asgd 1), every one valid" in capsys.readouterr().out
