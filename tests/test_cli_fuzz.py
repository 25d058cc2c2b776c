"""The command line under random input: never a traceback, exit 0 or 2, and a refused
command leaves no new directory. (A run that starts and then fails, e.g. a NaN under
--on-nonfinite stop, exits 1 with one line; that is allowed too.)"""
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from stalegrad.algorithms import ALGORITHMS
from stalegrad.cli import main

NUMBERS = ["0", "-1", "nan", "inf", "-inf", "x", "", "1e400", "99999999999999999999999"]
CHOICES = {
    "--algo": [*ALGORITHMS, "foo"],
    "--workers": ["1", "2", "3", "0", "-1", "x", "1e3", "100000"],
    "--epochs": ["0.05", "0.1", "1e-9", *NUMBERS],
    "--batch-size": ["8", "32", "1000000", *NUMBERS],
    "--lr": ["0.01", "0.1", "1e30", *NUMBERS],
    "--lr-milestones": ["0.02", "0.02,0.04", "2,1", "0.04,0.04", "a,b", *NUMBERS],
    "--lr-gamma": ["0.5", *NUMBERS],
    "--eval-every": ["0.05", "0.5", *NUMBERS],
    "--delay": ["uniform", "gamma:2", "gamma:-1", "gamma:nan", "straggler:3", "heterogeneous:sqrt",
                "heterogeneous:x", "trace:/nonexistent.csv", "trace:", "warp", "exponential"],
    "--step-time": ["1", "0.5", *NUMBERS],
    "--runtime": ["sim", "bogus"],
    "--threads-per-worker": ["1", "0", "x"],
    "--worker-timeout": ["300", *NUMBERS],
    "--ps-shards": ["1", "2", "0", "x"], "--cpus-per-worker": ["1", *NUMBERS], "--gpus-per-worker": ["0", "1", "-1"],
    "--address": ["auto", "127.0.0.1:1"],
    "--init": ["torch", "glorot-uniform", "he-normal", "x"],
    "--device": ["cpu", "tpu", "cuda:0", "cuda:x"],
    "--seed": ["0", "7", "4294967295", "4294967296", *NUMBERS],
    "--partition": ["shard", "iid", "x"],
    "--on-nonfinite": ["skip", "stop", "x"],
    "--checkpoint-every": ["0", "3", "-1", "x"],
    "--model": ["logreg", "mlp", "cnn", "resnet20", "x"],
    "--hidden": ["16", "8,8", "0", "x,y", ""],
    "--lam": ["0.04", *NUMBERS], "--lam0": ["2", *NUMBERS], "--eps": ["1e-7", *NUMBERS],
    "--ms-momentum": ["0.95", "1", *NUMBERS], "--momentum": ["0.9", "1.5", *NUMBERS],
    "--weight-decay": ["1e-4", *NUMBERS], "--local-weight-decay": ["1e-4", *NUMBERS],
    "--window": ["1", "3", "2.5", *NUMBERS], "--local-opt": ["adam", "sgd", "x"],
    "--local-momentum": ["0.9", *NUMBERS], "--rho": ["5", *NUMBERS], "--elastic-lr": ["0.01", "0.5", *NUMBERS],
    "--beta": ["0.9", "1.5", *NUMBERS],
}
FLAGS = ["--vectorised", "--overwrite"]

options = st.fixed_dictionaries({}, optional={k: st.sampled_from(v) for k, v in CHOICES.items()})
flags = st.lists(st.sampled_from(FLAGS), unique=True)


@settings(max_examples=60, deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(opts=options, extra=flags, record=st.sampled_from([None, "ok", "/proc/t.csv"]))
def test_random_options_never_give_a_traceback(tmp_path_factory, capsys, opts, extra, record):
    base = tmp_path_factory.mktemp("fuzz")
    out = base / "new" / "run"
    args = ["train", "--dataset", "synthetic", "--quiet", "--out", str(out), *extra]
    for flag, value in opts.items():
        args += [flag, value]
    if record is not None:
        args += ["--record-trace", str(base / "t.csv") if record == "ok" else record]
    if opts.get("--epochs") in ("0.05", "0.1", "1e-9") or "--epochs" not in opts:
        args += ["--epochs", opts.get("--epochs", "0.05")]     # keep valid runs short
    code = main(args)
    err = capsys.readouterr().err
    assert "Traceback" not in err, (args, err)
    lines = err.strip().splitlines()
    if code == 0:
        assert (out / "summary.json").exists(), args
    elif code == 2:
        assert len(lines) == 1 and lines[0].startswith("stalegrad: error:"), (args, err)
        assert not (base / "new").exists(), (args, err)      # nothing created for a refused command
    else:
        assert code == 1 and "NaN or Inf" in err, (args, code, err)
