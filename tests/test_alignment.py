"""experiments/alignment.py: AGN RQ4 over seeds, on run directories with probes written by hand."""
import json

import pytest

from stalegrad.study.stats import t_interval

from helpers import experiment

alignment = experiment("alignment")


def fake_run(root, window, seed, probes, workers=8):
    """An agn run whose probes.jsonl holds ``probes``: (cos_eval, cos_prev) pairs."""
    d = root / f"agn-M{workers}-W{window}-s{seed}"
    d.mkdir(parents=True)
    (d / "config.json").write_text(json.dumps({"algorithm": {"name": "agn", "window": window}, "workers": workers,
                                               "lr": 0.001, "seed": seed, "probe_every": 3,
                                               "runtime": {"name": "sim", "delay": "gamma:2"}}))
    (d / "metrics.jsonl").write_text(json.dumps({"virtual_s": 1.0, "test_acc": 0.9, "samples": 1}) + "\n")
    (d / "summary.json").write_text(json.dumps({"final_test_acc": 0.9, "diverged": False}))
    (d / "staleness.json").write_text("{}")
    (d / "probes.jsonl").write_text("".join(json.dumps({"tau": 3, "cos_eval": e, "cos_prev": p, "update_norm": 0.1})
                                            + "\n" for e, p in probes))


def test_each_window_is_paired_with_single_steps_by_seed_over_per_run_means(tmp_path):
    single = {1: [(0.1, 0.3), (0.3, 0.5)], 2: [(0.2, 0.4)], 3: [(0.15, 0.35), (0.25, 0.45), (0.2, 0.4)]}
    window10 = {1: [(0.4, 0.2)], 2: [(0.3, 0.3), (0.5, 0.1)], 3: [(0.45, 0.25)]}
    for s in single:
        fake_run(tmp_path, 1, s, single[s])
        fake_run(tmp_path, 10, s, window10[s])
    fake_run(tmp_path, 10, 4, [(0.9, 0.9)])   # no window-1 run of seed 4: left out of the pairing
    cells = alignment.per_run(alignment.load_runs([tmp_path]))
    rows = {r["measure"]: r for r in alignment.compare(cells)}
    # per-run means by hand: window 1 cos_eval 0.2, 0.2, 0.2; window 10 0.4, 0.4, 0.45
    d = t_interval([0.4 - 0.2, 0.4 - 0.2, 0.45 - 0.2])
    assert rows["cos_eval"]["seeds"] == [1, 2, 3]
    assert rows["cos_eval"]["difference"]["mean"] == pytest.approx(d["mean"])
    assert rows["cos_eval"]["difference"]["lo"] == pytest.approx(d["lo"]) and rows["cos_eval"]["verdict"] == "holds"
    # cos_prev: window 1 0.4, 0.4, 0.4; window 10 0.2, 0.2, 0.25: single steps agree more
    assert rows["cos_prev"]["difference"]["mean"] == pytest.approx((-0.2 - 0.2 - 0.15) / 3)
    assert rows["cos_prev"]["verdict"] == "does not hold"


def test_the_page_and_its_refusals(tmp_path, capsys):
    out = tmp_path / "a.md"
    fake_run(tmp_path / "none", 1, 1, [])
    (tmp_path / "none" / "agn-M8-W1-s1" / "probes.jsonl").unlink()
    with pytest.raises(SystemExit, match="no run here wrote probes"):
        alignment.main([str(tmp_path / "none"), "--out", str(out)])
    for s in (1, 2):
        fake_run(tmp_path / "r", 1, s, [(0.1, 0.2)], workers=16)
    with pytest.raises(SystemExit, match="nothing to compare"):
        alignment.main([str(tmp_path / "r"), "--out", str(out)])
    for s in (1, 2):
        fake_run(tmp_path / "r", 40, s, [(0.1 + 0.1 * s, 0.2)], workers=16)
    alignment.main([str(tmp_path / "r"), "--out", str(out)])
    page = out.read_text()
    assert "| agn | 16 | 40 | the commit points more towards the minimum than a single step | +0.150 [" in page
    assert "0 of 2 comparisons hold" in page and capsys.readouterr().out == f"alignment.py: {out}\n"
