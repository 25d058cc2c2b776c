"""The simulator's probes (--probe-every): the math by hand, and probing never changes training."""
import json
import math
from types import SimpleNamespace

import pytest
import torch
from torch import nn

import stalegrad as sg
from stalegrad.core import probes as pm
from stalegrad.errors import ConfigError
from stalegrad.models import build_model
from stalegrad.core.prober import Prober, piecewise_linear
from stalegrad.core.worker import BatchStream


@pytest.fixture(scope="module")
def digits():
    return sg.load_pair("digits")


# ---- the pure functions, against hand computations ----------------------------------------
def test_quadratic_first_order_prediction_is_exact_and_the_gg_error_is_the_hand_computed_one():
    # loss = 1/2 sum h_i w_i^2: g(w) = h*w, Hessian diag(h). Pulled w_bak = (1, 2), server w = (0.5, 1).
    h = torch.tensor([2.0, 1.0])
    w_bak, w = torch.tensor([1.0, 2.0]), torch.tensor([0.5, 1.0])
    g, g_now = h * w_bak, h * w                        # (2, 2) stale, (1, 1) fresh
    assert pm.rel_error(pm.taylor(g, h, w, w_bak), g_now) == 0.0
    # g*g = (4, 4), lam = 0.25: lam*g*g = (1, 1); w - w_bak = (-0.5, -1); g_dc = (1.5, 1)
    dc = pm.dc_constant(g, w, w_bak, 0.25)
    assert dc.tolist() == [1.5, 1.0]
    assert pm.rel_error(dc, g_now) == pytest.approx(0.5 / math.sqrt(2))
    assert pm.cosine(dc, g_now) == pytest.approx(2.5 / math.sqrt(3.25 * 2))
    assert pm.rel_error(g, g_now) == pytest.approx(math.sqrt(2) / math.sqrt(2))   # |(1, 1)| / |(1, 1)|
    # the least-squares lambda of h ~ lam * g*g: <h, gg>/<gg, gg> = (8 + 4) / 32
    assert pm.best_scale(h, g * g) == pytest.approx(12 / 32)


def test_adaptive_correction_by_hand():
    g, w, w_bak = torch.tensor([2.0]), torch.tensor([1.0]), torch.tensor([3.0])
    ms = pm.mean_square(torch.tensor([4.0]), g, 0.5)           # 0.5*4 + 0.5*4 = 4
    assert ms.item() == 4.0
    # g + lam0/sqrt(4 + 0) * g*g*(w - w_bak) = 2 + 1/2 * 4 * (-2) = -2
    assert pm.dc_adaptive(g, w, w_bak, ms, 1.0, 0.0).item() == -2.0


def test_cosine_of_a_commit_with_itself_is_one_and_degenerate_cases():
    u = torch.randn(10_000, generator=torch.Generator().manual_seed(0))
    assert pm.cosine(u, u) == pytest.approx(1.0, abs=1e-14)
    assert pm.cosine(u, -u) == pytest.approx(-1.0, abs=1e-14)
    assert math.isnan(pm.cosine(u, torch.zeros_like(u)))
    assert pm.rel_error(torch.zeros(3), torch.zeros(3)) == 0.0
    assert pm.pearson(torch.tensor([1.0, 2.0, 3.0]), torch.tensor([2.0, 4.0, 6.0])) == pytest.approx(1.0)


def test_ggn_diagonal_by_hand_and_hutchinson_on_a_diagonal_matrix():
    # one sample, two classes, one weight: J = (1, 2), p = (0.5, 0.5): 0.5*1 + 0.5*4 - (0.5 + 1)^2 = 0.25
    J, p = torch.tensor([[[1.0], [2.0]]]), torch.tensor([[0.5, 0.5]])
    assert pm.softmax_ggn_diagonal(J, p).tolist() == [0.25]
    # Hutchinson on a diagonal matrix is exact: z * (D z) = D z*z = D for Rademacher z
    d = torch.tensor([3.0, -1.0, 0.5])
    est = pm.hutchinson_diagonal(lambda z: d * z, 3, 4, torch.Generator().manual_seed(1), d)
    assert est.tolist() == d.tolist()


# ---- the Hessian diagonal of real models, against torch.func.hessian -----------------------
@pytest.mark.parametrize("build", [
    lambda: nn.Sequential(nn.Flatten(), nn.Linear(6, 5), nn.ReLU(), nn.Linear(5, 3)),
    lambda: nn.Sequential(nn.Conv2d(1, 2, 2), nn.ReLU(), nn.MaxPool2d(2), nn.Flatten(), nn.Linear(8, 3)),
], ids=["mlp", "cnn"])
def test_exact_hessian_diagonal_equals_torch_func_hessian(build):
    torch.manual_seed(0)
    module = build()
    assert piecewise_linear(module)
    x = torch.randn(7, 1, 2, 3) if isinstance(module[0], nn.Flatten) else torch.randn(7, 1, 5, 5)
    y = torch.randint(0, 3, (7,))
    prober = Prober(1, sg.ASGD(), module, x, y, 0, 2)
    assert prober.hessian == "exact"
    w = torch.cat([p.detach().reshape(-1) for p in module.parameters()])
    full = torch.func.hessian(lambda v: prober._loss(v, x, y))(w)
    torch.testing.assert_close(prober.hessian_diagonal(w, x, y), full.diagonal(), rtol=1e-4, atol=1e-6)
    v = torch.randn(w.numel())
    torch.testing.assert_close(prober.hessian_vector(w, x, y, v), full @ v, rtol=1e-4, atol=1e-5)
    assert not piecewise_linear(nn.Sequential(nn.Linear(2, 2), nn.Tanh()))
    assert not piecewise_linear(nn.Sequential(nn.Linear(2, 2), nn.BatchNorm1d(2)))


def test_report_bins_take_errors_that_overflowed():
    from stalegrad.study.report_probes import compensation_bins
    base = {"tau": 2, "drift": 1.0, "err_g": 1.0, "cos_g": 0.5, "err_dc_c": 0.5, "cos_dc_c": 0.9}
    rows = compensation_bins([base, {**base, "err_dc_c": None, "cos_dc_c": None}, {**base, "err_g": None}])
    assert rows[0]["n"] == 3 and rows[0]["better_dc_c"] == pytest.approx(2 / 3)
    assert rows[0]["err_dc_c"] == 0.5 and rows[0]["err_g"] == 1.0   # medians of the finite values


def test_batch_stream_last_is_what_next_returned_across_passes():
    s = BatchStream(10, 0, 1, 4, seed=3)
    for _ in range(7):                    # 10 samples, batches of 4: crosses several passes
        got = s.next().clone()
        assert torch.equal(s.last(), got)


# ---- runs: probing never changes training -----------------------------------------------
@pytest.mark.parametrize("algo, options", [
    ("asgd", {}), ("dcasgd-a", {}), ("dcasgd-c", {"delay": "gamma:2"}), ("agn", {"window": 3}),
    ("dynsgd", {"window": 2}), ("asgd", {"vectorised": True}),
])
def test_probed_run_has_the_unprobed_weights(digits, algo, options):
    train, test = digits
    delay = options.pop("delay", "round-robin")
    vec = options.pop("vectorised", False)
    algorithm = sg.make_algorithm(algo, **options)
    runs = [sg.train("mlp", train, test, algorithm, workers=3, epochs=0.3, batch_size=32, seed=4,
                     runtime=sg.Simulator(delay=delay, vectorised=vec), probe_every=k) for k in (0, 4)]
    assert runs[0].summary["weights_sha256"] == runs[1].summary["weights_sha256"]
    assert [m["test_loss"] for m in runs[0].metrics] == [m["test_loss"] for m in runs[1].metrics]
    probes = runs[1].probes
    assert runs[0].probes is None and probes
    assert all(p["update"] % 4 == 0 for p in probes)
    assert all(-1 <= p["cos_eval"] <= 1 and p["update_norm"] > 0 for p in probes)
    if algo in ("asgd", "dcasgd-a", "dcasgd-c"):
        assert all({"err_g", "cos_dc_c", "err_dc_a", "err_taylor", "err_full_h", "corr_h_gg"} <= p.keys() for p in probes)
        assert any(p["tau"] > 0 and p["err_g"] > 0 for p in probes)


def test_at_tau_zero_the_stale_and_fresh_gradients_are_identical(digits):
    train, test = digits
    res = sg.train("logreg", train, test, "sgd", workers=1, epochs=0.2, batch_size=32, seed=1, probe_every=2)
    assert len(res.probes) > 3
    for p in res.probes:
        assert p["tau"] == 0 and p["drift"] == 0.0
        for name in ("g", "dc_c", "dc_a", "taylor", "full_h"):
            assert p[f"err_{name}"] == 0.0 and p[f"cos_{name}"] == pytest.approx(1.0, abs=1e-12)


def test_alignment_with_the_previous_commit_of_another_worker(digits):
    train, _ = digits
    prober = Prober(1, sg.AGN(), build_model("logreg", (1, 8, 8), 10), train.x, train.y, 0, 2)
    u = torch.randn(prober.numel)
    server = SimpleNamespace(version=0, pulled_version=[0, 0], w=torch.zeros(prober.numel))
    prober.observe(0, None, torch.zeros(prober.numel), u, server, 0.1)
    prober.observe(0, None, torch.zeros(prober.numel), 2 * u, server, 0.1)   # same worker: not "another"
    prober.observe(1, None, torch.zeros(prober.numel), u, server, 0.1)
    assert prober.records[0]["cos_prev"] is None and prober.records[1]["cos_prev"] is None
    assert prober.records[2]["cos_prev"] == pytest.approx(1.0, abs=1e-12)
    assert prober.records[2]["update_norm"] == pytest.approx(float(u.norm()), rel=1e-6)


def test_probes_are_refused_where_they_cannot_measure(digits):
    train, test = digits
    for kwargs, words in [({"algorithm": "ssgd"}, "not ssgd"), ({"algorithm": "aeasgd"}, "not aeasgd"),
                          ({"probe_every": -2}, "non-negative"), ({"checkpoint_every": 5}, "checkpoint")]:
        options = {"algorithm": "asgd", "probe_every": 3, **kwargs}
        with pytest.raises(ConfigError, match=words):
            sg.RunConfig(**options).validate()

    class Elsewhere(sg.Simulator):
        supports_probes = False
    with pytest.raises(ConfigError, match="needs the simulator"):
        sg.train("logreg", train, test, "asgd", workers=2, runtime=Elsewhere(), probe_every=3)


def test_cli_writes_probes_jsonl_and_refuses_other_runtimes(tmp_path, capsys):
    from stalegrad.cli import main
    out = tmp_path / "run"
    code = main(["train", "--algo", "dcasgd-a", "--workers", "2", "--model", "logreg", "--epochs", "0.2",
                 "--batch-size", "32", "--probe-every", "3", "--out", str(out), "-q"])
    assert code == 0, capsys.readouterr().err
    lines = [json.loads(x) for x in (out / "probes.jsonl").read_text().splitlines()]
    assert lines and all(x["update"] % 3 == 0 for x in lines)
    assert json.loads((out / "config.json").read_text())["probe_every"] == 3
    from stalegrad.study.report import write_report
    from stalegrad.study.report_probes import compensation_bins, tau_bin
    md = write_report([out], tmp_path / "report").read_text()
    assert "## Probes" in md and "DC-ASGD-a" in md and "cos towards minimum" in md
    section = json.loads((tmp_path / "report" / "report.json").read_text())["probes"]
    assert section["compensation"][0]["bins"] == json.loads(json.dumps(compensation_bins(lines)))
    assert section["alignment"][0]["n"] == len(lines)
    assert [tau_bin(t) for t in (0, 1, 2, 3, 4, 7, 8, 15)] == [(0, 0), (1, 1), (2, 3), (2, 3), (4, 7), (4, 7),
                                                                (8, 15), (8, 15)]
    capsys.readouterr()
    code = main(["train", "--runtime", "local", "--probe-every", "3", "--out", str(tmp_path / "l")])
    err = capsys.readouterr().err
    assert code == 2 and err.count("\n") == 1 and "--probe-every applies to runtime sim" in err
    assert not (tmp_path / "l").exists()


def test_batchnorm_and_dropout_models_are_probed_without_changing_training(digits):
    # BatchNorm's running statistics and dropout's draws are restored around each probe; not piecewise
    # linear, so the Hessian diagonal is Hutchinson's estimate
    train, test = digits

    def model():
        torch.manual_seed(5)
        return nn.Sequential(nn.Flatten(), nn.Linear(64, 16), nn.BatchNorm1d(16), nn.ReLU(), nn.Dropout(0.2),
                             nn.Linear(16, 10))
    runs = [sg.train(model, train, test, "dcasgd-a", workers=2, epochs=0.2, batch_size=32, seed=2, probe_every=k)
            for k in (0, 3)]
    assert runs[0].summary["weights_sha256"] == runs[1].summary["weights_sha256"]
    assert [m["test_loss"] for m in runs[0].metrics] == [m["test_loss"] for m in runs[1].metrics]
    assert runs[1].config["probes"]["hessian"] == "hutchinson"
    assert all(math.isfinite(p["corr_h_gg"]) for p in runs[1].probes)
