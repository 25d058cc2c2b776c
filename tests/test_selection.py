"""The protocol of issue 18: the validation split, the selection statistic, the grid-edge check,
the intervals (against hand-computed values) and the verdicts, and the placebo arm."""
import itertools
import json
import math
import statistics

import pytest
import torch

import stalegrad as sg
from stalegrad.run.config import RunConfig
from stalegrad.data.split import VAL_SPLIT_SEED, holdout, split_indices, val_count
from stalegrad.errors import ConfigError, UsageError
from stalegrad.study.selection import MAX_SEED, edges, extend, failure_rate, run_failure, score, seed_list, select
from stalegrad.study.stats import (DOES_NOT_HOLD, HOLDS, INCONCLUSIVE, bootstrap, quantile, ratio_of_gaps, t_interval,
                             t_quantile, verdict)
from tests.helpers import TEST, TRAIN, blobs

# ---------------------------------------------------------------- the split


def test_the_split_is_disjoint_complete_sorted_and_the_same_every_time():
    train, val = split_indices(100, 30)
    assert len(val) == 30 and len(train) == 70
    assert set(train.tolist()).isdisjoint(val.tolist())
    assert sorted(train.tolist() + val.tolist()) == list(range(100))
    assert train.tolist() == sorted(train.tolist()) and val.tolist() == sorted(val.tolist())
    again = split_indices(100, 30)
    assert torch.equal(again[1], val) and torch.equal(again[0], train)
    assert not torch.equal(split_indices(100, 30, seed=VAL_SPLIT_SEED + 1)[1], val)   # the seed draws it
    assert val.tolist() != list(range(30))   # a draw, not the first samples


def test_a_fraction_rounds_to_a_count():
    assert val_count(0.1, 1437) == 144 and val_count(200, 1437) == 200 and val_count(0, 1437) == 0
    assert RunConfig(val_split=0.25).validate().val_samples(1000) == 250
    assert RunConfig(val_split=5000.0).validate().val_split == 5000     # a whole float is a count


def test_holdout_keeps_the_samples_and_their_labels():
    data = blobs(n=50)
    train, val = holdout(data, 10)
    t_idx, v_idx = split_indices(50, 10)
    assert torch.equal(train.x, data.x[t_idx]) and torch.equal(val.y, data.y[v_idx])
    assert train.num_classes == data.num_classes
    assert holdout(data, 0) == (data, None)


@pytest.mark.parametrize("value", [-1, 1.5, math.nan, math.inf, "10", True])
def test_a_bad_val_split_is_refused_naming_it(value):
    with pytest.raises(ConfigError, match="val_split"):
        RunConfig(val_split=value).validate()


def test_a_split_that_leaves_too_little_to_train_on_is_refused():
    cfg = RunConfig(workers=4, batch_size=16, val_split=200).validate()
    with pytest.raises(ConfigError, match=r"val_split.*hold out at most 192"):     # 256 - 4 x 16
        cfg.check_data(TRAIN, TEST)
    with pytest.raises(ConfigError, match="val_split.*leaving none"):
        RunConfig(val_split=256).validate().check_data(TRAIN, TEST)
    with pytest.raises(ConfigError, match="rounds to 0"):
        RunConfig(val_split=0.001).validate().check_data(TRAIN, TEST)
    RunConfig(workers=4, batch_size=16, val_split=192).validate().check_data(TRAIN, TEST)   # the edge passes


def test_the_cli_refuses_a_bad_split_in_one_line(tmp_path, capsys):
    from stalegrad.cli import main
    for value in ("2000", "1.5", "0.0001"):
        code = main(["train", "--val-split", value, "--epochs", "0.2", "--out", str(tmp_path / "r")])
        err = capsys.readouterr().err
        assert code == 2 and "--val-split" in err and len(err.strip().splitlines()) == 1, err
    assert not (tmp_path / "r").exists()


def run(train_data=TRAIN, **kw):
    opts = dict(algorithm="asgd", workers=4, epochs=2, batch_size=16, lr=0.1, seed=3, eval_every=0.5)
    opts.update(kw)
    return sg.train("mlp", train_data, TEST, **opts)


def test_held_out_samples_are_never_trained_on():
    # poison the samples the split holds out: one of them in a mini-batch would make a NaN gradient
    poisoned = blobs(n=256)
    _, val_idx = split_indices(256, 40)
    poisoned.x[val_idx] = math.nan
    r = run(poisoned, val_split=40)
    assert r.summary["nonfinite_skipped"] == 0 and math.isfinite(r.summary["final_test_loss"])
    assert r.summary["final_val_loss"] is None or not math.isfinite(r.summary["final_val_loss"])  # they are NaN
    assert run(poisoned).summary["nonfinite_skipped"] > 0     # without the split they are trained on: the test can fail


def test_the_budget_and_the_shards_count_the_remaining_samples_only():
    r = run(val_split=56)
    assert r.config["train_samples"] == 200 and r.config["val_samples"] == 56 and r.config["val_split"] == 56
    assert r.config["val_split_seed"] == VAL_SPLIT_SEED
    assert 400 <= r.summary["samples"] < 400 + 4 * 16      # 2 epochs of the 200 training samples
    assert r.summary["epochs"] == pytest.approx(r.summary["samples"] / 200, abs=1e-6)


def test_a_split_run_equals_a_run_on_the_training_part_given_by_hand():
    """The split only takes samples away; evaluating the validation set changes no bit of training."""
    split = run(val_split=56)
    train_part, val_part = holdout(TRAIN, 56)
    by_hand = run(train_part)
    assert split.summary["weights_sha256"] == by_hand.summary["weights_sha256"]
    assert [m["test_acc"] for m in split.metrics] == [m["test_acc"] for m in by_hand.metrics]
    # the validation figures are the model's accuracy on the held-out samples, evaluated independently
    model = by_hand.model
    with torch.no_grad():
        acc = (model(val_part.x).argmax(1) == val_part.y).float().mean().item()
    assert split.summary["final_val_acc"] == pytest.approx(acc, abs=1e-6)
    assert split.summary["best_val_acc"] == max(m["val_acc"] for m in split.metrics)
    assert all("val_acc" in m and "val_loss" in m for m in split.metrics)


def test_no_split_leaves_the_run_as_it_was():
    default, zero = run(), run(val_split=0)
    assert default.summary["weights_sha256"] == zero.summary["weights_sha256"]
    assert "val_split" not in zero.config and "val_samples" not in zero.config
    assert "final_val_acc" not in zero.summary and all("val_acc" not in m for m in zero.metrics)
    assert zero.config["train_samples"] == 256


def test_the_split_is_the_same_for_every_training_seed():
    a, b = run(val_split=56, seed=0, epochs=0.5), run(val_split=56, seed=1, epochs=0.5)
    assert a.config["train_samples"] == b.config["train_samples"]
    assert a.summary["weights_sha256"] != b.summary["weights_sha256"]   # the seed still changes the training


def test_a_model_with_batchnorm_statistics_splits_in_the_simulator_and_is_refused_by_runtime_local():
    def bn():
        return torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.BatchNorm1d(16), torch.nn.ReLU(),
                                   torch.nn.Linear(16, 3))
    with pytest.raises(ConfigError, match="val_split with runtime local needs a model without BatchNorm"):
        sg.train(bn(), TRAIN, TEST, "asgd", 2, runtime="local", val_split=40, epochs=0.5, batch_size=16)
    r = sg.train(bn(), TRAIN, TEST, "asgd", 2, val_split=40, epochs=0.5, batch_size=16)
    assert 0 <= r.summary["final_val_acc"] <= 1


# ---------------------------------------------------------------- the placebo arm


@pytest.mark.parametrize("delay", ["uniform", "gamma:2"])
def test_dcasgd_c_with_lam_0_is_asgd_bit_for_bit(delay):
    kw = dict(workers=4, epochs=1, batch_size=16, lr=0.1, seed=5, delay=delay)
    from stalegrad.runtimes.sim import Simulator
    asgd = sg.train("mlp", TRAIN, TEST, algorithm="asgd", runtime=Simulator(delay=delay),
                    **{k: v for k, v in kw.items() if k != "delay"})
    placebo = sg.train("mlp", TRAIN, TEST, algorithm=sg.make_algorithm("dcasgd-c", lam=0.0),
                       runtime=Simulator(delay=delay), **{k: v for k, v in kw.items() if k != "delay"})
    corrected = sg.train("mlp", TRAIN, TEST, algorithm=sg.make_algorithm("dcasgd-c", lam=4.0),
                         runtime=Simulator(delay=delay), **{k: v for k, v in kw.items() if k != "delay"})
    assert placebo.summary["weights_sha256"] == asgd.summary["weights_sha256"]
    assert corrected.summary["weights_sha256"] != asgd.summary["weights_sha256"]   # the test can fail


# ---------------------------------------------------------------- selection and edges


def cand(algo, lr, values, **setting):
    return {"algo": algo, "setting": {"lr": lr, **setting}, "values": values}


def test_selection_picks_the_known_best_mean_over_the_selection_seeds_only():
    # the best by validation on seeds 0-1 is lr 0.1 (mean 0.80); lr 0.3 is better on seed 2, which is not
    # a selection seed, and on seed 0 alone
    cands = [cand("asgd", 0.03, {0: 0.70, 1: 0.72, 2: 0.70}, workers=4),
             cand("asgd", 0.1, {0: 0.79, 1: 0.81, 2: 0.70}, workers=4),
             cand("asgd", 0.3, {0: 0.85, 1: 0.60, 2: 0.99}, workers=4),
             cand("asgd", 0.03, {0: 0.50, 1: 0.50, 2: 0.5}, workers=8),
             cand("asgd", 0.1, {0: 0.40, 1: 0.40, 2: 0.4}, workers=8)]
    picks = select(cands, ["lr"], [0, 1])
    assert [(p["cell"], p["tuned"]) for p in picks] == [({"workers": 4}, {"lr": 0.1}), ({"workers": 8}, {"lr": 0.03})]
    assert picks[0]["score"] == pytest.approx(0.80) and picks[0]["edges"] == []
    assert picks[1]["edges"][0]["side"] == "smallest" and picks[1]["edges"][0]["suggest"] == pytest.approx(0.009)


def test_selection_over_two_axes_per_algorithm():
    grid = {(lr, lam): 0.5 + (lr == 0.1) * 0.1 + (lam == 4.0) * 0.2 for lr in (0.03, 0.1, 0.3) for lam in (1.0, 4.0, 16.0)}
    cands = [cand("dcasgd-c", lr, {0: v, 1: v}, lam=lam) for (lr, lam), v in grid.items()]
    cands += [cand("asgd", lr, {0: 0.9 - lr, 1: 0.9 - lr}) for lr in (0.03, 0.1, 0.3)]
    picks = {p["algo"]: p for p in select(cands, ["lr", "lam"], [0, 1])}
    assert picks["dcasgd-c"]["tuned"] == {"lr": 0.1, "lam": 4.0} and picks["dcasgd-c"]["edges"] == []
    assert picks["asgd"]["tuned"] == {"lr": 0.03}
    assert [e["axis"] for e in picks["asgd"]["edges"]] == ["lr"]


def test_a_diverged_or_missing_run_never_wins_and_ties_go_to_the_first():
    cands = [cand("a", 0.1, {0: 0.5, 1: 0.5}), cand("a", 0.2, {0: 0.5, 1: 0.5}), cand("a", 0.4, {0: 0.99, 1: None}),
             cand("a", 0.8, {0: 0.99})]
    p = select(cands, ["lr"], [0, 1])[0]
    assert p["tuned"] == {"lr": 0.1}
    assert [s["missing"] for s in p["scores"]] == [[], [], [], [1]]
    assert math.isnan(score({0: 0.9, 1: math.nan}, [0, 1])[0])


def test_a_failed_run_scores_nan_ranks_last_and_is_counted_with_its_reason():
    fail = {0: None, 1: "diverged (summary.json)"}
    cands = [cand("a", 0.1, {0: 0.5, 1: 0.5}), dict(cand("a", 0.2, {0: 0.99, 1: 0.98}), failures=fail),
             dict(cand("a", 0.4, {0: 0.6, 1: 0.6}), failures={0: None, 1: None})]
    p = select(cands, ["lr"], [0, 1])[0]
    assert p["tuned"] == {"lr": 0.4} and p["score"] == pytest.approx(0.6)   # 0.2's finite 0.985 is not averaged in
    by_lr = {s["tuned"]["lr"]: s for s in p["scores"]}
    assert math.isnan(by_lr[0.2]["score"]) and by_lr[0.2]["failed"] == {1: "diverged (summary.json)"}
    assert by_lr[0.2]["failure_rate"] == "1 of 2 diverged" and by_lr[0.4]["failure_rate"] == "0 of 2 diverged"
    assert by_lr[0.1]["failure_rate"] == "0 of 2 diverged"       # no failures given: none known
    # a failure of a seed that is not a selection seed is not the selection's business
    other = dict(cand("a", 0.2, {0: 0.9, 1: 0.9, 2: 0.9}), failures={2: "x"})
    assert select([other], ["lr"], [0, 1])[0]["score"] == 0.9
    assert math.isnan(score({0: 0.9, 1: 0.9}, [0, 1], {1: "at chance"})[0])
    assert failure_rate([None, "x", None]) == "1 of 3 diverged" and failure_rate({}) == "0 of 0 diverged"


@pytest.mark.parametrize("summary, num_classes, reason", [
    ({"final_test_acc": 0.9, "final_test_loss": 0.3, "diverged": False, "final_val_acc": 0.9, "final_val_loss": 0.3},
     10, None),
    ({"final_test_acc": 0.9, "final_test_loss": 0.3, "diverged": True}, 10, "diverged (summary.json)"),
    ({"final_test_acc": None, "final_test_loss": None, "diverged": False}, 10, "final test loss is not finite"),
    ({"final_val_acc": None, "final_val_loss": 2.3}, 10, "final validation accuracy is not finite"),
    ({"final_val_acc": 0.9, "final_val_loss": float("inf")}, 10, "final validation loss is not finite"),
    ({"final_test_acc": float("nan")}, None, "final test accuracy is not finite"),
    ({"final_val_acc": 0.1135, "final_test_acc": 0.9}, 10,
     "final validation accuracy 0.1135 is at chance (at most 1/10 + 0.05 = 0.1500)"),
    ({"final_val_acc": 0.9, "final_test_acc": 0.15}, 10,
     "final test accuracy 0.1500 is at chance (at most 1/10 + 0.05 = 0.1500)"),
    ({"final_val_acc": 0.1501, "final_test_acc": 0.16}, 10, None),     # just above chance: a poor run, not failed
    ({"final_val_acc": 0.1}, None, None),                             # no class count: no chance check
    ({"final_val_acc": 0.7}, 2, None),                                # a binary classifier that learned
    ({"final_val_acc": 0.55}, 2, "final validation accuracy 0.5500 is at chance (at most 1/2 + 0.05 = 0.5500)"),
    ({}, 10, None),                                                   # nothing to check
])
def test_run_failure(summary, num_classes, reason):
    assert run_failure(summary, num_classes) == reason


def test_every_data_set_has_the_class_count_the_chance_check_assumes():
    """summary.json does not record the class count; report_protocol.NUM_CLASSES stands for it. A data set
    with another count must make the chance check read it first: this fails when one is added."""
    import ast
    from pathlib import Path

    from stalegrad.data import DATASETS, SYNTHETIC_CLASSES
    from stalegrad.study.report_protocol import NUM_CLASSES
    assert DATASETS == ("mnist", "fashion-mnist", "cifar10", "digits", "synthetic") and SYNTHETIC_CLASSES == NUM_CLASSES
    for path in (Path(sg.__file__).parent / "data").glob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Call) and getattr(node.func, "id", None) == "Dataset":
                last = node.args[-1]
                assert (isinstance(last, ast.Constant) and last.value == NUM_CLASSES) or \
                    getattr(last, "id", None) == "SYNTHETIC_CLASSES", (path.name, ast.unparse(node))


def test_edges_and_their_extension():
    assert edges({"lr": 0.3}, {"lr": [0.03, 0.1, 0.3]})[0]["suggest"] == pytest.approx(0.9)
    assert edges({"lr": 0.1}, {"lr": [0.03, 0.1, 0.3]}) == []
    assert edges({"lr": 0.1}, {"lr": [0.1]}) == []          # one value: no grid to be at the edge of
    assert extend([0, 1, 2], "largest") == 3 and extend([0.0, 0.04, 1.0], "smallest") is None
    assert extend([-1.0, 0.0, 1.0], "smallest") == -2
    assert extend([4, 8, 16], "smallest") == 2


# ---------------------------------------------------------------- intervals and verdicts


def test_t_quantiles_against_the_tables():
    # Student's t table (two-sided 95%): df 1, 2, 3, 10, 30
    for df, t in [(1, 12.7062), (2, 4.3027), (3, 3.1824), (10, 2.2281), (30, 2.0423)]:
        assert t_quantile(0.975, df) == pytest.approx(t, abs=1e-4)
    assert t_quantile(0.025, 5) == pytest.approx(-t_quantile(0.975, 5))
    assert t_quantile(0.975, 10**6) == pytest.approx(1.95996, abs=1e-4)    # the normal's 1.96


def test_t_interval_of_1_2_3_4_by_hand():
    # mean 2.5, s = sqrt(5/3) = 1.290994, s / sqrt(4) = 0.645497, t_{0.975, 3} = 3.182446: half 2.054260
    iv = t_interval([1, 2, 3, 4])
    assert iv["mean"] == 2.5 and iv["n"] == 4
    assert iv["lo"] == pytest.approx(2.5 - 2.054260, abs=1e-5) and iv["hi"] == pytest.approx(2.5 + 2.054260, abs=1e-5)
    assert math.isnan(t_interval([1.0])["lo"]) and math.isnan(t_interval([1.0, math.nan])["mean"])


def test_the_bootstrap_against_a_hand_enumerated_case():
    # [0, 0, 1]: the 27 resamples' means are k/3 with k ~ Binomial(3, 1/3): P = 8, 12, 6, 1 (/27).
    # 80%: the 10% quantile is 0 (8/27 >= 0.1), the 90% quantile is 2/3 (20/27 < 0.9 <= 26/27)
    b = bootstrap([[0, 0, 1]], lambda m: m, level=0.8)
    assert (b["value"], b["lo"], b["hi"]) == (pytest.approx(1 / 3), 0.0, pytest.approx(2 / 3))
    b = bootstrap([[0, 0, 1]], lambda m: m)           # 95%: the 97.5% quantile is 1 (26/27 < 0.975)
    assert (b["lo"], b["hi"]) == (0.0, 1.0)
    # an independent enumeration of a paired ratio, n = 4
    x, lo, hi = [0.80, 0.82, 0.78, 0.81], [0.70, 0.75, 0.74, 0.72], [0.90, 0.88, 0.91, 0.89]
    stats = sorted((sum(x[i] for i in idx) - sum(lo[i] for i in idx)) / (sum(hi[i] for i in idx) - sum(lo[i] for i in idx))
                   for idx in itertools.product(range(4), repeat=4))
    b = bootstrap([x, lo, hi], ratio_of_gaps)
    assert b["lo"] == pytest.approx(stats[math.ceil(0.025 * 256) - 1]) and b["hi"] == pytest.approx(stats[math.ceil(0.975 * 256) - 1])
    assert b["value"] == pytest.approx((statistics.fmean(x) - statistics.fmean(lo)) / (statistics.fmean(hi) - statistics.fmean(lo)))


def test_the_sampled_bootstrap_is_seeded():
    cols = [[math.sqrt(i + 0.1 * i * i) for i in range(9)]]
    a, b = bootstrap(cols, lambda m: m), bootstrap(cols, lambda m: m)
    assert a == b and a["method"].startswith("bootstrap (10000")
    assert bootstrap(cols, lambda m: m, seed=1)["lo"] != a["lo"] or bootstrap(cols, lambda m: m, seed=1)["hi"] != a["hi"]
    assert a["lo"] < statistics.fmean(cols[0]) < a["hi"]


def test_a_ratio_whose_gap_vanishes_gives_no_interval():
    b = bootstrap([[1, 2], [0, 0], [0, 0]], ratio_of_gaps)       # every resample has gap 0
    assert math.isnan(b["lo"]) and b["undefined"] == 4


def test_quantile_is_the_inverse_cdf():
    assert quantile([3, 1, 2, 4], 0.5) == 2 and quantile([3, 1, 2, 4], 0.51) == 3 and quantile([5], 0.975) == 5


@pytest.mark.parametrize("lo, hi, null, direction, expected", [
    (0.1, 0.3, 0.0, 1, HOLDS), (-0.3, -0.1, 0.0, 1, DOES_NOT_HOLD), (-0.1, 0.3, 0.0, 1, INCONCLUSIVE),
    (0.0, 0.3, 0.0, 1, INCONCLUSIVE), (1.1, 1.4, 1.0, 1, HOLDS), (-0.3, -0.1, 0.0, -1, HOLDS),
    (math.nan, math.nan, 0.0, 1, INCONCLUSIVE)])
def test_verdicts(lo, hi, null, direction, expected):
    assert verdict(lo, hi, null, direction) == expected


def test_seed_lists_parse_ranges_and_refuse_anything_else_in_one_line_naming_the_option():
    assert seed_list("--select-seeds", " 3-5, 0,4 ") == [3, 4, 5, 0]     # ranges, in order, each seed once
    assert seed_list("--select-seeds", None) is None
    for text, why in (("2-0", "integers >= 0 and ranges"), ("a", "integers >= 0 and ranges"), ("", "ranges"),
                      (f"0,{MAX_SEED + 1}", f"larger than any seed a run takes ({MAX_SEED})"),
                      ("0-10000", "10001 seeds, more than the 10000")):
        with pytest.raises(UsageError, match="^--report-seeds ") as e:
            seed_list("--report-seeds", text)
        assert why in str(e.value) and "\n" not in str(e.value)
