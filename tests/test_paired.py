"""experiments/paired.py: two algorithms paired by seed, on run directories written by hand."""
import json

import pytest

from stalegrad.study.stats import t_interval

from helpers import experiment

paired = experiment("paired")


def fake_run(root, algo, seed, final, lr=0.001):
    d = root / f"{algo}-lr{lr}-s{seed}"
    d.mkdir(parents=True)
    (d / "config.json").write_text(json.dumps({"algorithm": {"name": algo}, "workers": 4, "lr": lr, "seed": seed,
                                               "runtime": {"name": "sim", "delay": "gamma:2"}}))
    (d / "metrics.jsonl").write_text(json.dumps({"virtual_s": 1.0, "test_acc": final, "samples": 1}) + "\n")
    (d / "summary.json").write_text(json.dumps({"final_test_acc": final, "diverged": False}))
    (d / "staleness.json").write_text("{}")


def test_the_difference_is_paired_by_seed(tmp_path, capsys):
    # seed 3 has only agn: left out of the pairing
    for s, (a, b) in enumerate([(0.94, 0.93), (0.938, 0.929), (0.937, 0.9295)], start=1):
        fake_run(tmp_path, "agn", s, a)
        fake_run(tmp_path, "aeasgd", s, b)
    fake_run(tmp_path, "agn", 4, 0.5)
    p = paired.paired(paired.load_runs([tmp_path]), "agn", "aeasgd")
    d = t_interval([0.94 - 0.93, 0.938 - 0.929, 0.937 - 0.9295])
    assert p["seeds"] == [1, 2, 3] and p["difference"]["lo"] == pytest.approx(d["lo"])
    assert p["agn"]["mean"] == pytest.approx((0.94 + 0.938 + 0.937) / 3) and p["verdict"] == "holds"
    paired.main([str(tmp_path), "agn", "aeasgd"])
    assert "agn − aeasgd +0.88 [" in capsys.readouterr().out


def test_a_grid_with_settings_to_select_is_refused(tmp_path):
    for lr in (0.001, 0.01):
        fake_run(tmp_path, "agn", 1, 0.9, lr=lr)
    fake_run(tmp_path, "aeasgd", 1, 0.9)
    with pytest.raises(SystemExit, match="two runs of agn with seed 1"):
        paired.paired(paired.load_runs([tmp_path]), "agn", "aeasgd")


def test_one_shared_seed_is_not_enough(tmp_path):
    fake_run(tmp_path, "agn", 1, 0.9)
    fake_run(tmp_path, "aeasgd", 1, 0.9)
    with pytest.raises(SystemExit, match="share 1 seed"):
        paired.paired(paired.load_runs([tmp_path]), "agn", "aeasgd")
