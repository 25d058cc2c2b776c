"""The options of a run (stalegrad/run/options.py): the command line's flags are built from them, a grid reads
them without the command line, and their bounds and output directories are checked before anything is
created: one line, exit code 2."""
import math
import random
from pathlib import Path

import click
import pytest

from stalegrad.cli import main
from stalegrad.cli.options import apply_config_file
from stalegrad.cli.run import compare, train
from stalegrad.errors import ConfigError
from stalegrad.run.option_files import option_defaults
from stalegrad.run.options import COMPARE_OPTIONS, MAX_WAIT_S, TRAIN_OPTIONS, check_options
from stalegrad.study.grid import train_params

SMALL = ["--dataset", "digits", "--epochs", "0.05", "-q"]
PROC = Path("/proc/self").is_dir()   # a directory where nobody, root included, can create one


def refused(capsys, *args, says=()):
    """The command is refused with one line on stderr that says each of ``says``; exit code 2."""
    code = main([str(a) for a in args])
    out, err = capsys.readouterr()
    assert code == 2 and err.count("\n") == 1 and err.startswith("stalegrad: error: "), (code, err)
    for words in says:
        assert words in err, err
    return err


@pytest.mark.parametrize("command, options", [(train, TRAIN_OPTIONS), (compare, COMPARE_OPTIONS)])
def test_every_flag_is_an_option_of_the_schema_with_its_default(command, options):
    assert [p.name for p in command.params] == [o.name for o in options]
    ctx = command.make_context(command.name, ["--out", "x"])
    for p, o in zip(command.params, options):
        assert max(p.opts, key=len) == o.flag and set(p.opts) == set(o.flags), o.name
        if o.name != "out":
            assert ctx.params[o.name] == o.parsed_default and type(ctx.params[o.name]) is type(o.parsed_default), o.name


def test_a_grid_cell_parses_as_train_parses_its_config(tmp_path):
    """The grid reads a cell's options without click; ``train --config`` reads them with it: the same values."""
    cell = tmp_path / "cell.toml"
    cell.write_text('algo = "dcasgd-a"\nepochs = 2\nhidden = [8, 4]\nlr_milestones = [1, 2]\nlam0 = 2\n'
                    'vectorised = true\nsame_node_socket = false\nval_split = 0\npartition = "replicate:3"\n')
    ctx = train.make_context("train", ["--config", str(cell)])
    by_click = apply_config_file(ctx, {k: v for k, v in ctx.params.items() if k not in ("out", "resume")})
    algo, by_grid = train_params(cell)
    assert algo == by_click.pop("algo") == "dcasgd-a"
    assert by_grid == by_click and by_grid["epochs"] == 2.0 and by_grid["hidden"] == (8, 4)
    assert [type(v) for v in by_grid.values()] == [type(by_click[k]) for k in by_grid]
    assert set(option_defaults(TRAIN_OPTIONS)) - set(by_grid) == {"algo", "out", "resume", "config_file"}


def test_a_message_time_past_its_bound_is_one_line_and_nothing_is_created(tmp_path, capsys):
    """--message-time 1e308 overflowed the virtual clock and the run exited 0."""
    out = tmp_path / "run"
    refused(capsys, "train", *SMALL, "--message-time", "1e308", "--out", out,
            says=["--message-time must be at most 1e+12 seconds", "got 1e+308"])
    assert not out.exists()
    (tmp_path / "c.toml").write_text("message_time = 2e12\n")
    refused(capsys, "train", *SMALL, "--config", tmp_path / "c.toml", "--out", out,
            says=[f"{tmp_path / 'c.toml'}: message_time must be at most 1e+12"])
    (tmp_path / "g.toml").write_text("[fixed]\nmessage_time = 1e300\n[axes]\nseeds = [0]\n")
    refused(capsys, "grid", tmp_path / "g.toml", "--out", tmp_path / "grid", says=["cell asgd-s0: message_time"])
    assert not out.exists() and not (tmp_path / "grid").exists()


def test_the_bound_keeps_the_longest_transport_finite():
    """At the bound every draw (an exponential of that median, as the event loop draws it, at most 53 medians)
    stays finite, and the bound itself is accepted."""
    params = {o.name: o.parsed_default for o in TRAIN_OPTIONS}
    check_options("asgd", dict(params, message_time=1e12))
    with pytest.raises(ConfigError, match="message_time must be at most"):
        check_options("asgd", dict(params, message_time=1.01e12))
    rng = random.Random(0)
    rng.random = lambda: 1.0 - 2.0 ** -53   # random()'s largest value: the longest draw
    longest = rng.expovariate(math.log(2) / 1e12)
    assert math.isclose(longest, 53e12) and math.isfinite(longest * 1e9)   # a billion such messages


@pytest.mark.parametrize("flag", ["--connect-timeout", "--restart-timeout"])
def test_a_wait_too_long_for_the_clock_is_one_line(tmp_path, capsys, flag):
    """--connect-timeout 1e308 was an OverflowError traceback from the socket."""
    refused(capsys, "train", *SMALL, "--runtime", "ray", "--address", "127.0.0.1:1", flag, "1e308",
            "--out", tmp_path / "run", says=[f"{flag} must be at most {MAX_WAIT_S:g} seconds"])
    (tmp_path / "g.toml").write_text("[fixed]\nepochs = 0.05\n[axes]\nseeds = [0]\n")
    refused(capsys, "grid", tmp_path / "g.toml", "--out", tmp_path / "grid", "--address", "127.0.0.1:1",
            "--connect-timeout", "1e308", says=["--connect-timeout must be at most"])
    assert not (tmp_path / "run").exists() and not (tmp_path / "grid").exists()


@pytest.mark.skipif(not PROC, reason="needs Linux's /proc")
def test_a_tensorboard_directory_that_cannot_be_created_is_one_line(tmp_path, capsys):
    """train gave a FileNotFoundError traceback; grid created DIR, then every cell failed."""
    pytest.importorskip("torch.utils.tensorboard")
    out = tmp_path / "run"
    refused(capsys, "train", *SMALL, "--out", out, "--tensorboard", "/proc/stalegrad-tb",
            says=["--tensorboard is '/proc/stalegrad-tb'"])
    (tmp_path / "g.toml").write_text("[fixed]\nepochs = 0.05\n[axes]\nseeds = [0]\n")
    refused(capsys, "grid", tmp_path / "g.toml", "--out", tmp_path / "grid", "--tensorboard", "/proc/stalegrad-tb",
            says=["--tensorboard is '/proc/stalegrad-tb'"])
    assert not out.exists() and not (tmp_path / "grid").exists() and not Path("/proc/stalegrad-tb").exists()


def test_the_tensorboard_check_leaves_nothing_behind(tmp_path):
    pytest.importorskip("torch.utils.tensorboard")
    from stalegrad.run.tblog import check_logdir
    check_logdir(tmp_path / "a" / "b")
    assert list(tmp_path.iterdir()) == []
    (tmp_path / "tb").mkdir()
    check_logdir(tmp_path / "tb")
    assert list((tmp_path / "tb").iterdir()) == []


def test_a_required_option_stays_required(capsys):
    assert main(["compare", "--algos", "sgd"]) == 2
    assert "Missing option '--out'" in capsys.readouterr().err
    assert isinstance(compare.params[-1].type, click.Path) and compare.params[-1].required
