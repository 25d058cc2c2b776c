"""Issue 44 item 4: the last tracebacks and silently accepted inputs. Each careless input is one line naming the
problem and the fix, exit code 2 on the command line (a ``ConfigError``/``UsageError`` in Python), and nothing
changed on disk."""
import json
import shutil

import pytest
import torch

import stalegrad as sg
from stalegrad.cli import main
from stalegrad.core.server import ParameterServer
from stalegrad.errors import ConfigError, UsageError

from helpers import blobs

TRAIN, TEST = blobs(seed=0), blobs(n=64, seed=1)
SMALL = ["--dataset", "synthetic", "--model", "logreg", "-q"]
DEEP_TOML = "a = " + "[" * 50000 + "]" * 50000 + "\n"
DEEP_JSON = "[" * 50000 + "]" * 50000


def cli(capsys, *args):
    code = main([str(a) for a in args])
    out, err = capsys.readouterr()
    return code, out, err


def refused(capsys, *args, says=()):
    """The command is refused with one line on stderr that says each of ``says``; exit code 2."""
    code, out, err = cli(capsys, *args)
    assert code == 2 and err.count("\n") == 1 and err.startswith("stalegrad: error: "), (code, err)
    for words in says:
        assert words in err, err
    return err


def files_of(d):
    return {p.relative_to(d): p.read_bytes() for p in sorted(d.rglob("*")) if p.is_file()}


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """Two finished runs with checkpoints, to be copied and edited: logreg, and an mlp with hidden sizes."""
    base = tmp_path_factory.mktemp("runs")
    for name, model in (("logreg", ["--model", "logreg"]), ("mlp", ["--model", "mlp", "--hidden", "8"])):
        assert main(["train", "--dataset", "synthetic", *model, "--epochs", "0.2", "--checkpoint-every", "2",
                     "--out", str(base / name), "-q"]) == 0
    return base


def edited_run(runs, tmp_path, name="logreg", **changes):
    run = tmp_path / "run"
    shutil.copytree(runs / name, run)
    config = json.loads((run / "config.json").read_text())
    config.update(changes)
    (run / "config.json").write_text(json.dumps(config, indent=2))
    return run


# ---- 1. numbers past what a run can count ----------------------------------------------------------------------
@pytest.mark.parametrize("flag", ["--epochs", "--eval-every"])
def test_a_huge_epochs_or_eval_every_is_one_line(capsys, tmp_path, flag):
    refused(capsys, "train", *SMALL, flag, "1e308", "--out", tmp_path / "r", says=(flag, "1e+308", "give at most"))
    assert not (tmp_path / "r").exists()


def test_a_huge_epochs_from_a_config_file_a_grid_and_compare_is_one_line(capsys, tmp_path):
    (tmp_path / "e.toml").write_text("epochs = 1e308\n")
    refused(capsys, "train", *SMALL, "--config", tmp_path / "e.toml", "--out", tmp_path / "r",
            says=("e.toml: epochs is 1e+308",))
    (tmp_path / "g.toml").write_text('[fixed]\ndataset = "synthetic"\nmodel = "logreg"\neval_every = 1e308\n'
                                     '[axes]\nseed = [0]\n')
    refused(capsys, "grid", tmp_path / "g.toml", "--out", tmp_path / "g", says=("g.toml: cell", "eval_every"))
    refused(capsys, "compare", "--algos", "sgd,asgd", *SMALL, "--epochs", "1e308", "--out", tmp_path / "c",
            says=("--epochs is 1e+308",))
    assert sorted(p.name for p in tmp_path.iterdir()) == ["e.toml", "g.toml"]


def test_a_huge_epochs_in_a_resumed_config_json_is_one_line(capsys, runs, tmp_path):
    run = edited_run(runs, tmp_path, epochs=1e308)
    before = files_of(run)
    refused(capsys, "train", "--resume", run, "-q", says=("epochs is 1e+308",))
    assert files_of(run) == before


@pytest.mark.parametrize("option", ["epochs", "eval_every"])
def test_a_huge_epochs_from_python_is_a_config_error(option):
    with pytest.raises(ConfigError, match=rf"^{option} is 1e\+308: .* give at most"):
        sg.train("logreg", TRAIN, TEST, **{option: 1e308, "epochs": 1e308 if option == "epochs" else 0.1})


# ---- 2. --partition replicate:K ----------------------------------------------------------------------------------
@pytest.mark.parametrize("value", ["replicate:²", "replicate:٣", "replicate: 3", "replicate:+3"])
def test_a_partition_with_digits_int_cannot_read_is_refused(capsys, tmp_path, value):
    refused(capsys, "train", *SMALL, "--partition", value, "--out", tmp_path / "r", says=("--partition must be",))
    with pytest.raises(ConfigError, match="^partition must be"):
        sg.train("logreg", TRAIN, TEST, partition=value)


def test_a_partition_with_leading_zeros_is_recorded_as_one_layout(capsys, tmp_path):
    code, _, err = cli(capsys, "train", *SMALL, "--partition", "replicate:011", "--epochs", "0.1",
                       "--out", tmp_path / "r")
    assert code == 0, err
    assert json.loads((tmp_path / "r" / "config.json").read_text())["partition"] == "replicate:11"
    assert sg.RunConfig(partition="replicate:007").validate().partition == "replicate:7"
    (tmp_path / "g.toml").write_text('[fixed]\ndataset = "synthetic"\nmodel = "logreg"\n'
                                     '[axes]\npartition = ["replicate:011", "replicate:11"]\n')
    refused(capsys, "grid", tmp_path / "g.toml", "--out", tmp_path / "g", "--dry-run", says=("twice",))


# ---- 3. files nested too deeply -----------------------------------------------------------------------------------
def test_a_config_file_or_grid_file_nested_too_deeply_is_one_line(capsys, tmp_path):
    (tmp_path / "deep.toml").write_text(DEEP_TOML)
    refused(capsys, "train", *SMALL, "--config", tmp_path / "deep.toml", "--out", tmp_path / "r",
            says=("deep.toml: not valid TOML", "nested too deeply"))
    (tmp_path / "grid.toml").write_text("[fixed]\nepochs = " + DEEP_TOML[4:])
    refused(capsys, "grid", tmp_path / "grid.toml", "--out", tmp_path / "g", says=("grid.toml", "nested too deeply"))
    assert sorted(p.name for p in tmp_path.iterdir()) == ["deep.toml", "grid.toml"]


def test_a_time_model_or_resumed_config_json_nested_too_deeply_is_one_line(capsys, runs, tmp_path):
    (tmp_path / "deep.json").write_text(DEEP_JSON)
    refused(capsys, "report", runs / "logreg", "--time-model", tmp_path / "deep.json", "--out", tmp_path / "rep",
            says=("--time-model", "nested too deeply"))
    assert not (tmp_path / "rep").exists()
    run = tmp_path / "run"
    shutil.copytree(runs / "logreg", run)
    (run / "config.json").write_text(DEEP_JSON)
    before = files_of(run)
    refused(capsys, "train", "--resume", run, "-q", says=("config.json is damaged", "nested too deeply"))
    assert files_of(run) == before


# ---- 4. one option spelled twice in a TOML file ------------------------------------------------------------------
@pytest.mark.parametrize("text, names", [("batch-size = 64\nbatch_size = 32\n", ("batch-size", "batch_size")),
                                         ("lr_gamma = 0.5\nlr-gamma = 0.2\n", ("lr_gamma", "lr-gamma")),
                                         ("[train]\nworkers = 2\nM = 3\n", ("workers", "M"))])
def test_a_config_file_giving_one_option_twice_is_refused(capsys, tmp_path, text, names):
    (tmp_path / "c.toml").write_text(text)
    err = refused(capsys, "train", *SMALL, "--config", tmp_path / "c.toml", "--out", tmp_path / "r",
                  says=("c.toml:", "one option", "give it once"))
    assert all(f"{n!r}" in err for n in names), err
    assert not (tmp_path / "r").exists()


# ---- 5. checkpoint_path without checkpoint_every -----------------------------------------------------------------
def test_a_checkpoint_path_without_checkpoint_every_is_refused(tmp_path):
    with pytest.raises(ConfigError, match="^checkpoint_path .*checkpoint_every") as e:
        sg.train("logreg", TRAIN, TEST, epochs=0.5, batch_size=16, checkpoint_path=tmp_path / "ck.pt")
    assert e.value.param == "checkpoint_path" and not (tmp_path / "ck.pt").exists()


# ---- 6. an edited config.json on --resume ------------------------------------------------------------------------
@pytest.mark.parametrize("name, changes, says", [
    ("mlp", {"hidden": 5}, "config.json: hidden must be a list of integers"),
    ("logreg", {"workers": "4"}, "config.json: workers must be an integer"),
    ("logreg", {"runtime": {"name": "mpi"}}, "config.json: runtime.name: 'mpi' is not one of 'sim', 'local', 'ray'; restore"),
    ("logreg", {"init": "he-nrml"}, "config.json: init: 'he-nrml' is not one of"),
    ("logreg", {"init": "he-normal"}, "made with init 'torch', but this run has 'he-normal'"),
    ("logreg", {"batch_size": None}, "config.json: batch_size must be an integer"),
])
def test_an_edited_config_json_is_refused_and_the_run_is_unchanged(capsys, runs, tmp_path, name, changes, says):
    run = edited_run(runs, tmp_path, name, **changes)
    before = files_of(run)
    refused(capsys, "train", "--resume", run, "--epochs", "0.4", "-q", says=(str(run), says))
    assert files_of(run) == before


def test_an_unedited_config_json_still_resumes(capsys, runs, tmp_path):
    run = edited_run(runs, tmp_path, "mlp")
    code, _, err = cli(capsys, "train", "--resume", run, "--epochs", "0.4", "-q")
    assert code == 0, err
    assert json.loads((run / "config.json").read_text())["hidden"] == [8]


# ---- 7. the API's own errors ----------------------------------------------------------------------------------------
@pytest.mark.parametrize("train_data", [None, (TRAIN.x, TRAIN.y), object()])
def test_data_that_is_no_data_set_is_a_config_error(train_data):
    with pytest.raises(ConfigError, match="^train_data must be a data set with x and y tensors"):
        sg.train("logreg", train_data, TEST)
    with pytest.raises(ConfigError, match="^test_data must be a data set"):
        sg.train("logreg", TRAIN, train_data)


def test_a_config_that_is_no_run_config_is_a_config_error():
    with pytest.raises(ConfigError, match="^config must be a RunConfig, not str"):
        sg.train("logreg", TRAIN, TEST, config="asgd")


@pytest.mark.parametrize("hook", ["on_eval", "on_start", "on_first_step"])
def test_a_callback_that_cannot_be_called_is_refused_before_the_run(hook):
    with pytest.raises(ConfigError, match=rf"^{hook} must be a function or None, not int"):
        sg.train("logreg", TRAIN, TEST, epochs=0.5, **{hook: 5})


class _Mixed(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.a, self.b = torch.nn.Linear(2, 3), torch.nn.Linear(2, 3).double()

    def forward(self, x):
        return self.a(x)


@pytest.mark.parametrize("model, says", [(torch.nn.Identity(), "has no trainable parameters"),
                                         (_Mixed(), "has torch.float64 parameters"),
                                         (torch.nn.Linear(8, 3).double(), "has torch.float64 parameters")])
def test_a_model_that_cannot_train_is_a_config_error(model, says):
    with pytest.raises(ConfigError, match=f"^model {says}"):
        sg.train(model, TRAIN, TEST, epochs=0.5, batch_size=16)


@pytest.mark.parametrize("bad", [None, {}, "w", "version", "pulled_version", "live", "staleness", "state"])
def test_a_bad_server_state_is_a_usage_error_and_changes_nothing(bad):
    server = ParameterServer(sg.make_algorithm("asgd", momentum=0.9), torch.zeros(10), 2)
    good = server.state_dict()
    good = {**good, "w": torch.ones(10), "version": 3, "pulled_version": [1, 2]}
    state = bad if bad in (None, {}) else {**good, bad: {"w": torch.zeros(3), "version": "x", "pulled_version": [1],
                                                        "live": [7], "staleness": 5, "state": 5}[bad]}
    before = {k: (v.clone() if isinstance(v, torch.Tensor) else v) for k, v in server.state_dict(False).items()}
    with pytest.raises(UsageError, match="^load_state_dict: "):
        server.load_state_dict(state)
    assert torch.equal(server.w, before["w"]) and server.version == before["version"]
    assert server.pulled_version == before["pulled_version"]
    server.load_state_dict(good)   # a good one loads
    assert server.version == 3 and torch.equal(server.w, torch.ones(10))
