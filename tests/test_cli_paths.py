"""An empty path ("") is refused by every path option and argument, before anything is written: it would
mean the current directory (``--out ""``) or torch's default ``./runs/...`` (``--tensorboard ""``)."""
import pytest

from stalegrad.cli import main

RUN = ["--dataset", "synthetic", "--model", "logreg", "--epochs", "0.1", "--quiet"]
GRID = '[fixed]\ndataset = "synthetic"\nmodel = "logreg"\nepochs = 0.1\n[axes]\nseeds = [0]\n'

CASES = [
    (["train", *RUN, "--out", ""], "'--out'"),
    (["train", *RUN, "--out", "r", "--tensorboard", ""], "'--tensorboard'"),
    (["train", *RUN, "--out", "r", "--runtime", "local", "--record-trace", ""], "'--record-trace'"),
    (["train", *RUN, "--out", "r", "--data-dir", ""], "'--data-dir'"),
    (["train", *RUN, "--out", "r", "--config", ""], "'--config'"),
    (["train", "--resume", ""], "'--resume'"),
    (["compare", *RUN, "--out", ""], "'--out'"),
    (["compare", *RUN, "--out", "c", "--tensorboard", ""], "'--tensorboard'"),
    (["grid", "g.toml", "--out", ""], "'--out'"),
    (["grid", "g.toml", "--out", "G", "--tensorboard", ""], "'--tensorboard'"),
    (["grid", "", "--out", "G"], "'FILE'"),
    (["report", "g.toml", "--out", ""], "'--out'"),
    (["report", "", "--out", "rep"], "'DIRS...'"),
    (["plot", "g.toml", "--out", ""], "'--out'"),
    (["plot", "", "--out", "f.png"], "'RUNS...'"),
    (["data", "fetch", "mnist", "--dest", ""], "'--dest'"),
]


@pytest.mark.parametrize("args,option", CASES, ids=[" ".join(a[:1] + [o]) for a, o in CASES])
def test_an_empty_path_is_one_line_exit_2_and_nothing_is_written(tmp_path, monkeypatch, capsys, args, option):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "g.toml").write_text(GRID)
    assert main(args) == 2
    err = capsys.readouterr().err
    assert err.startswith("stalegrad: error: ") and err.count("\n") == 1, err
    assert option in err and "is empty" in err, err
    assert [p.name for p in tmp_path.iterdir()] == ["g.toml"]       # no ./runs, no run files in .


@pytest.mark.parametrize("key", ["out", "tensorboard", "data_dir"])
def test_an_empty_path_in_a_config_file_is_refused(tmp_path, monkeypatch, capsys, key):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "c.toml").write_text(f'{key} = ""\n')
    out = [] if key == "out" else ["--out", "r"]
    assert main(["train", *RUN, "--config", "c.toml", *out]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and f"{key}: is empty" in err, err
    assert [p.name for p in tmp_path.iterdir()] == ["c.toml"]


def test_an_empty_path_in_a_grid_file_is_refused(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "g.toml").write_text(GRID.replace("[axes]", 'data_dir = ""\n[axes]'))
    assert main(["grid", "g.toml", "--out", "G"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "cell asgd-s0: data_dir: is empty" in err, err
    assert not (tmp_path / "G").exists()


def test_the_library_refuses_empty_output_paths(tmp_path):
    from stalegrad.errors import UsageError
    from stalegrad.study.report import write_report
    from stalegrad.run.tblog import check_logdir
    with pytest.raises(UsageError, match="tensorboard is empty"):
        check_logdir("")
    with pytest.raises(UsageError, match="--out is empty"):
        write_report([tmp_path], "")
    pytest.importorskip("matplotlib")
    from stalegrad.study.plot import plot_runs
    with pytest.raises(UsageError, match="--out is empty"):
        plot_runs([tmp_path], "")
