"""stalegrad report: groups over seeds, mean ± std cells, time to target, temporal efficiency, plots, bad input."""
import json
import shutil
import statistics

import pytest
from click.testing import CliRunner

from stalegrad.cli import main
from stalegrad.cli.report import report
from stalegrad.run.metrics import temporal_efficiency
from stalegrad.study.report import write_report
from stalegrad.run.results import read_run

pytest.importorskip("matplotlib")

SEEDS = (0, 1, 2)
RUN = ["--dataset", "synthetic", "--model", "logreg", "--epochs", "0.5", "--eval-every", "0.125", "--quiet"]
PNGS = ("accuracy.png", "staleness.png", "heatmap.png", "accuracy_vs_workers.png")


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """sgd (1 worker) and asgd (2 workers) by compare, asgd with 4 workers by train, for three seeds;
    asgd with 4 workers at lr 0.3 for two seeds (a learning-rate sweep)."""
    root = tmp_path_factory.mktemp("runs")
    for s in SEEDS:
        assert main(["compare", "--algos", "sgd,asgd", "--workers", "2", *RUN, "--seed", str(s),
                     "--out", str(root / f"cmp{s}")]) == 0
        assert main(["train", "--algo", "asgd", "--workers", "4", *RUN, "--seed", str(s),
                     "--out", str(root / "w4" / f"s{s}")]) == 0
    for s in SEEDS[:2]:
        assert main(["train", "--algo", "asgd", "--workers", "4", "--lr", "0.3", *RUN, "--seed", str(s),
                     "--out", str(root / "deep" / "lr" / f"s{s}")]) == 0
    return root


def invoke(*args):
    return CliRunner().invoke(report, [str(a) for a in args])


@pytest.fixture(scope="module")
def made(runs, tmp_path_factory):
    out = tmp_path_factory.mktemp("report")
    res = invoke(runs, "--out", out)
    assert res.exit_code == 0, res.output
    return out, json.loads((out / "report.json").read_text()), (out / "report.md").read_text()


def group(rep, label):
    return next(g for g in rep["groups"] if g["label"] == label)


def row(md, label, section="## Test accuracy"):
    """The cells of ``label``'s row in the first table after ``section``."""
    return next(ln for ln in md[md.index(section):].splitlines() if ln.startswith(f"| {label} |")).split(" | ")


def test_runs_that_differ_only_by_seed_form_one_group(made, runs):
    _, rep, md = made
    labels = [g["label"] for g in rep["groups"]]
    assert labels == ["sgd workers=1 lr=0.1", "asgd workers=2 lr=0.1", "asgd workers=4 lr=0.1", "asgd workers=4 lr=0.3"]
    assert [g["seeds"] for g in rep["groups"]] == [[0, 1, 2]] * 3 + [[0, 1]]
    assert group(rep, "asgd workers=4 lr=0.1")["runs"][1]["dir"] == str(runs / "w4" / "s1")
    assert rep["compared"]["runs"] == 11 and rep["compared"]["axes"] == {
        "algo": ["sgd", "asgd"], "workers": [1, 2, 4], "lr": [0.1, 0.3]}
    head = md.split("## Test accuracy")[0]
    assert "data set synthetic, model logreg, 0.5 epochs; seeds 0, 1, 2" in head
    assert "workers (1, 2, 4)" in head and "lr (0.1, 0.3)" in head


def test_a_cell_is_mean_and_std_over_the_seeds_summaries(made, runs):
    _, rep, md = made
    finals = [read_run(runs / f"cmp{s}" / "asgd")["summary"]["final_test_acc"] for s in SEEDS]
    mean, std = statistics.mean(finals), statistics.stdev(finals)
    g = group(rep, "asgd workers=2 lr=0.1")
    assert g["final_test_acc"] == {"mean": pytest.approx(mean), "std": pytest.approx(std), "n": 3}
    assert row(md, "asgd workers=2 lr=0.1")[1] == f"{mean:.3f} ± {std:.3f} (3)"
    taus = [read_run(runs / "w4" / f"s{s}")["summary"]["tau_mean"] for s in SEEDS]
    assert group(rep, "asgd workers=4 lr=0.1")["tau_mean"]["mean"] == pytest.approx(statistics.mean(taus))
    assert group(rep, "asgd workers=4 lr=0.3")["final_test_acc"]["n"] == 2


def test_time_to_target_interpolates_between_evaluations(runs, tmp_path):
    metrics = read_run(runs / "w4" / "s0")["metrics"]
    acc = [m["test_acc"] for m in metrics]
    i = next(i for i in range(1, len(acc)) if acc[i] > acc[i - 1] and acc[i] > max(acc[:i]) + 1e-3 and i > 1)
    target = (max(acc[:i]) + acc[i]) / 2
    lo, hi = metrics[i - 1], metrics[i]
    assert lo["test_acc"] < target < hi["test_acc"]    # the crossing lies between evaluations i-1 and i
    frac = (target - lo["test_acc"]) / (hi["test_acc"] - lo["test_acc"])
    want = {k: lo[k] + frac * (hi[k] - lo[k]) for k in ("wall_s", "virtual_s", "samples")}
    write_report([runs], tmp_path, target=target)
    rep = json.loads((tmp_path / "report.json").read_text())
    got = group(rep, "asgd workers=4 lr=0.1")["runs"][0]
    assert got["dir"] == str(runs / "w4" / "s0")
    assert got["time_to_target"] == pytest.approx(want)
    assert rep["target"] == {"test_acc": target, "default": False, "rule": "given with --target"}
    # an accuracy nobody reaches
    write_report([runs], tmp_path / "hard", target=0.999)
    md = (tmp_path / "hard" / "report.md").read_text()
    assert "| sgd workers=1 lr=0.1 | not reached (3 of 3 seeds) |" in md


def test_the_default_target_is_said(made):
    _, rep, md = made
    best = max(g["best_test_acc"]["mean"] for g in rep["groups"])
    assert rep["target"]["default"] and rep["target"]["test_acc"] == pytest.approx(0.9 * best)
    assert f"0.9 x {best:.4f}, the mean best test accuracy of the best group" in md


def test_temporal_efficiency_against_itself_is_one_and_agrees_with_metrics(made, runs, tmp_path):
    _, rep, md = made
    assert rep["baseline"]["algorithm"] == "sgd" and rep["baseline"]["default"]
    assert "- Baseline: sgd (the default: sgd when present" in md
    sgd = group(rep, "sgd workers=1 lr=0.1")["temporal_efficiency"]
    assert sgd["mean"] == 1.0 and sgd["std"] == 0.0 and sgd["n"] == 3
    assert row(md, "sgd workers=1 lr=0.1", "## Temporal efficiency")[1] == "1.000 ± 0.000 (3)"
    a, b = (read_run(runs / "cmp1" / name)["metrics"] for name in ("asgd", "sgd"))
    curve = lambda ms: ([m["virtual_s"] for m in ms], [m["test_acc"] for m in ms])   # noqa: E731
    asgd = group(rep, "asgd workers=2 lr=0.1")
    assert asgd["runs"][1]["temporal_efficiency"] == temporal_efficiency(curve(a), curve(b))
    assert asgd["temporal_efficiency"]["baseline_group"] == "sgd workers=1 lr=0.1"
    # against a many-worker baseline, each group is paired with the one of the same workers
    write_report([runs], tmp_path, baseline="asgd")
    rep2 = json.loads((tmp_path / "report.json").read_text())
    for label in ("asgd workers=2 lr=0.1", "asgd workers=4 lr=0.1"):
        te = group(rep2, label)["temporal_efficiency"]
        assert te["baseline_group"] == label and te["std"] == 0.0
        assert [r["temporal_efficiency"] for r in group(rep2, label)["runs"]] == [1.0, 1.0, 1.0]


def test_report_json_is_strict_and_the_plots_exist(made):
    out, rep, md = made

    def refuse(token):
        raise ValueError(f"non-standard JSON token {token}")
    json.loads((out / "report.json").read_text(), parse_constant=refuse)
    assert "null" in (out / "report.json").read_text()     # undefined values (time to an unreached target)
    for name in PNGS:
        data = (out / name).read_bytes()
        assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 5000, name
        assert f"]({name})" in md
    assert rep["plots"] == dict(zip(("accuracy", "staleness", "heatmap", "workers"), PNGS))
    assert rep["skipped_plots"] == {}
    sections = ["**Compared:**", "## Test accuracy", "## Time to reach", "## Temporal efficiency",
                "## Staleness and NaN/Inf", "## Learning rates", "## Plots", "## Notes"]
    assert [md.index(s) for s in sections] == sorted(md.index(s) for s in sections)
    assert "- Diverged runs: 0 of 11." in md and "- Variant: central" in md


def test_learning_rate_sweep(made):
    _, rep, md = made
    sweep = rep["lr_sweep"]
    assert sweep["shared_lr"] == 0.1 and len(sweep["rows"]) == 1
    r = sweep["rows"][0]
    assert r["setting"] == "asgd workers=4" and r["lrs"] == [0.1, 0.3]
    best = max(("asgd workers=4 lr=0.1", "asgd workers=4 lr=0.3"),
               key=lambda label: group(rep, label)["best_test_acc"]["mean"])
    assert r["best_group"] == best and r["shared_lr_test_acc"] == group(rep, "asgd workers=4 lr=0.1")["best_test_acc"]


def test_the_workers_variant_falls_back_and_says_so(made, runs, tmp_path):
    _, central, _ = made
    old = tmp_path / "old"        # runs of stalegrad < 0.3: no messages.jsonl
    shutil.copytree(runs, old)
    for f in old.rglob("messages.jsonl"):
        f.unlink()
    res = invoke(old, "--out", tmp_path, "--variant", "workers")
    assert res.exit_code == 0, res.output
    rep = json.loads((tmp_path / "report.json").read_text())
    md = (tmp_path / "report.md").read_text()
    assert rep["variant"]["requested"] == "workers" and rep["variant"]["used"] == "central"
    assert "needs per-message training accuracy" in md and "which these runs lack" in md
    assert "## Temporal efficiency against sgd (variant: central)" in md
    assert [g["temporal_efficiency"] for g in rep["groups"]] == [g["temporal_efficiency"] for g in central["groups"]]


def test_the_workers_variant_on_logged_training_accuracy(runs, tmp_path):
    """train_acc averaged in 5 s windows of wall time: windows [0,5), [5,10), [10,15) hold
    .2 | .4,.6 | .8 and .1 | .2,.3 | .4, at 2.5, 7.5, 12.5 s: areas 5.0 and 2.5, E = 2."""
    for name, accs in (("sgd", (0.1, 0.2, 0.3, 0.4)), ("asgd", (0.2, 0.4, 0.6, 0.8))):
        shutil.copytree(runs / "cmp0" / name, tmp_path / "in" / name)
        lines = [{"samples": 100 * k, "wall_s": 3.0 * k, "virtual_s": 1.0 * k, "loss": 1.0, "train_acc": a}
                 for k, a in enumerate(accs, 1)]
        (tmp_path / "in" / name / "messages.jsonl").write_text("".join(json.dumps(m) + "\n" for m in lines))
    write_report([tmp_path / "in"], tmp_path / "out", variant="workers")
    rep = json.loads((tmp_path / "out" / "report.json").read_text())
    assert rep["variant"]["used"] == "workers" and rep["variant"]["note"] == ""
    assert group(rep, "asgd workers=2")["temporal_efficiency"]["mean"] == pytest.approx(2.0)
    assert group(rep, "sgd workers=1")["temporal_efficiency"]["mean"] == 1.0
    assert "training accuracy averaged over windows of 5 s" in (tmp_path / "out" / "report.md").read_text()


def test_plots_that_the_data_cannot_make_are_skipped_with_a_reason(runs, tmp_path):
    path = write_report([runs / "w4"], tmp_path)        # one group: nothing varies
    md = path.read_text()
    rep = json.loads((tmp_path / "report.json").read_text())
    assert set(rep["skipped_plots"]) == {"heatmap", "workers"}
    assert not (tmp_path / "heatmap.png").exists() and not (tmp_path / "accuracy_vs_workers.png").exists()
    assert "- No heatmap.png: it needs two settings that vary, and none does." in md
    assert "- No accuracy_vs_workers.png: every run used the same number of workers." in md
    assert (tmp_path / "accuracy.png").stat().st_size > 0
    assert rep["baseline"]["algorithm"] == "asgd"     # no sgd: the first algorithm


def test_bad_input_is_one_line_and_exit_2(runs, tmp_path):
    (tmp_path / "empty").mkdir()
    broken = tmp_path / "broken"
    broken.mkdir()
    (broken / "summary.json").write_text("{}")
    cases = [
        ((tmp_path / "empty",), "no summary.json at any depth"),
        ((tmp_path / "missing",), "no such directory"),
        ((broken,), "not a finished stalegrad run (missing config.json)"),
        ((runs, "--baseline", "dcasgd-a"), "--baseline 'dcasgd-a': no run of that algorithm; the runs have sgd, asgd"),
        ((runs, "--heatmap", "workers,colour"), "'colour' does not vary"),
        ((runs, "--target", "1.5"), "--target must be an accuracy in (0, 1]"),
    ]
    for args, words in cases:
        res = invoke(*args, "--out", tmp_path / "out")
        assert res.exit_code == 2, (args, res.output)
        assert len(res.output.strip().splitlines()) == 1 and words in res.output, res.output
        assert not (tmp_path / "out").exists()     # nothing written


def test_heatmap_axes(made, runs, tmp_path):
    from stalegrad.study.report_plots import choose_heatmap_axes
    assert choose_heatmap_axes({"algo": [1, 2, 3], "workers": [1, 2], "window": [1, 4], "lr": [1, 2, 3]}, None)[0] \
        == ("workers", "window")
    axes = {"algo": ["a", "b"], "workers": [1, 2, 4], "lr": [0.1, 0.3]}
    assert choose_heatmap_axes(axes, None)[0] == ("workers", "lr")
    assert choose_heatmap_axes({"workers": [1, 2]}, None)[0] is None
    assert made[1]["heatmap"] == {"x": "workers", "y": "lr", "value": "temporal efficiency against sgd"}
    write_report([runs], tmp_path, heatmap="algo,workers")
    rep = json.loads((tmp_path / "report.json").read_text())
    assert rep["heatmap"]["x"] == "algo" and rep["heatmap"]["y"] == "workers"
    assert (tmp_path / "heatmap.png").stat().st_size > 5000


def test_diverged_and_repeated_runs_are_told(runs, tmp_path):
    shutil.copytree(runs / "w4" / "s0", tmp_path / "in" / "a")
    shutil.copytree(runs / "w4" / "s0", tmp_path / "in" / "b")       # the same seed twice
    shutil.copytree(runs / "w4" / "s1", tmp_path / "in" / "c")
    summary = json.loads((tmp_path / "in" / "c" / "summary.json").read_text())
    summary.update(diverged=True, final_test_loss=None, nonfinite_skipped=20)
    (tmp_path / "in" / "c" / "summary.json").write_text(json.dumps(summary))
    md = write_report([tmp_path / "in", tmp_path / "in" / "a"], tmp_path / "out").read_text()
    rep = json.loads((tmp_path / "out" / "report.json").read_text())
    (g,) = rep["groups"]
    assert g["seeds"] == [0, 1] and g["diverged"] == [str(tmp_path / "in" / "c")]
    assert g["nonfinite_skipped"]["mean"] == 10.0
    assert f"- Diverged runs: 1 of 2: {tmp_path / 'in' / 'c'}." in md
    assert row(md, "asgd", "## Staleness")[-1] == "1 of 2 |"
    assert f"left out {tmp_path / 'in' / 'b'}: a second run of seed 0" in md


def test_the_baseline_shares_the_algorithm_parameters_both_have(tmp_path):
    """agn window=40 is compared with aeasgd window=40, not with the first aeasgd group (window is an
    algorithm parameter of both); a parameter only one of them has (rho) does not count."""
    def fake(name, algo, window, acc, **params):
        d = tmp_path / name
        d.mkdir()
        (d / "config.json").write_text(json.dumps({"algorithm": {"name": algo, "window": window, **params},
                                                   "workers": 8, "seed": 0, "runtime": {"name": "sim"}}))
        (d / "metrics.jsonl").write_text(json.dumps({"virtual_s": 0.0, "wall_s": 0.0, "test_acc": 0.1, "samples": 0}) + "\n"
                                         + json.dumps({"virtual_s": 10.0, "wall_s": 1.0, "test_acc": acc, "samples": 1}) + "\n")
        (d / "summary.json").write_text(json.dumps({"final_test_acc": acc, "best_test_acc": acc}))
        (d / "staleness.json").write_text("{}")
    fake("ae10", "aeasgd", 10, 0.5, rho=5.0)
    fake("ae40", "aeasgd", 40, 0.9, rho=5.0)
    fake("agn10", "agn", 10, 0.7)
    fake("agn40", "agn", 40, 0.7)
    write_report([tmp_path], tmp_path / "out", baseline="aeasgd")
    rep = json.loads((tmp_path / "out" / "report.json").read_text())
    # areas: 0.5*(0.1+x)*10; agn 4.0 against aeasgd window 10: 3.0, window 40: 5.0
    assert group(rep, "agn window=10")["temporal_efficiency"]["mean"] == pytest.approx(4.0 / 3.0)
    assert group(rep, "agn window=40")["temporal_efficiency"]["mean"] == pytest.approx(4.0 / 5.0)


def _damage(src, dst, kind):
    """A copy of the run ``src`` in ``dst``, damaged in one way."""
    shutil.copytree(src, dst)
    if kind == "summary is a list":
        (dst / "summary.json").write_text("[1, 2]")
    elif kind == "summary is not UTF-8":
        (dst / "summary.json").write_bytes(b'\xff\xfe{"final_test_acc": 0.5}')
    elif kind == "summary is a directory":
        (dst / "summary.json").unlink()
        (dst / "summary.json").mkdir()
    elif kind == "metrics empty":
        (dst / "metrics.jsonl").write_text("")
    elif kind == "test_acc not a number":
        lines = [json.loads(ln) for ln in (dst / "metrics.jsonl").read_text().splitlines()]
        lines[1]["test_acc"] = "abc"
        (dst / "metrics.jsonl").write_text("".join(json.dumps(m) + "\n" for m in lines))
    elif kind == "metrics line a list":
        with open(dst / "metrics.jsonl", "a") as f:
            f.write("[1, 2]\n")
    elif kind == "message not a number":
        lines = (dst / "messages.jsonl").read_text().splitlines()
        lines[0] = json.dumps({**json.loads(lines[0]), "samples": "many"})
        (dst / "messages.jsonl").write_text("\n".join(lines) + "\n")
    elif kind == "probes line a list":
        (dst / "probes.jsonl").write_text("[1, 2]\n")


DAMAGE = {"summary is a list": "summary.json is a list, not a JSON object",
          "summary is not UTF-8": "summary.json is not UTF-8 text",
          "summary is a directory": "summary.json is a directory, not a file",
          "metrics empty": "metrics.jsonl holds no evaluation",
          "test_acc not a number": "metrics.jsonl line 2: test_acc is 'abc', not a number",
          "metrics line a list": "metrics.jsonl line 6 is a list, not a JSON object",
          "message not a number": "messages.jsonl line 1: samples is 'many', not a number",
          "probes line a list": "probes.jsonl line 1 is not a probe record"}


def test_damaged_runs_are_skipped_with_one_line_each_and_the_rest_reported(runs, tmp_path):
    base = tmp_path / "in"
    shutil.copytree(runs / "w4", base / "good")
    for i, kind in enumerate(DAMAGE):
        _damage(runs / "cmp0" / "asgd", base / "bad" / f"d{i}", kind)
    res = CliRunner().invoke(report, [str(base), "--out", str(tmp_path / "out")])
    assert res.exit_code == 0, res.output
    warnings = res.stderr.strip().splitlines()
    assert len(warnings) == len(DAMAGE), res.stderr
    for i, reason in enumerate(DAMAGE.values()):
        line = next(ln for ln in warnings if f"skipped {base / 'bad' / f'd{i}'}:" in ln)
        assert line.startswith("stalegrad: warning: ") and reason in line, line
    rep = json.loads((tmp_path / "out" / "report.json").read_text())
    assert rep["compared"]["runs"] == 3 and [g["seeds"] for g in rep["groups"]] == [[0, 1, 2]]
    assert {s["dir"] for s in rep["skipped_runs"]} == {str(base / "bad" / f"d{i}") for i in range(len(DAMAGE))}
    assert f"left out {base / 'bad' / 'd0'}: summary.json is a list" in (tmp_path / "out" / "report.md").read_text()


def test_no_usable_run_is_one_line_exit_2_and_nothing_written(runs, tmp_path):
    for i, kind in enumerate(DAMAGE):
        _damage(runs / "cmp0" / "asgd", tmp_path / "bad" / f"d{i}", kind)
    res = CliRunner().invoke(report, [str(tmp_path / "bad"), "--out", str(tmp_path / "out")])
    assert res.exit_code == 2
    assert len(res.output.strip().splitlines()) == 1, res.output
    assert "no usable run to report on" in res.output and f"and {len(DAMAGE) - 1} more damaged runs" in res.output
    assert not (tmp_path / "out").exists()
