"""The report's modelled cluster time (stalegrad/study/report_time.py, --time-model): the formula on hand-built
messages, TE over it against hand-computed values, the central variant beside it, bad files."""
import json

import pytest
from click.testing import CliRunner

from stalegrad.cli.report import report
from stalegrad.errors import UsageError
from stalegrad.study.grid import parse
from stalegrad.study.report import write_report
from stalegrad.study.report_time import (FORMAT, load_time_model, modelled_messages, modelled_te,
                                   seconds_per_virtual_second)

pytest.importorskip("matplotlib")


def fake(root, name, algo, accs, *, window=10, step_time=1.0, seed=0, delay="round-robin", runtime="sim"):
    """A finished run of ``algo``: message k (1-based) at virtual time k, 128 samples each, training
    accuracy ``accs[k-1]``; two evaluations (test accuracy 0.1 at 0, the mean of ``accs`` at the end)."""
    d = root / name
    d.mkdir(parents=True)
    (d / "config.json").write_text(json.dumps({
        "algorithm": {"name": algo, "window": window}, "workers": 8, "seed": seed,
        "runtime": {"name": runtime, "step_time": step_time, "delay": delay}}))
    n = len(accs)
    (d / "metrics.jsonl").write_text(
        json.dumps({"virtual_s": 0.0, "wall_s": 0.0, "test_acc": 0.1, "samples": 0}) + "\n"
        + json.dumps({"virtual_s": float(n), "wall_s": 1.0, "test_acc": sum(accs) / n, "samples": 128 * n}) + "\n")
    (d / "messages.jsonl").write_text("".join(
        json.dumps({"samples": 128 * k, "wall_s": 0.01 * k, "virtual_s": float(k), "loss": 1.0, "train_acc": a}) + "\n"
        for k, a in enumerate(accs, 1)))
    (d / "summary.json").write_text(json.dumps({"final_test_acc": accs[-1], "best_test_acc": accs[-1]}))
    (d / "staleness.json").write_text("{}")
    return d


def model_file(path, algorithms, **extra):
    path.write_text(json.dumps({"format": FORMAT, "provenance": {"command": "hand-written", "date": "today"},
                                "algorithms": algorithms, **extra}))
    return path


RAMP = [k / 8 for k in range(1, 9)]           # accuracy V/8 at V = 1..8
SQUARE = [(k / 8) ** 2 for k in range(1, 9)]   # (V/8)^2
CENTRAL = (0.1 + 204 / 512) / (0.1 + 36 / 64)   # central TE of SQUARE against RAMP: two-point test curves


def run_dict(d):
    from stalegrad.study.report import usable_run
    return usable_run(d)


def test_the_modelled_time_of_hand_built_messages(tmp_path):
    d = fake(tmp_path, "agn", "agn", [0.1, 0.2, 0.3], window=10, step_time=2.0)
    (d / "messages.jsonl").write_text("".join(json.dumps(m) + "\n" for m in [
        {"samples": 1280, "virtual_s": 20.0, "wall_s": 9.0, "loss": 1.0, "train_acc": 0.25},
        {"samples": 2560, "virtual_s": 40.0, "wall_s": 9.5, "loss": 1.0, "train_acc": 0.5},
        {"samples": 3840, "virtual_s": 50.0, "wall_s": 9.9, "loss": 1.0, "train_acc": float("nan")}]))
    run = run_dict(d)
    model = load_time_model(model_file(tmp_path / "m.json", {"agn": {"step_s": 0.01, "commit_s": 0.05}}))
    # t(10) = 0.01 x 10 + 0.05 = 0.15 s per commit; one commit is step_time x W = 20 virtual seconds
    assert seconds_per_virtual_second(model, run) == pytest.approx(0.15 / 20)
    # round-robin: a worker's k-th commit at V = 20k is at T = k x t(10); the NaN message is left out
    assert modelled_messages(run, 0.15 / 20) == [pytest.approx((0.15, 1280.0, 0.25)),
                                                 pytest.approx((0.30, 1280.0, 0.5))]


def test_the_most_specific_entry_is_taken(tmp_path):
    run = run_dict(fake(tmp_path, "agn", "agn", RAMP, window=40))
    model = load_time_model(model_file(tmp_path / "m.json", {"agn": [
        {"step_s": 1.0, "commit_s": 0.0}, {"window": 40, "step_s": 0.5, "commit_s": 4.0},
        {"window": 40, "workers": 16, "step_s": 9.0, "commit_s": 9.0}]}))
    assert seconds_per_virtual_second(model, run) == pytest.approx((0.5 * 40 + 4.0) / 40)


def test_te_over_modelled_time_against_hand_computed_values(tmp_path):
    a = run_dict(fake(tmp_path, "a", "agn", RAMP))
    b = run_dict(fake(tmp_path, "b", "aeasgd", RAMP))
    # Equal speeds: two windows [0,4), [4,8] (8 messages, 4 a window): means 2/8 and 6/8 for both: E = 1.
    assert modelled_te(a, b, 1.0, 1.0) == pytest.approx(1.0)
    # a twice as slow: T_a = 2V, horizon 8, windows [0,4), [4,8]: a's means 1/8 (V=1) and 3/8 (V=2,3,4),
    # b's 2/8 and 6/8: E = (1/8 + 3/8) / (2/8 + 6/8) = 0.5.
    assert modelled_te(a, b, 2.0, 1.0) == pytest.approx(0.5)
    # a twice as fast: horizon 4, windows [0,2), [2,4]: a's V=1,2,3 and V=4..8 (2/8, 6/8), b's V=1 and V=2,3,4
    # (1/8, 3/8): E = 2.
    assert modelled_te(a, b, 0.5, 1.0) == pytest.approx(2.0)
    # Only the ratio of the two costs counts: equal costs at any scale are virtual time.
    sq = run_dict(fake(tmp_path, "sq", "agn", SQUARE))
    # (V/8)^2: window means (1+4+9)/3/64 and (16+25+36+49+64)/5/64: area 4 x (14/192 + 114/192) / 2 = 4/3
    assert modelled_te(sq, b, 1.0, 1.0) == pytest.approx((4 / 3) / 2.0)
    assert modelled_te(sq, b, 3.7, 3.7) == pytest.approx(modelled_te(sq, b, 1.0, 1.0))


def test_the_report_with_equal_costs_is_virtual_time_and_a_doubled_cost_halves_e(tmp_path):
    fake(tmp_path / "runs", "agn", "agn", SQUARE)
    fake(tmp_path / "runs", "ae", "aeasgd", RAMP)
    equal = model_file(tmp_path / "equal.json", {"agn": {"step_s": 0.1, "commit_s": 0.5},
                                                 "aeasgd": {"step_s": 0.1, "commit_s": 0.5}})
    write_report([tmp_path / "runs"], tmp_path / "eq", baseline="aeasgd", variant="workers-modelled", time_model=equal)
    rep = json.loads((tmp_path / "eq" / "report.json").read_text())
    agn = next(g for g in rep["groups"] if g["algo"] == "agn")
    assert rep["variant"]["used"] == "workers-modelled"
    assert agn["temporal_efficiency"]["mean"] == pytest.approx(2 / 3)   # the virtual-time value, by hand above
    # the central variant beside it: test accuracy 0.1 -> 204/512 (agn) and 0.1 -> 36/64 (aeasgd) over V in [0, 8]
    assert agn["temporal_efficiency_central"]["mean"] == pytest.approx(CENTRAL)
    assert agn["modelled"]["seconds_per_commit"] == pytest.approx(1.5)
    md = (tmp_path / "eq" / "report.md").read_text()
    assert "**Modelled time**" in md and "E central" in md and str(equal) in md
    # agn's commit costs twice aeasgd's (3.0 s against 1.5 s): E from 2/3 to the hand-computed (on the
    # ramp above, 1/2 for equal curves); here agn's squares: windows [0,4) V=1 (1/64), [4,8] V=2,3,4
    # ((4+9+16)/3/64): E = (1/64 + 29/192) / (2/8 + 6/8)
    double = model_file(tmp_path / "double.json", {"agn": {"step_s": 0.1, "commit_s": 2.0},
                                                   "aeasgd": {"step_s": 0.1, "commit_s": 0.5}})
    write_report([tmp_path / "runs"], tmp_path / "dbl", baseline="aeasgd", time_model=double,
                 variant="workers-modelled")
    rep2 = json.loads((tmp_path / "dbl" / "report.json").read_text())
    agn2 = next(g for g in rep2["groups"] if g["algo"] == "agn")
    assert agn2["temporal_efficiency"]["mean"] == pytest.approx((1 / 64 + 29 / 192) / 1.0)
    assert agn2["temporal_efficiency"]["mean"] < agn["temporal_efficiency"]["mean"]
    assert agn2["temporal_efficiency_central"] == agn["temporal_efficiency_central"]   # the model does not touch it


def test_the_protocol_gets_both_figures(tmp_path):
    for s in (0, 1, 2):
        fake(tmp_path / "runs", f"agn{s}", "agn", SQUARE, seed=s)
        fake(tmp_path / "runs", f"ae{s}", "aeasgd", RAMP, seed=s)
    tm = model_file(tmp_path / "m.json", {"agn": {"step_s": 0.1, "commit_s": 0.5}, "aeasgd": {"step_s": 0.1, "commit_s": 0.5}})
    write_report([tmp_path / "runs"], tmp_path / "out", baseline="aeasgd", variant="workers-modelled", time_model=tm,
                 protocol={"select_seeds": [0], "report_seeds": [1, 2]})
    figs = json.loads((tmp_path / "out" / "report.json").read_text())["protocol"]["figures"]
    kinds = {f["kind"]: f for f in figs}
    assert kinds["temporal efficiency"]["mean"] == pytest.approx(2 / 3)
    assert kinds["temporal efficiency (central)"]["mean"] == pytest.approx(CENTRAL)


def invoke(*args):
    return CliRunner().invoke(report, [str(a) for a in args])


def test_a_bad_time_model_is_one_line_exit_2_and_nothing_written(tmp_path):
    fake(tmp_path / "runs", "agn", "agn", RAMP)
    fake(tmp_path / "runs", "ae", "aeasgd", RAMP)
    ok = {"agn": {"step_s": 0.1, "commit_s": 0.5}, "aeasgd": {"step_s": 0.1, "commit_s": 0.5}}
    (tmp_path / "notjson.json").write_text("{oops")
    cases = [
        (["--time-model", tmp_path / "missing.json"], "no such file"),
        (["--time-model", tmp_path / "notjson.json"], "not JSON"),
        (["--time-model", model_file(tmp_path / "fmt.json", ok, format="other")], "not a time model"),
        (["--time-model", model_file(tmp_path / "neg.json", {**ok, "agn": {"step_s": -1, "commit_s": 0}})],
         "step_s must be a finite number of seconds >= 0"),
        (["--time-model", model_file(tmp_path / "nocommit.json", {**ok, "agn": {"step_s": 0.1}})], "no 'commit_s'"),
        (["--time-model", model_file(tmp_path / "noalgo.json", {"aeasgd": ok["aeasgd"]})], "no cost for algorithm 'agn'"),
        (["--time-model", model_file(tmp_path / "win.json", {**ok, "agn": {"window": 40, "step_s": 1, "commit_s": 1}})],
         "no entry of 'agn' fits window 10"),
        (["--variant", "workers-modelled"], "needs --time-model"),
        (["--variant", "central", "--time-model", model_file(tmp_path / "ok.json", ok)], "is for --variant workers-modelled"),
    ]
    for args, words in cases:
        res = invoke(tmp_path / "runs", "--out", tmp_path / "out", "--baseline", "aeasgd", *args)
        assert res.exit_code == 2, (args, res.output)
        assert len(res.output.strip().splitlines()) == 1 and words in res.output, (args, res.output)
        assert not (tmp_path / "out").exists()
    res = invoke(tmp_path / "runs", "--out", tmp_path / "out", "--baseline", "aeasgd", "--time-model", tmp_path / "ok.json")
    assert res.exit_code == 0, res.output    # --time-model alone: the workers-modelled variant
    assert json.loads((tmp_path / "out" / "report.json").read_text())["variant"]["used"] == "workers-modelled"


def test_a_non_simulated_run_is_refused(tmp_path):
    fake(tmp_path / "runs", "agn", "agn", RAMP, runtime="local")
    tm = model_file(tmp_path / "m.json", {"agn": {"step_s": 0.1, "commit_s": 0.5}})
    res = invoke(tmp_path / "runs", "--out", tmp_path / "out", "--time-model", tm)
    assert res.exit_code == 2 and "models simulated runs" in res.output and not (tmp_path / "out").exists()


def test_a_grid_takes_time_model_in_its_report_table(tmp_path):
    grid = tmp_path / "g.toml"
    body = '[fixed]\ndataset = "synthetic"\n[axes]\nalgos = ["agn", "aeasgd"]\n[report]\nbaseline = "aeasgd"\n'
    grid.write_text(body + 'time_model = "m.json"\n')
    with pytest.raises(UsageError, match=r"\[report\] --time-model .*m.json: no such file"):
        parse(grid)
    model_file(tmp_path / "m.json", {"agn": {"step_s": 0.1, "commit_s": 0.5}})
    _, _, rep = parse(grid)
    assert rep["time_model"] == str(tmp_path / "m.json") and rep["variant"] == "workers-modelled"
    grid.write_text(body + "time_model = 3\n")
    with pytest.raises(UsageError, match="time_model must be a file's path"):
        parse(grid)
