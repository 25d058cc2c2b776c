"""One configuration, validated in one place; one error type with its exit code."""
import io
import json
import math

import pytest
import torch

import stalegrad as sg
from stalegrad.algorithms import make_algorithm
from stalegrad.cli import main
from stalegrad.run.config import MAX_SEED, RunConfig
from stalegrad.errors import ConfigError, RunError, StalegradError, UsageError
from stalegrad.run.progress import LineProgress, make_progress
from stalegrad.core.server import NonFiniteError

from helpers import blobs

TRAIN, TEST = blobs(seed=0), blobs(n=64, seed=1)

# (Python keywords, the same mistake as flags, the parameter's flag)
MISTAKES = [
    ({"lr": -1.0}, ["--lr", "-1"], "--lr"),
    ({"lr": math.nan}, ["--lr", "nan"], "--lr"),
    ({"lr": math.inf}, ["--lr", "inf"], "--lr"),
    ({"epochs": math.inf}, ["--epochs", "inf"], "--epochs"),
    ({"epochs": math.nan}, ["--epochs", "nan"], "--epochs"),
    ({"eval_every": math.inf}, ["--eval-every", "inf"], "--eval-every"),
    ({"lr_gamma": math.nan}, ["--lr-gamma", "nan"], "--lr-gamma"),
    ({"lr_milestones": (2.0, 1.0)}, ["--lr-milestones", "2,1"], "--lr-milestones"),
    ({"seed": 99999999999999999999999}, ["--seed", "99999999999999999999999"], "--seed"),
    ({"workers": 0}, ["--workers", "0"], "--workers"),
    ({"batch_size": 0}, ["--batch-size", "0"], "--batch-size"),
    ({"checkpoint_every": -1}, ["--checkpoint-every", "-1"], "--checkpoint-every"),
    ({"device": "tpu"}, ["--device", "tpu"], "--device"),
    ({"lr_gamma": 1e308, "lr_milestones": (0.1, 0.2)}, ["--lr-gamma", "1e308", "--lr-milestones", "0.1,0.2"],
     "--lr-gamma"),
]


def api_error(kwargs) -> ConfigError:
    with pytest.raises(ConfigError) as info:
        sg.train("logreg", TRAIN, TEST, **{"algorithm": "asgd", "workers": 2, "batch_size": 8, **kwargs})
    return info.value


@pytest.mark.parametrize("kwargs,flags,flag", MISTAKES)
def test_api_and_cli_refuse_the_same_mistake_with_the_same_message(tmp_path, capsys, kwargs, flags, flag):
    err = api_error(kwargs)
    name = next(iter(kwargs))
    assert str(err).startswith(f"{name} ")            # Python terms for a Python user
    code = main(["train", "--dataset", "synthetic", "--model", "logreg", "--workers", "2", "--batch-size", "8",
                 *flags, "--quiet", "--out", str(tmp_path / "r")])
    lines = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(lines) == 1
    assert lines[0] == f"stalegrad: error: {flag} {err.problem}"   # the same words, the flag's name
    assert not (tmp_path / "r").exists()


def test_algorithm_parameters_are_named_with_their_algorithm():
    err = api_error({"algorithm": make_algorithm.__globals__["ALGORITHMS"]["dcasgd-a"](lam0=-1.0)})
    assert str(err) == "dcasgd-a: lam0 must be a finite number >= 0, got -1.0"
    assert err.for_cli(lambda p: "--lam0") == "dcasgd-a: --lam0 must be a finite number >= 0, got -1.0"
    for bad in ({"lam": math.inf}, {"lam": math.nan}):
        with pytest.raises(ConfigError, match="lam must be a finite number"):
            make_algorithm("dcasgd-c", **bad)
    with pytest.raises(ConfigError, match="window must be a positive integer"):
        make_algorithm("agn", window=2.5)


def test_config_object_and_keywords_are_the_same_run():
    a = sg.train("logreg", TRAIN, TEST, "asgd", 2, epochs=0.5, batch_size=8, seed=3, lr=0.05)
    b = sg.train("logreg", TRAIN, TEST, config=RunConfig(algorithm="asgd", workers=2, epochs=0.5, batch_size=8,
                                                         seed=3, lr=0.05))
    assert a.summary["weights_sha256"] == b.summary["weights_sha256"]
    with pytest.raises(ConfigError, match="epochs is given twice, as 2 and as 0.5 in config="):
        sg.train("logreg", TRAIN, TEST, config=RunConfig(epochs=0.5), epochs=2)
    with pytest.raises(ConfigError, match="epoch is not an option of a run; the options are algorithm, workers"):
        sg.train("logreg", TRAIN, TEST, epoch=2)


def test_validate_resolves_the_defaults():
    c = RunConfig(algorithm="sgd").validate()
    assert c.workers == 1 and c.lr == 0.1 and c.algorithm.name == "sgd"
    c = RunConfig(algorithm="agn", lr_milestones=[1, 2]).validate()
    assert c.workers == 4 and c.lr == 0.001 and c.lr_milestones == (1.0, 2.0)
    assert RunConfig(seed=MAX_SEED).validate().seed == MAX_SEED
    with pytest.raises(ConfigError, match="workers must be 1 for sgd"):
        RunConfig(algorithm="sgd", workers=4).validate()


def test_test_set_of_another_shape_is_refused_before_anything_runs():
    small = blobs(n=32, d=4, seed=2)
    with pytest.raises(ConfigError, match=r"test_data holds samples of shape \(4,\) but the training set's are \(8,\)"):
        sg.train("logreg", TRAIN, small, "asgd", 2, batch_size=8)


def test_one_error_family_with_exit_codes():
    assert issubclass(ConfigError, UsageError) and issubclass(UsageError, StalegradError)
    assert issubclass(UsageError, ValueError) and UsageError.exit_code == 2
    assert issubclass(NonFiniteError, RunError) and RunError.exit_code == 1
    from stalegrad.run.checkpoint import CheckpointError
    from stalegrad.data import DataError
    from stalegrad.models import ModelError
    from stalegrad.run.results import OutputError
    from stalegrad.runtimes.local import WorkerError
    for cls in (CheckpointError, DataError, ModelError, OutputError):
        assert issubclass(cls, UsageError), cls
    assert issubclass(WorkerError, RunError)


def test_local_weight_decay_and_its_old_spelling(tmp_path, capsys):
    with pytest.warns(DeprecationWarning, match="weight_decay is now called local_weight_decay"):
        algo = make_algorithm("agn", weight_decay=0.01)
    assert algo.local_weight_decay == 0.01
    code = main(["train", "--algo", "agn", "--window", "2", "--weight-decay", "0.01", "--dataset", "synthetic",
                 "--model", "logreg", "--epochs", "0.2", "--quiet", "--out", str(tmp_path / "r")])
    err = capsys.readouterr().err
    assert code == 0 and "--weight-decay for agn is now --local-weight-decay" in err
    config = json.loads((tmp_path / "r" / "config.json").read_text())
    assert config["algorithm"]["local_weight_decay"] == 0.01 and "weight_decay" not in config["algorithm"]
    code = main(["train", "--algo", "asgd", "--local-weight-decay", "0.01", "--quiet", "--out", str(tmp_path / "s")])
    assert code == 2 and "--local-weight-decay does not apply to asgd" in capsys.readouterr().err


def test_progress_is_one_line_per_evaluation_when_not_on_a_terminal(capsys):
    assert isinstance(make_progress(1000, "x", io.StringIO()), LineProgress)
    run = sg.train("logreg", TRAIN, TEST, "asgd", 2, batch_size=8, epochs=2, eval_every=0.5, progress=True)
    err = capsys.readouterr().err     # pytest's captured stderr is not a terminal, as in CI or a log file
    lines = err.splitlines()
    assert "\r" not in err and len(lines) == len(run.metrics)
    assert lines[-1].startswith("asgd x2: epoch 2.00") and "test acc" in lines[-1]


def test_init_is_an_option_of_the_run_recorded_and_deterministic():
    def run(init, model="mlp"):
        return sg.train(model, TRAIN, TEST, "asgd", 2, batch_size=8, epochs=0.25, seed=5, init=init)
    a, b, t = run("glorot-uniform"), run("glorot-uniform"), run("torch")
    assert a.summary["weights_sha256"] == b.summary["weights_sha256"] != t.summary["weights_sha256"]
    assert a.config["init"] == "glorot-uniform" and t.config["init"] == "torch"
    with pytest.raises(ConfigError, match="init must be one of torch, glorot-uniform, he-normal, got 'keras'"):
        run("keras")

    class WithEmbedding(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.table = torch.nn.Embedding(4, 8)
            self.head = torch.nn.Linear(8, 3)

        def forward(self, x):
            return self.head(x + self.table.weight[:1])
    res = sg.train(WithEmbedding(), TRAIN, TEST, "asgd", 2, batch_size=8, epochs=0.25, init="he-normal")
    assert any("init he-normal: left these layers as they were built: table" in n for n in res.summary["notes"])


# A value other than RunConfig's default for every option that can come both as a keyword and in config=,
# and a second value that disagrees with it.
TWO_WAYS = {
    "algorithm": (sg.DCASGDAdaptive(lam0=1.0), "agn"), "workers": (2, 3), "epochs": (0.5, 0.25),
    "batch_size": (8, 16), "lr": (0.05, 0.02), "lr_milestones": ((0.25,), (0.1,)), "lr_gamma": (0.5, 0.2),
    "eval_every": (0.25, 0.5), "partition": ("iid", "shard"), "seed": (3, 4), "device": ("cuda:0", "cuda:1"),
    "on_nonfinite": ("stop", "skip"), "checkpoint_every": (5, 6), "init": ("glorot-uniform", "he-normal"),
    "probe_every": (3, 4), "val_split": (40, 0.25),
}


def test_every_option_has_a_second_way_to_come():
    assert set(TWO_WAYS) == set(RunConfig.fields())


@pytest.mark.parametrize("name", sorted(TWO_WAYS))
def test_an_option_given_beside_config_is_honoured_or_refused(name):
    """With config= an option in the keywords (or the algorithm and workers arguments) fills a field the
    config leaves at its default, agrees with one it sets, or is refused: never silently dropped."""
    value, other = TWO_WAYS[name]
    merged = RunConfig().merged(**{name: value})
    assert getattr(merged, name) == value                            # filled
    assert getattr(RunConfig(**{name: value}).merged(**{name: value}), name) == value   # agrees
    with pytest.raises(ConfigError, match=f"{name} is given twice"):  # disagrees
        RunConfig(**{name: value}).merged(**{name: other})


def test_train_honours_the_algorithm_and_workers_beside_config():
    """The outside check's call: an algorithm object and workers=8 beside config= were ignored."""
    algo = sg.DCASGDAdaptive(lam0=1.0, ms_momentum=0.9)
    r = sg.train("logreg", TRAIN, TEST, algo, workers=8, config=RunConfig(epochs=0.5, batch_size=4, seed=2))
    assert r.config["algorithm"] == algo.to_dict() and r.config["workers"] == 8 and r.summary["workers"] == 8
    same = sg.train("logreg", TRAIN, TEST, config=RunConfig(algorithm=algo, workers=8, epochs=0.5, batch_size=4,
                                                            seed=2))
    assert same.summary["weights_sha256"] == r.summary["weights_sha256"]
    with pytest.raises(ConfigError, match="algorithm is given twice, as 'asgd' and as 'dcasgd-a' in config="):
        sg.train("logreg", TRAIN, TEST, "asgd", config=RunConfig(algorithm="dcasgd-a"))
    with pytest.raises(ConfigError, match="workers is given twice, as 8 and as 2 in config="):
        sg.train("logreg", TRAIN, TEST, workers=8, config=RunConfig(workers=2))
    with pytest.raises(ConfigError, match="epoch is not an option of a run"):
        sg.train("logreg", TRAIN, TEST, config=RunConfig(), epoch=2)


def test_the_readme_error_example_runs_as_written():
    train, test = sg.load_pair("digits")
    with pytest.raises(ConfigError) as e:
        sg.train("mlp", train, test, lr=-1.0)
    assert str(e.value) == "lr must be a finite number > 0, got -1.0"


def test_a_second_parameter_is_named_in_python_terms_by_the_api():
    with pytest.raises(ConfigError) as info:
        sg.train("logreg", TRAIN, TEST, algorithm="asgd", workers=2, batch_size=8, probe_every=2,
                 checkpoint_every=3, checkpoint_path="x.pt")
    assert "checkpoint_every" in str(info.value) and "--" not in str(info.value)
    flags = {"probe_every": "--probe-every", "checkpoint_every": "--checkpoint-every", "window": "--window"}
    assert info.value.for_cli(flags.get).startswith("--probe-every cannot be combined with --checkpoint-every")
    named = ConfigError("epochs", "is too short for one window of data_dir/window_x.csv", mentions=("window",))
    assert named.for_cli(flags.get) == "epochs is too short for one --window of data_dir/window_x.csv"


def test_memory_for_the_workers_copies_is_estimated_and_refused(monkeypatch):
    """Issue 17 item 8: what cannot fit in the available memory is refused before anything is allocated,
    with the estimate in the message; the estimate grows with the copies the algorithm keeps."""
    from stalegrad.core import resources
    with pytest.raises(UsageError, match=r"the run needs about .* x 200,000,000,000,000,000,000 copies"):
        sg.train("logreg", TRAIN, TEST, algorithm="asgd", workers=10**20, partition="iid", batch_size=8)
    dc = resources.memory_estimate(make_algorithm("dcasgd-a"), 8, 1000, 4, 0)
    asgd = resources.memory_estimate(make_algorithm("asgd"), 8, 1000, 4, 0)
    agn = resources.memory_estimate(make_algorithm("agn"), 8, 1000, 4, 0)
    # a snapshot and a mean square per worker, and the old values of the pushing worker's mean square (Undo)
    assert dc["server_copies"] == asgd["server_copies"] + 2 * 8 + 1
    assert agn["worker_copies"] == asgd["worker_copies"] + 2          # Adam's two moments per worker
    monkeypatch.setattr(resources, "available_memory", lambda: 10_000)
    with pytest.raises(UsageError, match=r"more than the 9.77 KiB available"):
        sg.train("logreg", TRAIN, TEST, algorithm="asgd", workers=2, batch_size=8)


def test_a_trace_is_a_regular_file_of_bounded_size(tmp_path, monkeypatch):
    from stalegrad.core import delays, traces
    trace = tmp_path / "t.csv"
    trace.write_text("worker\n" + "0\n1\n" * 100)
    assert delays.read_trace(trace).workers[:3] == [0, 1, 0]
    with pytest.raises(ConfigError, match="not a regular file"):
        delays.read_trace("/dev/zero")
    monkeypatch.setattr(traces, "MAX_TRACE_BYTES", 100)
    with pytest.raises(ConfigError, match="more than the"):
        delays.read_trace(trace)


# ---- issue 32 item 7: the Python API checks the model against the data before the first step --------------
def _data(x=None, y=None, num_classes=3, base=TRAIN):
    from types import SimpleNamespace
    data = SimpleNamespace(x=base.x if x is None else x, y=base.y if y is None else y)
    if num_classes is not None:
        data.num_classes = num_classes
    return data


MODEL_MISFITS = [
    ("wrong input shape", lambda: (torch.nn.Linear(10, 3), TRAIN, TEST), r"^model cannot take the data's samples "
     r"of shape \(8,\) \(mat1 and mat2 shapes cannot be multiplied .*\); give a model built for them$"),
    ("too few classes", lambda: (torch.nn.Linear(8, 2), TRAIN, TEST),
     r"^model returns 2 class scores per sample, but the data has 3 classes \(labels 0\.\.2\); give it a head of 3 "),
    ("not one row per sample", lambda: (torch.nn.Sequential(torch.nn.Linear(8, 3), torch.nn.Flatten(0)), TRAIN, TEST),
     r"^model returns \(6,\) for a batch of 2 samples"),
    ("float labels", lambda: ("logreg", _data(y=TRAIN.y.float()), TEST),
     r"^train_data holds labels as a torch.float32 tensor of shape \(256,\); labels are class indices"),
    ("negative labels", lambda: ("logreg", _data(y=TRAIN.y - 1), TEST),
     r"^train_data holds the label -1; labels are class indices from 0$"),
    ("labels past the classes", lambda: ("logreg", _data(y=TRAIN.y + 3), TEST),
     r"^train_data holds the label 5, but the data has 3 classes \(labels 0\.\.2\)"),
    ("test labels past the classes", lambda: ("logreg", TRAIN, _data(y=TEST.y * 2, base=TEST, num_classes=None)),
     r"^test_data holds the label 4, but the data has 3 classes"),
    ("float64 samples", lambda: ("logreg", _data(x=TRAIN.x.double()), _data(x=TEST.x.double(), base=TEST)),
     r"^train_data holds torch.float64 samples, but the model's weights are torch.float32; convert the samples"),
    ("integer samples", lambda: ("logreg", _data(x=TRAIN.x.long()), _data(x=TEST.x.long(), base=TEST)),
     r"^train_data holds samples of type torch.int64; samples are a floating-point tensor$"),
    ("empty training set", lambda: ("logreg", _data(x=TRAIN.x[:0], y=TRAIN.y[:0]), TEST),
     r"^train_data is empty: it holds no samples to train on$"),
]


@pytest.mark.parametrize("case,make,message", MODEL_MISFITS, ids=[c[0] for c in MODEL_MISFITS])
def test_a_model_that_does_not_fit_the_data_is_one_config_error_before_anything_runs(case, make, message):
    """Each of these raised torch's error mid-run (or, the empty set, 'val_split holds out 0 of the 0')."""
    model, train_data, test_data = make()
    started = []
    with pytest.raises(ConfigError, match=message) as info:
        sg.train(model, train_data, test_data, "asgd", 2, epochs=1, batch_size=8,
                 on_start=lambda *a: started.append(a))
    assert started == [] and "\n" not in str(info.value)


def test_the_model_check_leaves_the_model_as_it_was():
    """One forward pass in eval mode, no gradient and no random draw: the modes of every submodule, the
    parameters and the torch generator are untouched, so a run's bits are what they were."""
    from stalegrad.run.model_check import check_model
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.BatchNorm1d(16), torch.nn.Dropout(0.5),
                                torch.nn.Linear(16, 3))
    model[1].eval()   # a user's choice, kept
    state = {k: v.clone() for k, v in model.state_dict().items()}
    rng = torch.get_rng_state()
    check_model(model, TRAIN, TEST, 3)
    assert [m.training for m in model.modules()] == [True, True, False, True, True]
    assert all(torch.equal(state[k], v) for k, v in model.state_dict().items())
    assert torch.equal(torch.get_rng_state(), rng)
    assert all(p.grad is None for p in model.parameters())


# ---- issue 32 item 10: values that mean nothing ------------------------------------------------------
def test_a_local_momentum_of_one_or_more_is_refused():
    for bad in (1.0, 1e6, -0.1, math.nan):
        with pytest.raises(ConfigError, match=r"^agn: local_momentum must be in \[0, 1\)"):
            make_algorithm("agn", local_opt="sgd", local_momentum=bad)
    assert make_algorithm("agn", local_opt="sgd", local_momentum=0.9).local_momentum == 0.9


@pytest.mark.parametrize("outer,kw", [("sgd", {"dn_c": 0.1}), ("nesterov", {"dn_delay": 3}), ("sgd", {"dn_delay": 2})])
def test_delayed_nesterov_parameters_are_refused_with_another_outer_optimizer(outer, kw):
    """They did nothing and were recorded in config.json as if they applied."""
    name = next(iter(kw))
    with pytest.raises(ConfigError, match=rf"^async-local-sgd: {name} applies to outer_opt delayed-nesterov only"):
        make_algorithm("async-local-sgd", outer_opt=outer, **kw)


def test_a_delayed_nesterov_period_longer_than_the_run_is_refused(tmp_path, capsys):
    """--dn-delay 1e20 made every update 1/1e20 of a commit: the run stayed at its initial accuracy."""
    kw = dict(epochs=1, batch_size=8, seed=1)
    algo = make_algorithm("async-local-sgd", window=2, dn_delay=10 ** 20)
    with pytest.raises(ConfigError, match=r"^async-local-sgd: dn_delay is 100000000000000000000, more than the 16 "
                                          r"server updates this run makes"):
        sg.train("logreg", TRAIN, TEST, algo, 2, **kw)
    ok = sg.train("logreg", TRAIN, TEST, make_algorithm("async-local-sgd", window=2, dn_delay=16), 2, **kw)
    assert ok.summary["updates"] == 16
    code = main(["train", "--algo", "async-local-sgd", "--window", "2", "--dn-delay", "100000000000000000000",
                 "--dataset", "synthetic", "--model", "logreg", "--epochs", "0.1", "--quiet",
                 "--out", str(tmp_path / "r")])
    err = capsys.readouterr().err
    assert code == 2 and len(err.splitlines()) == 1 and "--dn-delay is 100000000000000000000" in err, err
    assert not (tmp_path / "r").exists()
