"""The command line as a user drives it: every algorithm end to end, bad input."""
import json
import subprocess
import sys

import pytest
import torch

from stalegrad.algorithms import ALGORITHMS
from stalegrad.cli import main
from stalegrad.run.results import load_model, read_run


def cli(capsys, *args):
    code = main([str(a) for a in args])
    out, err = capsys.readouterr()
    return code, out, err


def window_flag(algo):
    return ["--window", "2"] if "window" in {f.name for f in ALGORITHMS[algo].hyperparameters()} else []


@pytest.mark.parametrize("dataset,model", [("digits", "mlp"), ("synthetic", "logreg")])
@pytest.mark.parametrize("algo", list(ALGORITHMS))
def test_every_algorithm_end_to_end(tmp_path, capsys, dataset, model, algo):
    out = tmp_path / "run"
    workers = 1 if algo == "sgd" else 3
    code, stdout, err = cli(capsys, "train", "--algo", algo, "--workers", workers, "--dataset", dataset,
                            "--model", model, "--epochs", 1, "--batch-size", 32, "--quiet", "--out", out,
                            *window_flag(algo))
    assert code == 0, err
    assert f"{algo} x{workers}: test acc" in stdout
    run = read_run(out)
    s = run["summary"]
    assert s["algorithm"] == algo and s["workers"] == workers
    assert 0.0 <= s["final_test_acc"] <= 1.0 and s["samples"] >= run["config"]["train_samples"]
    assert len(s["weights_sha256"]) == 64 and s["nonfinite_skipped"] == 0
    required = {"epoch", "updates", "samples", "wall_s", "virtual_s", "train_loss", "test_loss", "test_acc"}
    assert all(required <= m.keys() for m in run["metrics"])
    assert [m["epoch"] for m in run["metrics"]][0] == 0
    assert run["staleness"]["updates"] == sum(w["updates"] for w in run["staleness"]["per_worker"])
    assert run["config"]["algorithm"]["name"] == algo and run["config"]["dataset"] == dataset
    model_ = load_model(out)
    flat = torch.cat([p.detach().reshape(-1) for p in model_.parameters()])
    saved = torch.load(out / "model.pt", weights_only=True)["weights"]
    assert torch.equal(flat, saved)


def test_training_learns_digits(tmp_path, capsys):
    code, _, err = cli(capsys, "train", "--algo", "dcasgd-a", "--workers", 4, "--dataset", "digits",
                       "--epochs", 8, "--batch-size", 16, "--quiet", "--out", tmp_path / "r")
    assert code == 0, err
    assert read_run(tmp_path / "r")["summary"]["final_test_acc"] > 0.85


def test_same_seed_same_hash_through_the_cli(tmp_path, capsys):
    hashes = []
    for i, seed in enumerate((1, 1, 2)):
        code, _, err = cli(capsys, "train", "--algo", "agn", "--workers", 4, "--delay", "exponential", "--epochs", 1,
                           "--batch-size", 32, "--seed", seed, "--quiet", "--out", tmp_path / str(i))
        assert code == 0, err
        hashes.append(read_run(tmp_path / str(i))["summary"]["weights_sha256"])
    assert hashes[0] == hashes[1] != hashes[2]


def test_config_file_and_flags_combine_flags_win(tmp_path, capsys):
    cfg = tmp_path / "c.toml"
    cfg.write_text('algo = "dcasgd-c"\nworkers = 3\nlam = 0.5\nbatch-size = 16\nepochs = 0.5\n'
                   'lr_milestones = [0.25]\n')
    code, _, err = cli(capsys, "train", "--config", cfg, "--workers", 2, "--quiet", "--out", tmp_path / "r")
    assert code == 0, err
    conf = read_run(tmp_path / "r")["config"]
    assert conf["algorithm"] == {"name": "dcasgd-c", "momentum": 0.0, "weight_decay": 0.0, "lam": 0.5}
    assert conf["workers"] == 2 and conf["batch_size"] == 16 and conf["lr_milestones"] == [0.25]


def test_compare_prints_a_table(tmp_path, capsys):
    code, out, err = cli(capsys, "compare", "--algos", "sgd,asgd,agn", "--workers", 3, "--dataset", "synthetic",
                         "--model", "logreg", "--epochs", 1, "--batch-size", 32, "--window", 2, "--quiet",
                         "--out", tmp_path)
    assert code == 0, err
    rows = json.loads((tmp_path / "comparison.json").read_text())["rows"]
    assert [r["algorithm"] for r in rows] == ["sgd", "asgd", "agn"]
    assert [r["workers"] for r in rows] == [1, 3, 3]
    assert rows[0]["temporal_efficiency"] == pytest.approx(1.0)
    assert "| sgd | 1 |" in out and "| agn | 3 |" in out


COMPARE = ["compare", "--dataset", "synthetic", "--model", "logreg", "--epochs", 0.2, "--batch-size", 32, "--quiet"]


@pytest.mark.parametrize("args,needle", [
    (["--algos", "asgd,asgd"], "--algos lists asgd twice"),
    (["--algos", "sgd,asgd", "--lam", "0.1"], "--lam applies to none of the compared algorithms (sgd, asgd)"),
    (["--algos", "sgd,asgd,agn", "--window", "0"], "agn: --window must be a positive integer"),
    (["--algos", "sgd,dcasgd-a", "--ms-momentum", "1.5"], "dcasgd-a: --ms-momentum must be in [0, 1)"),
    # sgd's one worker has every sample; asgd's four have a quarter each: found before sgd trains
    (["--algos", "sgd,asgd", "--workers", "4", "--batch-size", "2000"], "--batch-size is 2000, larger than each worker's"),
])
def test_compare_checks_every_run_before_the_first_trains(tmp_path, capsys, args, needle):
    """Issue 17 item 6: a mistake in any run of a comparison stops it before the first run trains."""
    out = tmp_path / "cmp"
    code, _, err = cli(capsys, *COMPARE, *args, "--out", out)
    assert code == 2 and len(err.strip().splitlines()) == 1 and needle in err, err
    assert not out.exists()


def test_compare_checks_every_output_directory_first(tmp_path, capsys):
    out = tmp_path / "cmp"
    (out / "asgd").mkdir(parents=True)
    (out / "asgd" / "summary.json").write_text("{}")
    code, _, err = cli(capsys, *COMPARE, "--algos", "sgd,asgd", "--out", out)
    assert code == 2 and f"--out {out / 'asgd'}: already holds a run" in err, err
    assert sorted(p.name for p in out.iterdir()) == ["asgd"]      # sgd did not train first
    (tmp_path / "file").write_text("x")
    code, _, err = cli(capsys, *COMPARE, "--algos", "sgd,asgd", "--out", tmp_path / "file")
    assert code == 2 and "is a file" in err, err


def test_algorithms_lists_every_rule_and_default(capsys):
    code, out, _ = cli(capsys, "algorithms")
    assert code == 0
    for name, cls in ALGORITHMS.items():
        assert f"{name}  (" in out and cls.rule in out
    assert "--lam0" in out and "2.0" in out and "--ms-momentum" in out and "0.95" in out and "1e-07" in out
    code, out, _ = cli(capsys, "algorithms", "--json")
    assert json.loads(out)["dcasgd-c"]["parameters"]["lam"]["default"] == 0.04


BAD = [
    (["--algo", "foo"], "--algo"),
    (["--model", "vgg"], "--model"),
    (["--dataset", "imagenet"], "--dataset"),
    (["--workers", "0"], "--workers"),
    (["--workers", "-3"], "--workers"),
    (["--algo", "agn", "--window", "0"], "--window"),
    (["--lr", "0"], "--lr"),
    (["--lr", "-1"], "--lr"),
    (["--batch-size", "0"], "--batch-size"),
    (["--algo", "asgd", "--lam", "0.1"], "--lam does not apply to asgd"),
    (["--algo", "sgd", "--workers", "4"], "sequential"),
    (["--delay", "gamma:-1"], "--delay"),
    (["--delay", "warp"], "--delay"),
    (["--delay", "trace:/nonexistent/trace.csv"], "cannot read the trace"),
    (["--model", "cnn", "--dataset", "synthetic"], "needs image input"),
    (["--batch-size", "5000"], "--batch-size is 5000, larger than each worker's"),
    (["--device", "tpu"], "--device"),
    (["--algo", "dcasgd-a", "--ms-momentum", "1.5"], "dcasgd-a: --ms-momentum must be in [0, 1)"),
]


@pytest.mark.parametrize("args,needle", BAD)
def test_bad_input_is_one_line_exit_2(tmp_path, capsys, args, needle):
    out = tmp_path / "r"
    code, stdout, err = cli(capsys, "train", *args, "--quiet", "--out", out)
    assert code == 2
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("stalegrad: error:"), err
    assert needle in lines[0]
    assert "Traceback" not in err
    assert not (out / "summary.json").exists()


@pytest.mark.parametrize("args,needle", [
    (["--lr-gamma", "1e308", "--lr-milestones", "0.1,0.2"], "--lr-gamma is 1e+308: after milestone 2"),
    (["--hidden", "100000000000"], "parameters x"),
    (["--workers", "99999999999999999999", "--partition", "iid"], "the run needs about"),
    (["--runtime", "local", "--threads-per-worker", "100000"], "--threads-per-worker is 100000, more than"),
    (["--delay", "gamma:1e-320"], "--delay 'gamma:1e-320': SHAPE must be a number from 0.01 to 1e+06"),
    (["--step-time", "1e308", "--delay", "round-robin"], "--step-time makes one message take 1e+308 virtual seconds"),
    (["--delay", "trace:/dev/zero"], "not a regular file"),
])
def test_values_that_would_crash_mid_run_are_refused_before_anything_is_written(tmp_path, capsys, args, needle):
    """Issue 17 item 8: each of these passed the checks and then crashed or ran forever mid-run."""
    out = tmp_path / "r"
    code, _, err = cli(capsys, "train", "--dataset", "synthetic", "--epochs", 0.1, *args, "--quiet", "--out", out)
    assert code == 2 and len(err.strip().splitlines()) == 1 and needle in err, err
    assert err.startswith("stalegrad: error: ") and not out.exists()


def test_a_commit_larger_than_the_budget_is_refused_and_the_summary_says_what_ran(tmp_path, capsys):
    """Issue 17 item 7: --window 2000 --epochs 1 ran 178 epochs; now refused. What runs is reported."""
    code, _, err = cli(capsys, "train", "--algo", "agn", "--window", 2000, "--epochs", 1, "--quiet",
                       "--out", tmp_path / "big")
    assert code == 2 and "agn: --window is 2000: one commit of 2000 mini-batches" in err, err
    assert "give at most --window 11" in err and not (tmp_path / "big").exists()
    code, _, err = cli(capsys, "train", "--algo", "agn", "--window", 10, "--epochs", 1, "--quiet",
                       "--out", tmp_path / "r")
    assert code == 0, err
    run = read_run(tmp_path / "r")
    s, n = run["summary"], run["config"]["train_samples"]
    assert s["epochs"] == pytest.approx(s["samples"] / n, abs=1e-6)       # the epochs actually run
    assert n <= s["samples"] < n + 10 * 128                                 # past the budget by less than a commit


def test_a_message_names_every_parameter_as_a_flag(tmp_path, capsys):
    """A ConfigError's problem that names a second parameter spells it as a flag too (the API keeps the
    Python name): --probe-every with --checkpoint-every, not checkpoint_every."""
    code, _, err = cli(capsys, "train", "--dataset", "synthetic", "--probe-every", 2, "--checkpoint-every", 3,
                       "--quiet", "--out", tmp_path / "r")
    assert code == 2 and "--probe-every cannot be combined with --checkpoint-every" in err, err
    assert "checkpoint_every" not in err


def test_bad_config_keys_and_values(tmp_path, capsys):
    cfg = tmp_path / "c.toml"
    cfg.write_text("colour = 3\n")
    code, _, err = cli(capsys, "train", "--config", cfg, "--out", tmp_path / "r")
    assert code == 2 and "unknown key 'colour'" in err
    cfg.write_text("workers = 0\n")
    code, _, err = cli(capsys, "train", "--config", cfg, "--out", tmp_path / "r")
    assert code == 2 and "workers" in err
    cfg.write_text("workers = [\n")
    code, _, err = cli(capsys, "train", "--config", cfg, "--out", tmp_path / "r")
    assert code == 2 and "not valid TOML" in err


@pytest.mark.parametrize("line,needle", [
    ("workers = [1, 2]", "workers must be an integer, not [1, 2]"),
    ("epochs = {a = 1}", "epochs must be a number, not {'a': 1}"),
    ('hidden = ["a"]', "hidden must be a list of integers"),
    ('lr_milestones = ["x"]', "lr_milestones must be a list of numbers"),
    ("epochs = inf", "epochs must be a finite number > 0, got inf"), ("lr = nan", "lr must be a finite number"),
    ("train = 5", "unknown key 'train'"), ("seed = 1.5", "seed"), ('lam0 = "a"', "lam0"),
    # strict types (issue 17 item 5): no dates, no numbers in strings, no number for a path, no 1 for true
    ("epochs = 1970-01-01", "epochs must be a number, not 1970-01-01"),
    ("epochs = 07:32:00", "epochs must be a number, not 07:32:00"),
    ('lr = "0.1"', "lr must be a number, not '0.1'"), ("data_dir = 5", "data_dir must be a string"),
    ("vectorised = 1", "vectorised must be true or false"), ('hidden = "8,8"', "hidden must be a list of integers"),
    ('delay = ["uniform"]', "delay must be a string"), ("init = 3", "init must be a string (in quotes) (one of torch"),
    ("seed = true", "seed must be an integer"),
    # no table but [train]; no keys beside it, which it would silently override
    ("[x]\ny = 1", "unknown table [x]"), ("workers = 2\n[train]\nworkers = 3", "workers is outside the [train] table"),
    ("[other]\nx = 1", "unknown table [other]"), ("[train]\n[train.x]\ny = 1", "unknown table [train.x]"),
    ("lr_milestones = [2, 1]", "lr_milestones must be increasing"),
    # issue 32: a value the file gave names the file and its key, not a flag never typed
    ("val_split = -1", "val_split must be a count of training samples"),
    ("[train]\nval-split = -1", "val-split must be a count of training samples"),
    ("lam0 = -1", "dcasgd-a: lam0 must be a finite number >= 0"),
])
def test_config_values_of_the_wrong_shape_are_one_line(tmp_path, capsys, line, needle):
    cfg = tmp_path / "c.toml"
    cfg.write_text(f'algo = "dcasgd-a"\n{line}\n' if "\n[" not in f"\n{line}" else f"{line}\n")
    code, _, err = cli(capsys, "train", "--config", cfg, "--out", tmp_path / "r")
    assert code == 2 and len(err.strip().splitlines()) == 1 and needle in err, err
    if "--" not in needle:   # the file's own mistakes name the file
        assert err.startswith(f"stalegrad: error: {cfg}: ") and "--" not in err, err
    assert not (tmp_path / "r").exists()


def test_config_may_name_the_run_directory(tmp_path, capsys):
    cfg = tmp_path / "c.toml"
    cfg.write_text(f'out = "{tmp_path / "from-file"}"\ndataset = "synthetic"\nmodel = "logreg"\nepochs = 0.2\n')
    assert cli(capsys, "train", "--config", cfg, "--quiet")[0] == 0
    assert (tmp_path / "from-file" / "summary.json").exists()
    assert cli(capsys, "train", "--config", cfg, "--quiet", "--out", tmp_path / "flag")[0] == 0   # the flag wins
    assert (tmp_path / "flag" / "summary.json").exists()


def test_existing_run_is_not_overwritten(tmp_path, capsys):
    args = ["train", "--dataset", "synthetic", "--model", "logreg", "--epochs", 0.5, "--quiet", "--out", tmp_path]
    assert cli(capsys, *args)[0] == 0
    before = (tmp_path / "summary.json").read_bytes()
    code, _, err = cli(capsys, *args[:-2], "--seed", 5, "--out", tmp_path)
    assert code == 2 and "--overwrite" in err
    assert (tmp_path / "summary.json").read_bytes() == before
    assert cli(capsys, *args, "--seed", 5, "--overwrite")[0] == 0
    assert (tmp_path / "summary.json").read_bytes() != before


def test_nonfinite_updates_are_skipped_and_reported(tmp_path, capsys):
    # A learning rate this large makes the gradients overflow.
    code, _, err = cli(capsys, "train", "--algo", "asgd", "--dataset", "synthetic", "--model", "mlp",
                       "--lr", "1e30", "--epochs", 1, "--quiet", "--out", tmp_path / "r")
    assert code == 0, err
    s = read_run(tmp_path / "r")["summary"]
    assert s["nonfinite_skipped"] > 0
    w = torch.load(tmp_path / "r" / "model.pt", weights_only=True)["weights"]
    assert torch.isfinite(w).all()
    code, _, err = cli(capsys, "train", "--algo", "asgd", "--dataset", "synthetic", "--model", "mlp",
                       "--lr", "1e30", "--on-nonfinite", "stop", "--epochs", 1, "--quiet", "--out", tmp_path / "s")
    assert code == 1 and "NaN or Inf" in err and len(err.strip().splitlines()) == 1


def test_console_script_exit_code_and_one_line(tmp_path):
    proc = subprocess.run([sys.executable, "-m", "stalegrad", "train", "--workers", "0", "--out", str(tmp_path)],
                          capture_output=True, text=True)
    assert proc.returncode == 2
    assert proc.stderr.strip().count("\n") == 0 and "--workers" in proc.stderr


def test_fashion_mnist_end_to_end(tmp_path, capsys):
    from stalegrad.data import DataError, find_dataset_dir
    try:
        find_dataset_dir("fashion-mnist")
    except DataError:
        pytest.skip("Fashion-MNIST not installed (make data, or apt-get install dataset-fashion-mnist)")
    code, out, err = cli(capsys, "train", "--algo", "agn", "--workers", 8, "--dataset", "fashion-mnist",
                         "--model", "mlp", "--epochs", 0.1, "--delay", "gamma:2", "--quiet", "--out", tmp_path / "r")
    assert code == 0, err
    s = read_run(tmp_path / "r")["summary"]
    assert s["samples"] >= 6000 and s["final_test_acc"] > 0.5


def _files(d):
    return {p.name: p.read_bytes() for p in sorted(d.iterdir()) if p.is_file()}


def test_interrupted_run_resumes_to_the_same_weights(tmp_path, capsys, monkeypatch):
    from stalegrad.core.server import ParameterServer
    args = ["train", "--algo", "dcasgd-a", "--workers", 4, "--delay", "gamma:2", "--dataset", "digits",
            "--epochs", 2, "--batch-size", 32, "--checkpoint-every", 10, "--eval-every", 0.5, "--quiet"]
    assert cli(capsys, *args, "--out", tmp_path / "full")[0] == 0
    original = ParameterServer.push

    def push(self, worker, msg, lr):
        if self.version == 25:
            raise KeyboardInterrupt
        return original(self, worker, msg, lr)
    monkeypatch.setattr(ParameterServer, "push", push)
    code, _, err = cli(capsys, *args, "--out", tmp_path / "cut")
    assert code == 130 and "interrupted" in err
    assert not (tmp_path / "cut" / "summary.json").exists()
    monkeypatch.setattr(ParameterServer, "push", original)
    code, out, err = cli(capsys, "train", "--resume", tmp_path / "cut", "--quiet")
    assert code == 0, err
    full, resumed = read_run(tmp_path / "full"), read_run(tmp_path / "cut")
    assert resumed["summary"]["weights_sha256"] == full["summary"]["weights_sha256"]
    strip = lambda ms: [{k: v for k, v in m.items() if k != "wall_s"} for m in ms]
    assert strip(resumed["metrics"]) == strip(full["metrics"])
    assert resumed["staleness"] == full["staleness"]


def test_resume_can_extend_the_epochs(tmp_path, capsys):
    args = ["train", "--algo", "agn", "--dataset", "synthetic", "--model", "logreg", "--epochs", 1,
            "--checkpoint-every", 5, "--quiet", "--out", tmp_path]
    assert cli(capsys, *args)[0] == 0
    first = read_run(tmp_path)["summary"]
    code, _, err = cli(capsys, "train", "--resume", tmp_path, "--epochs", 2, "--quiet")
    assert code == 0, err
    second = read_run(tmp_path)
    assert second["summary"]["samples"] >= 2 * 4096 > first["samples"]
    assert second["config"]["epochs"] == 2


def test_mismatched_or_corrupt_checkpoint_changes_nothing(tmp_path, capsys):
    base = ["--dataset", "synthetic", "--model", "logreg", "--epochs", 1, "--checkpoint-every", 5, "--quiet"]
    assert cli(capsys, "train", "--algo", "asgd", *base, "--out", tmp_path / "a")[0] == 0
    assert cli(capsys, "train", "--algo", "dcasgd-c", *base, "--out", tmp_path / "b")[0] == 0
    (tmp_path / "a" / "checkpoint.pt").write_bytes((tmp_path / "b" / "checkpoint.pt").read_bytes())
    before = _files(tmp_path / "a")
    code, _, err = cli(capsys, "train", "--resume", tmp_path / "a", "--quiet")
    assert code == 2 and "algorithm" in err and len(err.strip().splitlines()) == 1
    assert _files(tmp_path / "a") == before
    (tmp_path / "a" / "checkpoint.pt").write_bytes(b"garbage")
    before = _files(tmp_path / "a")
    code, _, err = cli(capsys, "train", "--resume", tmp_path / "a", "--quiet")
    assert code == 2 and "corrupt" in err
    assert _files(tmp_path / "a") == before


def test_resume_refuses_other_options_and_non_runs(tmp_path, capsys):
    code, _, err = cli(capsys, "train", "--resume", tmp_path, "--quiet")
    assert code == 2 and "no config.json" in err
    code, _, err = cli(capsys, "train", "--resume", tmp_path, "--workers", 3)
    assert code == 2 and "drop --workers" in err
    code, _, err = cli(capsys, "train", "--algo", "agn")
    assert code == 2 and "--out DIR is required" in err


@pytest.mark.parametrize("args", [["--help"], ["algorithms"], ["train", "--help"], ["train", "--lr", "nan", "--out", "x"],
                                  ["train", "--delay", "warp", "--out", "x"], ["compare", "--workers", "0", "--out", "x"]])
def test_help_listing_and_argument_errors_do_not_import_torch(args):
    # torch takes seconds to import; these answers must not wait for it
    code = ("import sys; from stalegrad.cli import main; code = main(sys.argv[1:]); "
            "assert 'torch' not in sys.modules, 'torch was imported'; sys.exit(code)")
    proc = subprocess.run([sys.executable, "-c", code, *args], capture_output=True, text=True)
    assert "torch was imported" not in proc.stderr and "Traceback" not in proc.stderr, proc.stderr
    assert proc.returncode == (0 if args[-1] in ("--help", "algorithms") else 2), proc.stderr
