"""experiments/papers.py: the papers' claims computed from run directories, checked by hand."""
import importlib.util
import json
from pathlib import Path

import pytest

spec = importlib.util.spec_from_file_location("papers", Path(__file__).parent.parent / "experiments" / "papers.py")
papers = importlib.util.module_from_spec(spec)
spec.loader.exec_module(papers)


def fake_run(root, name, algo, workers, seed, final, *, lr=0.1, delay="round-robin", window=None, curve=None,
             train_curve=None):
    d = root / name
    d.mkdir(parents=True)
    algorithm = {"name": algo, **({"window": window} if window is not None else {})}
    (d / "config.json").write_text(json.dumps({"algorithm": algorithm, "workers": workers, "lr": lr, "seed": seed,
                                               "runtime": {"name": "sim", "delay": delay}}))
    curve = curve or [(0.0, 0.1), (10.0, final)]
    (d / "metrics.jsonl").write_text("".join(json.dumps({"virtual_s": t, "test_acc": a, "samples": i})
                                             + "\n" for i, (t, a) in enumerate(curve)))
    msgs = [{"samples": 100 * (i + 1), "wall_s": t, "virtual_s": t, "loss": 1.0, "train_acc": a}
            for i, (t, a) in enumerate(train_curve or [])]
    (d / "messages.jsonl").write_text("".join(json.dumps(m) + "\n" for m in msgs))
    (d / "summary.json").write_text(json.dumps({"final_test_acc": final, "diverged": False}))
    (d / "staleness.json").write_text("{}")


def test_gap_closure_and_the_learning_rate_rules(tmp_path):
    # sgd: 0.90 (lr 0.1) beats 0.80 (lr 0.03); asgd: lr 0.03 is its best; dcasgd-a: lr 0.1 is its best
    for s, (sgd, asgd_hi, asgd_lo, dc_hi, dc_lo) in enumerate([(0.90, 0.60, 0.70, 0.80, 0.75),
                                                              (0.92, 0.62, 0.72, 0.86, 0.70)]):
        fake_run(tmp_path, f"sgd-a{s}", "sgd", 1, s, sgd)
        fake_run(tmp_path, f"sgd-b{s}", "sgd", 1, s, 0.80, lr=0.03)
        fake_run(tmp_path, f"asgd-a{s}", "asgd", 8, s, asgd_hi)
        fake_run(tmp_path, f"asgd-b{s}", "asgd", 8, s, asgd_lo, lr=0.03)
        fake_run(tmp_path, f"dc-a{s}", "dcasgd-a", 8, s, dc_hi)
        fake_run(tmp_path, f"dc-b{s}", "dcasgd-a", 8, s, dc_lo, lr=0.03)
    result, text = papers.dcasgd(papers.load_runs([tmp_path]))
    rows = {r["rule"]: r for r in result["rows"]}
    tuned, sgds = rows["tuned"], rows["sgd's"]
    assert tuned["lr"] == {"sgd": 0.1, "asgd": 0.03, "dcasgd-a": 0.1}
    assert sgds["lr"] == {"sgd": 0.1, "asgd": 0.1, "dcasgd-a": 0.1}
    # tuned, per seed: (0.80-0.70)/(0.90-0.70) = 0.5 and (0.86-0.72)/(0.92-0.72) = 0.7
    assert tuned["closure"]["dcasgd-a"][0] == pytest.approx(0.6)
    assert tuned["closure"]["dcasgd-a"][1] == pytest.approx(0.1414213562, rel=1e-6)
    # sgd's rate: (0.80-0.60)/(0.90-0.60) = 2/3 and (0.86-0.62)/(0.92-0.62) = 0.8
    assert sgds["closure"]["dcasgd-a"][0] == pytest.approx((2 / 3 + 0.8) / 2)
    assert "| 8 | 0.9100 ± 0.0141 (0.1) | - | 0.7100 ± 0.0141 (0.03) |" in text


def test_agn_temporal_efficiency_and_the_share_of_cells(tmp_path):
    # area to 10 s: agn 0.5*(0.1+0.9)*10 = 5.0, aeasgd 0.5*(0.1+0.7)*10 = 4.0 -> TE 1.25 in cell (8, 10);
    # in cell (8, 40) aeasgd's curve is the higher: TE 4/5 = 0.8
    for s in (0, 1):
        fake_run(tmp_path, f"agn10-{s}", "agn", 8, s, 0.9, window=10, train_curve=[(2.0, 0.5), (7.0, 0.9)])
        fake_run(tmp_path, f"ae10-{s}", "aeasgd", 8, s, 0.7, window=10, train_curve=[(2.0, 0.5), (7.0, 0.7)])
        fake_run(tmp_path, f"agn40-{s}", "agn", 8, s, 0.7, window=40)
        fake_run(tmp_path, f"ae40-{s}", "aeasgd", 8, s, 0.9, window=40)
    result, text = papers.agn(papers.load_runs([tmp_path]))
    te = {(r["workers"], r["window"]): r["te"] for r in result["rows"]}
    assert te[(8, 10)]["central"][0] == pytest.approx(1.25)
    assert te[(8, 40)]["central"][0] == pytest.approx(0.8)
    # workers variant, 5 s windows: [0,5) holds 0.5 for both, [5,10) 0.9 against 0.7, at 2.5 and 7.5 s:
    # areas to 7.5 s: 0.5*(0.5+0.9)*5 = 3.5 and 0.5*(0.5+0.7)*5 = 3.0
    assert te[(8, 10)]["workers"][0] == pytest.approx(3.5 / 3.0)
    assert result["te_above_1"]["central"] == (1, 2)
    assert "central: 1 of 2" in text
