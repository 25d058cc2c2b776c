"""The simulator's default delay model (gamma:2, measured: docs/delays.md) and the rename of
``uniform`` to ``round-robin`` (issue 21): the old name works for one release, with one message."""
import json
import warnings

import pytest

import stalegrad as sg
from stalegrad.cli import main
from stalegrad.core.delays import DEFAULT_DELAY, DELAY_MODELS, Gamma, RoundRobin, parse_delay
from stalegrad.errors import ConfigError
from stalegrad.runtimes import Simulator

from helpers import TEST, TRAIN

SYNTH = ["--algo", "asgd", "--workers", "4", "--dataset", "synthetic", "--model", "logreg", "--epochs", "0.3",
         "--batch-size", "16", "--seed", "3", "--quiet"]
OLD = "delay 'uniform' is now called 'round-robin'"


def train(runtime=None, algo="asgd"):
    return sg.train("logreg", TRAIN, TEST, algo, 4, runtime, epochs=1, batch_size=8, seed=5)


def deprecations(caught) -> list[str]:
    return [str(w.message) for w in caught if issubclass(w.category, DeprecationWarning) and "uniform" in str(w.message)]


def test_the_default_is_gamma_2_everywhere():
    assert DEFAULT_DELAY == "gamma:2"
    assert Simulator().delay == "gamma:2"
    model = parse_delay(DEFAULT_DELAY, 4)
    assert isinstance(model, Gamma) and model.shape == 2.0
    assert "round-robin" in DELAY_MODELS and "uniform" not in DELAY_MODELS


def test_training_without_a_delay_uses_the_default_bit_for_bit_and_records_it():
    default = train()
    explicit = train(Simulator(delay="gamma:2"))
    lockstep = train(Simulator(delay="round-robin"))
    assert default.config["runtime"]["delay"] == "gamma:2"
    assert default.summary["weights_sha256"] == explicit.summary["weights_sha256"]
    assert default.staleness == explicit.staleness
    # not the old default: round robin has every warm tau = M - 1, gamma:2 spreads them
    assert default.summary["weights_sha256"] != lockstep.summary["weights_sha256"]
    assert set(lockstep.staleness["histogram"]) == {"0", "1", "2", "3"}
    assert len(default.staleness["histogram"]) > 4


def test_round_robin_is_the_lockstep_stress_test():
    assert isinstance(parse_delay("round-robin", 3), RoundRobin)
    res = train(Simulator(delay="round-robin"))
    updates = res.summary["updates"]
    assert res.staleness["histogram"] == {"0": 1, "1": 1, "2": 1, "3": updates - 3}
    assert res.config["runtime"]["delay"] == "round-robin"
    with pytest.raises(ConfigError, match="round-robin"):
        parse_delay("round-robin:2", 3)


def test_uniform_still_works_with_one_deprecation_warning_and_the_bits_of_round_robin():
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        sim = Simulator(delay="uniform")
        old = train(sim)
    assert deprecations(caught) == [OLD + " (the old name goes in the next release)"]   # once, not per parse
    assert sim.delay == "round-robin" and old.config["runtime"]["delay"] == "round-robin"
    new = train(Simulator(delay="round-robin"))
    assert old.summary["weights_sha256"] == new.summary["weights_sha256"]
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        model = parse_delay("uniform", 4)
    assert isinstance(model, RoundRobin) and model.spec == "round-robin" and len(deprecations(caught)) == 1
    with warnings.catch_warnings(record=True) as caught:   # the new name: no message
        warnings.simplefilter("always")
        train(Simulator(delay="round-robin"))
    assert deprecations(caught) == []


def test_a_bad_delay_lists_the_new_names():
    with pytest.raises(ConfigError, match="use one of exponential, gamma:SHAPE, .*round-robin, trace:FILE$"):
        parse_delay("lockstep", 4)


def sha(run_dir) -> str:
    return json.loads((run_dir / "summary.json").read_text())["weights_sha256"]


def test_cli_default_is_recorded_and_equals_the_explicit_spec(tmp_path, capsys):
    assert main(["train", *SYNTH, "--out", str(tmp_path / "default")]) == 0
    assert main(["train", *SYNTH, "--delay", "gamma:2", "--out", str(tmp_path / "explicit")]) == 0
    assert main(["train", *SYNTH, "--delay", "round-robin", "--out", str(tmp_path / "rr")]) == 0
    assert "uniform" not in capsys.readouterr().err
    config = json.loads((tmp_path / "default" / "config.json").read_text())
    assert config["runtime"]["delay"] == "gamma:2"
    assert sha(tmp_path / "default") == sha(tmp_path / "explicit") != sha(tmp_path / "rr")


def test_cli_and_toml_accept_uniform_once_with_a_warning(tmp_path, capsys):
    assert main(["train", *SYNTH, "--delay", "round-robin", "--out", str(tmp_path / "rr")]) == 0
    capsys.readouterr()
    assert main(["train", *SYNTH, "--delay", "uniform", "--out", str(tmp_path / "flag")]) == 0
    err = capsys.readouterr().err
    assert err.count("stalegrad: warning: " + OLD) == 1 and err.count("uniform") == 1
    toml = tmp_path / "run.toml"
    toml.write_text('delay = "uniform"\n')
    assert main(["train", *SYNTH, "--config", str(toml), "--out", str(tmp_path / "toml")]) == 0
    assert capsys.readouterr().err.count(OLD) == 1
    for run in ("flag", "toml"):
        assert json.loads((tmp_path / run / "config.json").read_text())["runtime"]["delay"] == "round-robin"
        assert sha(tmp_path / run) == sha(tmp_path / "rr")


def test_a_grid_with_uniform_warns_once_for_all_its_cells(tmp_path, capsys):
    grid = tmp_path / "g.toml"
    grid.write_text('[fixed]\ndataset = "synthetic"\nmodel = "logreg"\nepochs = 0.2\n'
                    '[axes]\nseeds = [0, 1, 2]\ndelay = ["uniform", "gamma:2"]\n')
    assert main(["grid", str(grid), "--out", str(tmp_path / "out"), "--dry-run"]) == 0
    out, err = capsys.readouterr()
    assert err.count(OLD) == 1 and "6 cells" in out
    assert main(["grid", str(grid), "--out", str(tmp_path / "out"), "--dry-run"]) == 0   # each command: once
    assert capsys.readouterr().err.count(OLD) == 1


def test_an_empty_delay_is_refused_not_taken_for_the_default(tmp_path, capsys):
    assert main(["train", *SYNTH, "--delay", "", "--out", str(tmp_path / "r")]) == 2
    err = capsys.readouterr().err
    assert err.startswith("stalegrad: error: --delay '' is not a delay model") and len(err.splitlines()) == 1
    assert not (tmp_path / "r").exists()


# ---- issue 32: parameters a sampler cannot draw in bounded time, negative ids in bare-id traces ------------
@pytest.mark.parametrize("spec", ["gamma:1e308", "gamma:9e307", "gamma:1e7", "gamma:0.001", "gamma:1e-320",
                                  "straggler:0.5", "straggler:1e-300", "straggler:1e13"])
def test_delay_parameters_out_of_their_bounds_are_refused_when_parsed(spec):
    """gamma:1e308 and gamma:9e307 spun forever in random.gammavariate (sqrt(2*SHAPE - 1) overflows); the
    others are no compute times (all draws 1, most draws 0, a clock that stops)."""
    with pytest.raises(ConfigError, match=r"^delay '.*': (SHAPE|K) must be a number from "):
        parse_delay(spec, 4)


def test_the_bounds_of_gamma_draw_finite_times_at_once():
    import math
    import random
    rng = random.Random(0)
    for spec in ("gamma:0.01", "gamma:1e6"):
        model = parse_delay(spec, 4)
        draws = [model.factor(0, rng) for _ in range(2000)]
        assert all(math.isfinite(d) and d >= 0 for d in draws), spec
    assert parse_delay("straggler:1", 2).longest(2) == 1.0 and parse_delay("straggler:1e12", 2).slowdown == 1e12
    with pytest.raises(ConfigError, match="SHAPE must be a number from 0.01 to 1e\\+06"):
        Gamma(shape=1e308)            # a model built in Python is held to the same bounds


def test_a_grid_dry_run_refuses_a_delay_the_sampler_cannot_draw(tmp_path, capsys):
    grid = tmp_path / "g.toml"
    grid.write_text('[fixed]\ndataset = "synthetic"\nmodel = "logreg"\ndelay = "gamma:9e307"\n[axes]\nseeds = [0]\n')
    assert main(["grid", str(grid), "--dry-run"]) == 2
    err = capsys.readouterr().err
    assert len(err.splitlines()) == 1 and "gamma:9e307" in err and "SHAPE must be a number from" in err, err


@pytest.mark.parametrize("bad", ["-5", "-1"])
def test_a_bare_id_trace_with_a_negative_id_is_refused_like_the_csv_form(tmp_path, capsys, bad):
    """-5 crashed mid-run with an IndexError (a half-written run directory); -1 became the last worker."""
    trace = tmp_path / "t.txt"
    trace.write_text(f"0\n1\n{bad}\n0\n")
    with pytest.raises(ConfigError, match=rf"push 3 names worker {bad}; worker ids count from 0$"):
        parse_delay(f"trace:{trace}", 2)
    csv = tmp_path / "t.csv"
    csv.write_text(f"worker\n0\n1\n{bad}\n")
    with pytest.raises(ConfigError, match="worker ids count from 0"):
        parse_delay(f"trace:{csv}", 2)
    code = main(["train", *SYNTH, "--workers", "2", "--delay", f"trace:{trace}", "--out", str(tmp_path / "r")])
    err = capsys.readouterr().err
    assert code == 2 and len(err.splitlines()) == 1 and "worker ids count from 0" in err, err
    assert not (tmp_path / "r").exists()
