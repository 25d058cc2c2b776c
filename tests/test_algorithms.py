"""Each rule against values computed by hand (or by an independent formula)."""
import math

import pytest
import torch

from stalegrad.algorithms import make_algorithm
from stalegrad.algorithms import local_opt
from stalegrad.server import NonFiniteError, ParameterServer


def t(*xs):
    return torch.tensor(xs, dtype=torch.float32)


def quadratic_grad_fn(target):
    """loss = 0.5*||w - target||^2, so g = w - target."""
    def grad_fn(w):
        g = w - target
        return 0.5 * float((g * g).sum()), g
    return grad_fn


# ---------------------------------------------------------------- gradient rules
@pytest.mark.parametrize("name", ["sgd", "asgd"])
def test_plain_sgd_step(name):
    server = ParameterServer(make_algorithm(name), t(1.0, -2.0), 1)
    server.pull(0)
    server.push(0, t(0.5, 4.0), lr=0.1)
    assert torch.allclose(server.w, t(1.0 - 0.05, -2.0 - 0.4))
    assert server.version == 1


def test_asgd_applies_stale_gradient_as_is():
    server = ParameterServer(make_algorithm("asgd"), t(0.0), 2)
    server.pull(0), server.pull(1)
    server.push(1, t(1.0), lr=1.0)   # tau 0
    server.push(0, t(2.0), lr=1.0)   # tau 1, no correction
    assert torch.allclose(server.w, t(-3.0))
    assert list(server.staleness.taus) == [0, 1]


def test_gradient_worker_sends_gradient_at_pulled_weights():
    algo = make_algorithm("asgd")
    loss, g = algo.worker_compute({}, t(3.0, 1.0), quadratic_grad_fn(t(1.0, 1.0)), lr=0.1)
    assert torch.equal(algo.worker_finish({}, None, g), t(2.0, 0.0))
    assert loss == pytest.approx(2.0)


def test_ssgd_waits_for_every_worker_and_averages():
    server = ParameterServer(make_algorithm("ssgd"), t(0.0, 0.0), 2)
    server.pull(0), server.pull(1)
    assert not server.push(0, t(1.0, 2.0), lr=0.1)
    assert server.version == 0 and torch.equal(server.w, t(0.0, 0.0))
    assert server.push(1, t(3.0, -2.0), lr=0.1)
    assert torch.allclose(server.w, t(-0.2, 0.0))
    assert server.version == 1
    assert list(server.staleness.taus) == [0, 0]


def test_momentum_and_weight_decay_match_torch_sgd():
    algo = make_algorithm("asgd", momentum=0.9, weight_decay=0.01)
    w0 = t(1.0, -1.0, 0.5)
    server = ParameterServer(algo, w0, 1)
    ref = w0.clone().requires_grad_(True)
    opt = torch.optim.SGD([ref], lr=0.1, momentum=0.9, weight_decay=0.01)
    for g in (t(0.3, -0.2, 1.0), t(-1.0, 0.5, 0.1), t(0.2, 0.2, -0.4)):
        server.pull(0)
        server.push(0, g, lr=0.1)
        ref.grad = g.clone()
        opt.step()
    assert torch.allclose(server.w, ref.detach(), atol=1e-6)


# ---------------------------------------------------------------- DC-ASGD
def test_dcasgd_c_uses_the_pushing_workers_own_snapshot():
    lam, lr = 0.04, 0.1
    server = ParameterServer(make_algorithm("dcasgd-c", lam=lam), t(1.0, 2.0), 2)
    server.pull(0), server.pull(1)                  # both snapshot [1, 2]
    server.push(1, t(1.0, -1.0), lr)                # tau 0: w - w_bak[1] = 0, plain step
    assert torch.allclose(server.w, t(0.9, 2.1))
    server.push(0, t(2.0, 1.0), lr)                 # tau 1: w - w_bak[0] = [-0.1, 0.1]
    # by hand: term = 0.04 * g*g * (w - w_bak[0]) = [0.04*4*-0.1, 0.04*1*0.1] = [-0.016, 0.004]
    expected = t(0.9 - 0.1 * (2.0 - 0.016), 2.1 - 0.1 * (1.0 + 0.004))
    assert torch.allclose(server.w, expected, atol=1e-7)
    # A port with one shared "previous weight" (the weights before the last
    # update, [0.9, 2.1]) would have found w - prev = 0 and taken a plain step.
    plain = t(0.9 - 0.2, 2.1 - 0.1)
    assert not torch.allclose(server.w, plain, atol=1e-5)


def test_dcasgd_snapshot_is_taken_at_pull_time_not_after_push():
    server = ParameterServer(make_algorithm("dcasgd-c", lam=1.0), t(0.0), 2)
    server.pull(0)
    server.pull(1)
    server.push(1, t(1.0), lr=1.0)      # w = -1
    server.pull(1)                      # worker 1 snapshots -1
    server.push(0, t(1.0), lr=1.0)      # worker 0's snapshot is still 0
    # w = -1 - (1 + 1*1*1*(-1 - 0)) = -1 - 0 = -1
    assert torch.allclose(server.w, t(-1.0))
    assert torch.equal(server.state["w_bak"][1], t(-1.0))
    assert torch.equal(server.state["w_bak"][0], t(0.0))


@pytest.mark.parametrize("name", ["dcasgd-c", "dcasgd-a"])
def test_dc_term_is_zero_iff_tau_is_zero(name):
    torch.manual_seed(0)
    g = torch.randn(50)
    algo = make_algorithm(name)
    # tau = 0: exactly the asgd step.
    dc = ParameterServer(algo, torch.randn(50), 1)
    plain = ParameterServer(make_algorithm("asgd"), dc.w.clone(), 1)
    for s in (dc, plain):
        s.pull(0)
        s.push(0, g, lr=0.1)
    assert torch.equal(dc.w, plain.w)
    # tau > 0: the term is non-zero wherever g != 0 and the weights moved.
    dc = ParameterServer(algo, torch.randn(50), 2)
    plain = ParameterServer(make_algorithm("asgd"), dc.w.clone(), 2)
    for s in (dc, plain):
        s.pull(0), s.pull(1)
        s.push(1, torch.ones(50), lr=0.1)
        s.push(0, g, lr=0.1)
        assert list(s.staleness.taus) == [0, 1]
    assert (dc.w != plain.w).all()


def test_dcasgd_a_by_independent_formula():
    lam0, mom, eps, lr = 2.0, 0.95, 1e-7, 0.1
    server = ParameterServer(make_algorithm("dcasgd-a"), t(1.0, 2.0), 2)
    server.pull(0), server.pull(1)
    server.push(1, t(1.0, -1.0), lr)
    server.push(0, t(2.0, 1.0), lr)
    w_before = [0.9, 2.1]
    expected = []
    for i, (g, w, bak) in enumerate(zip([2.0, 1.0], w_before, [1.0, 2.0])):
        ms = (1 - mom) * g * g                       # first push of worker 0: ms started at 0
        lam = lam0 / math.sqrt(ms + eps)
        expected.append(w - lr * (g + lam * g * g * (w - bak)))
    assert torch.allclose(server.w, torch.tensor(expected), atol=1e-6)


def test_dcasgd_a_keeps_one_mean_square_per_worker():
    server = ParameterServer(make_algorithm("dcasgd-a", ms_momentum=0.5), t(0.0, 0.0), 3)
    for m in range(3):
        server.pull(m)
    server.push(0, t(2.0, 4.0), lr=0.01)
    server.pull(0)
    server.push(0, t(2.0, 0.0), lr=0.01)
    server.push(1, t(1.0, 1.0), lr=0.01)
    ms = server.state["mean_square"]
    assert torch.allclose(ms[0], t(0.5 * (0.5 * 4) + 0.5 * 4, 0.5 * (0.5 * 16) + 0.0))
    assert torch.allclose(ms[1], t(0.5, 0.5))
    assert torch.equal(ms[2], t(0.0, 0.0))       # never pushed: untouched


def test_dcasgd_validation():
    with pytest.raises(ValueError, match="ms_momentum"):
        make_algorithm("dcasgd-a", ms_momentum=1.5)
    with pytest.raises(ValueError, match="lam"):
        make_algorithm("dcasgd-c", lam=-1)
    with pytest.raises(ValueError, match="lam0 is not a parameter of dcasgd-c"):
        make_algorithm("dcasgd-c", lam0=2)


# ---------------------------------------------------------------- commit rules
def test_agn_divides_by_window_and_downpour_does_not():
    grad_fn = quadratic_grad_fn(t(0.0))
    commits = {}
    for name in ("agn", "downpour", "dynsgd"):
        algo = make_algorithm(name, window=2, local_opt="sgd")
        state = algo.worker_init(t(2.0), 1)
        loss, commit = algo.worker_compute(state, t(2.0), grad_fn, lr=0.5)
        commits[name] = algo.worker_finish(state, t(2.0), commit)
        assert loss == pytest.approx((0.5 * 4 + 0.5 * 1) / 2)   # losses at w=2 and w=1
    # by hand: w 2 -> 1 -> 0.5, so the change is -1.5
    assert torch.allclose(commits["downpour"], t(-1.5))
    assert torch.allclose(commits["dynsgd"], t(-1.5))
    assert torch.allclose(commits["agn"], t(-0.75))


def test_commit_server_adds_without_learning_rate():
    for name in ("agn", "downpour"):
        server = ParameterServer(make_algorithm(name), t(1.0), 2)
        server.pull(0), server.pull(1)
        server.push(1, t(0.5), lr=123.0)
        server.push(0, t(-2.0), lr=123.0)
        assert torch.allclose(server.w, t(-0.5))


def test_dynsgd_scales_by_one_over_tau_plus_one():
    server = ParameterServer(make_algorithm("dynsgd"), t(0.0), 3)
    for m in range(3):
        server.pull(m)
    server.push(0, t(6.0), lr=1.0)   # tau 0: +6
    server.push(1, t(6.0), lr=1.0)   # tau 1: +3
    server.push(2, t(6.0), lr=1.0)   # tau 2: +2
    assert torch.allclose(server.w, t(11.0))
    assert list(server.staleness.taus) == [0, 1, 2]


def test_local_adam_matches_torch_adam():
    torch.manual_seed(1)
    w = torch.randn(20)
    ref = w.clone().requires_grad_(True)
    opt = torch.optim.Adam([ref], lr=0.01, weight_decay=0.001)
    state = local_opt.init("adam", w)
    for _ in range(5):
        g = torch.randn(20)
        local_opt.step("adam", state, w, g, 0.01, weight_decay=0.001)
        ref.grad = g.clone()
        opt.step()
    assert torch.allclose(w, ref.detach(), atol=1e-6)


def test_local_sgd_momentum_matches_torch_sgd():
    torch.manual_seed(2)
    w = torch.randn(8)
    ref = w.clone().requires_grad_(True)
    opt = torch.optim.SGD([ref], lr=0.05, momentum=0.8)
    state = local_opt.init("sgd", w, momentum=0.8)
    for _ in range(4):
        g = torch.randn(8)
        local_opt.step("sgd", state, w, g, 0.05, momentum=0.8)
        ref.grad = g.clone()
        opt.step()
    assert torch.allclose(w, ref.detach(), atol=1e-6)


def test_local_optimizer_state_survives_pulls():
    algo = make_algorithm("agn", window=1, local_opt="adam")
    state = algo.worker_init(t(0.0), 1)
    grad_fn = quadratic_grad_fn(t(1.0))
    algo.worker_compute(state, t(0.0), grad_fn, lr=0.1)
    algo.worker_compute(state, t(0.0), grad_fn, lr=0.1)
    assert state["opt"]["step"] == 2


# ---------------------------------------------------------------- elastic averaging
def test_easgd_synchronous_round_by_hand():
    algo = make_algorithm("easgd", window=1, local_opt="sgd", beta=0.9)   # alpha = 0.45 for M = 2
    server = ParameterServer(algo, t(0.0), 2)
    states = [algo.worker_init(t(0.0), 2) for _ in range(2)]
    states[0]["weights"].fill_(1.0)
    states[1]["weights"].fill_(3.0)
    msgs = []
    for m in range(2):
        centre = server.pull(m)
        msgs.append(algo.worker_finish(states[m], centre, None))
    assert torch.allclose(states[0]["weights"], t(0.55)) and torch.allclose(states[1]["weights"], t(1.65))
    server.push(0, msgs[0], lr=0.1)
    assert torch.equal(server.w, t(0.0))                 # waits for the round
    server.push(1, msgs[1], lr=0.1)
    assert torch.allclose(server.w, t(0.45 + 1.35))


def test_aeasgd_worker_keeps_its_weights_and_commits_elastic_difference():
    algo = make_algorithm("aeasgd", window=2, local_opt="sgd")   # alpha = 5 * 0.01
    server = ParameterServer(algo, t(0.0), 1)
    state = algo.worker_init(t(0.0), 1)
    loss, computed = algo.worker_compute(state, None, quadratic_grad_fn(t(4.0)), lr=0.5)
    assert torch.allclose(state["weights"], t(3.0))       # 0 -> 2 -> 3
    centre = server.pull(0)
    e = algo.worker_finish(state, centre, computed)
    assert torch.allclose(e, t(0.05 * 3.0))
    assert torch.allclose(state["weights"], t(3.0 - 0.15))  # elastic pull, not overwritten
    server.push(0, e, lr=0.5)
    assert torch.allclose(server.w, t(0.15))


def test_aeasgd_alpha_validation():
    with pytest.raises(ValueError, match="alpha"):
        make_algorithm("aeasgd", rho=50.0, elastic_lr=0.1)


# ---------------------------------------------------------------- non-finite
def test_nonfinite_gradient_is_skipped_and_counted():
    server = ParameterServer(make_algorithm("asgd"), t(1.0, 1.0), 1)
    server.pull(0)
    assert not server.push(0, t(float("nan"), 1.0), lr=0.1)
    assert not server.push(0, t(float("inf"), 1.0), lr=0.1)
    assert torch.equal(server.w, t(1.0, 1.0))
    assert server.nonfinite_skipped == 2 and server.version == 0


def test_finite_gradient_whose_dc_update_overflows_is_skipped():
    server = ParameterServer(make_algorithm("dcasgd-c", lam=1.0), t(0.0), 2)
    server.pull(0), server.pull(1)
    server.push(1, t(-1e30), lr=1.0)          # w = 1e30
    server.push(0, t(1e30), lr=1.0)           # g*g overflows to inf
    assert torch.isfinite(server.w).all()
    assert server.nonfinite_skipped == 1


def test_nonfinite_stop_raises():
    server = ParameterServer(make_algorithm("agn"), t(1.0), 1, on_nonfinite="stop")
    server.pull(0)
    with pytest.raises(NonFiniteError, match="NaN or Inf"):
        server.push(0, t(float("nan")), lr=0.1)


def test_nonfinite_in_a_synchronous_round_drops_only_that_worker():
    server = ParameterServer(make_algorithm("ssgd"), t(0.0), 2)
    server.pull(0), server.pull(1)
    server.push(0, t(float("nan")), lr=1.0)
    server.push(1, t(2.0), lr=1.0)
    assert torch.allclose(server.w, t(-2.0))
    assert server.nonfinite_skipped == 1


def test_unknown_algorithm_lists_choices():
    with pytest.raises(ValueError, match="algorithm must be one of sgd, ssgd, asgd, .*got 'foo'"):
        make_algorithm("foo")
