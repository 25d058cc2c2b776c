"""Each rule against values computed by hand (or by an independent formula)."""
import importlib.util
import io
import math

import pytest
import torch

from stalegrad.algorithms import make_algorithm
from stalegrad.algorithms import local_opt
from stalegrad.core.server import NonFiniteError, ParameterServer


# Both server paths: the rules' torch operators, and their fused kernels where numba is installed
KERNELS = ["torch", pytest.param("numba", marks=pytest.mark.skipif(
    importlib.util.find_spec("numba") is None, reason="the fused kernels need numba"))]


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
    assert torch.equal(server.state.w_bak[1], t(-1.0))
    assert torch.equal(server.state.w_bak[0], t(0.0))


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
    ms = server.state.mean_square
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


# ---------------------------------------------------------------- rules after 2017
@pytest.mark.parametrize("kernels", KERNELS)
def test_sasgd_divides_the_learning_rate_by_the_staleness_as_the_paper_counts_it(kernels):
    # Zhang et al.: tau = i - j, alpha0/tau, and a gradient of staleness 0 (hardsync) keeps alpha0
    for params, expected in (({}, -6.0 - 6.0 - 3.0), ({"staleness_offset": 1}, -6.0 - 3.0 - 2.0)):
        for momentum in (0.0, 0.5):   # with momentum: the fused kernel (its scale), 0 before the pushes
            server = ParameterServer(make_algorithm("sasgd", momentum=momentum, **params), t(0.0), 3, kernels=kernels)
            for m in range(3):
                server.pull(m)
            for m in range(3):
                server.push(m, t(6.0), lr=1.0)   # tau 0, 1, 2: steps 6/1, 6/1, 6/2 (offset 1: 6/1, 6/2, 6/3)
            if not momentum:
                assert torch.allclose(server.w, t(expected))
            assert list(server.staleness.taus) == [0, 1, 2]


@pytest.mark.parametrize("kernels", KERNELS)
def test_sasgd_at_two_workers_in_turns_keeps_the_papers_rate(kernels):
    """M = 2 in turns: every gradient after the first has tau = 1, where alpha0/tau is alpha0 itself (the
    rule before issue 32, lr/(tau+1), halved it: kept as staleness_offset = 1)."""
    lr, gs = 0.1, [t(1.0, -2.0), t(0.5, 3.0), t(-1.0, 1.0), t(2.0, 0.25), t(-0.5, -1.5), t(1.5, 0.5)]
    for offset in (0, 1):
        server = ParameterServer(make_algorithm("sasgd", staleness_offset=offset, weight_decay=0.1), t(1.0, 1.0), 2,
                                 kernels=kernels)
        server.pull(0), server.pull(1)
        w = [1.0, 1.0]                              # float64, from the paper: w <- w - alpha0/tau * (g + wd*w)
        for k, g in enumerate(gs):
            m = k % 2
            tau = server.version - server.pulled_version[m]
            assert tau == (0 if k == 0 else 1)
            rate = lr / max(tau + offset, 1)
            w = [wi - rate * (float(gi) + 0.1 * wi) for wi, gi in zip(w, g)]
            server.push(m, g, lr)
            server.pull(m)
        assert server.staleness.taus.tolist() == [0, 1, 1, 1, 1, 1]
        assert torch.allclose(server.w.double(), torch.tensor(w, dtype=torch.float64), atol=1e-6)
        if offset == 0:   # the paper's: sgd's step, the same as asgd's on this schedule
            asgd = ParameterServer(make_algorithm("asgd", weight_decay=0.1), t(1.0, 1.0), 2, kernels=kernels)
            asgd.pull(0), asgd.pull(1)
            for k, g in enumerate(gs):
                asgd.push(k % 2, g, lr)
                asgd.pull(k % 2)
            assert torch.allclose(server.w, asgd.w, atol=1e-7)
        else:
            assert not torch.allclose(server.w.double(), torch.tensor(paper, dtype=torch.float64), atol=1e-3)
        paper = w


def test_sasgd_staleness_offset_is_0_or_1():
    with pytest.raises(ValueError, match=r"sasgd: staleness_offset must be 0 .* or 1 .*got 2"):
        make_algorithm("sasgd", staleness_offset=2)
    with pytest.raises(ValueError, match="staleness_offset"):
        make_algorithm("sasgd", staleness_offset=True)


@pytest.mark.parametrize("kernels", KERNELS)
def test_gap_aware_by_hand(kernels):
    lr, beta, eps = 0.1, 0.5, 1e-8
    # the authors' reading (default): v from the raw g^2 before the step, bias-corrected over k+1 updates
    server = ParameterServer(make_algorithm("gap-aware", ga_beta=beta, ga_eps=eps), t(0.0, 0.0), 2, kernels=kernels)
    server.pull(0), server.pull(1)
    server.push(0, t(2.0, 1.0), lr)          # first update: nothing moved, G = 1
    assert torch.allclose(server.w, t(-0.2, -0.1))
    server.push(1, t(4.0, 4.0), lr)          # worker 1 pulled [0, 0]: gap [0.2, 0.1]
    # v = 0.25*[4, 1] + 0.5*[16, 16] = [9, 8.25], bias 1 - 0.25 = 0.75: sqrt(v_hat) = [sqrt(12), sqrt(11)];
    # C = 0.1*sqrt(v_hat); G = 1 + gap/C
    g_ = [1 + 0.2 / (0.1 * math.sqrt(12.0)), 1 + 0.1 / (0.1 * math.sqrt(11.0))]
    assert torch.allclose(server.w, t(-0.2 - 0.1 * 4.0 / g_[0], -0.1 - 0.1 * 4.0 / g_[1]), atol=1e-6)
    assert server.state.updates == 2 and server.state.lr_max == lr
    # the applied-step reading: v from the step after it, k updates in the bias correction
    server = ParameterServer(make_algorithm("gap-aware", ga_beta=beta, ga_eps=eps, ga_reading="applied-step"),
                             t(0.0, 0.0), 2, kernels=kernels)
    server.pull(0), server.pull(1)
    server.push(0, t(2.0, 1.0), lr)
    assert torch.allclose(server.w, t(-0.2, -0.1))
    server.push(1, t(4.0, 4.0), lr)
    # v = (1-beta)*[4, 1], bias-corrected [4, 1]: C = 0.1*[2, 1] (+eps); G = 1 + gap/C = [2, 2]
    assert torch.allclose(server.w, t(-0.2 - 0.1 * 4.0 / 2, -0.1 - 0.1 * 4.0 / 2), atol=1e-6)
    assert server.state.updates == 2 and server.state.lr_max == lr


@pytest.mark.parametrize("kernels", KERNELS)
def test_gap_aware_penalises_weight_decay_as_its_authors_do(kernels):
    """The authors' code divides the weight decay term by the Gap too (its ``p.grad += p*wd*(1-G)/G``
    before torch's SGD adds wd*p); the applied-step reading adds it after the penalty."""
    lr, wd, beta = 0.1, 0.5, 0.5
    for reading in ("authors", "applied-step"):
        algo = make_algorithm("gap-aware", ga_beta=beta, weight_decay=wd, ga_reading=reading)
        server = ParameterServer(algo, t(1.0), 2, kernels=kernels)
        server.pull(0), server.pull(1)
        server.push(0, t(2.0), lr)           # G = 1: w = 1 - 0.1*(2 + 0.5) = 0.75
        assert torch.allclose(server.w, t(0.75))
        server.push(1, t(2.0), lr)           # worker 1's gap: 0.25
        if reading == "authors":             # v = 0.5*(0.5*4) + 0.5*4 = 3 (raw g^2), bias 0.75: C = 0.1*sqrt(4)
            gap = 1 + 0.25 / (0.1 * math.sqrt(3.0 / 0.75))
            expected = 0.75 - lr * (2.0 + wd * 0.75) / gap
        else:                                # v = 0.5*2.5^2 (the step), bias 0.5: C = 0.1*2.5
            gap = 1 + 0.25 / (0.1 * 2.5)
            expected = 0.75 - lr * (2.0 / gap + wd * 0.75)
        assert torch.allclose(server.w, t(expected), atol=1e-6), reading


def test_dana_pull_sends_the_look_ahead_and_the_push_moves_only_the_senders_momentum():
    lr, gamma = 0.5, 0.9
    server = ParameterServer(make_algorithm("dana-zero", momentum=gamma), t(1.0), 2)
    assert torch.equal(server.pull(0), t(1.0)) and torch.equal(server.pull(1), t(1.0))   # no momentum yet
    server.push(0, t(2.0), lr)               # v0 = 2, w = 1 - 0.5*2 = 0
    assert torch.allclose(server.w, t(0.0)) and torch.allclose(server.state.momenta[1], t(0.0))
    assert torch.allclose(server.pull(0), t(0.0 - lr * gamma * 2.0))   # w - lr*gamma*(v0 + v1)
    server.push(1, t(1.0), lr)               # v1 = 1, w = 0 - 0.5 = -0.5
    assert torch.allclose(server.w, t(-0.5))
    assert torch.allclose(server.pull(1), t(-0.5 - lr * gamma * 3.0))
    assert torch.allclose(server.state.momentum_sum, t(3.0))


def test_dana_dc_compensates_from_the_look_ahead_the_worker_computed_at():
    lr, gamma, lam = 0.5, 0.9, 1.0
    server = ParameterServer(make_algorithm("dana-dc", momentum=gamma, lam=lam), t(1.0), 2)
    server.pull(0), server.pull(1)
    server.push(0, t(2.0), lr)               # w = 0; worker 1's look-ahead was 1
    server.push(1, t(1.0), lr)               # g_dc = 1 + 1*1*1*(0 - 1) = 0: w unchanged
    assert torch.allclose(server.w, t(0.0))
    assert torch.allclose(server.state.w_bak[0], t(1.0))   # worker 0 has not pulled again


def test_agn_with_outer_sgd_at_rate_one_is_the_commit_added_as_it_is():
    torch.manual_seed(3)
    w0, commits = torch.randn(40), [torch.randn(40) for _ in range(6)]
    expected = w0.clone()
    for c in commits:
        expected = expected + c
    for params in ({}, {"outer_opt": "sgd", "outer_lr": 1.0}):
        server = ParameterServer(make_algorithm("agn", **params), w0, 2)
        for k, c in enumerate(commits):
            server.pull(k % 2)
            server.push(k % 2, c, lr=0.3)
        assert torch.equal(server.w, expected)   # bit for bit


@pytest.mark.parametrize("name", ["agn", "downpour", "async-local-sgd"])
def test_outer_nesterov_is_torch_sgd_nesterov_on_the_pseudo_gradient(name):
    torch.manual_seed(4)
    w0, commits = torch.randn(30), [torch.randn(30) for _ in range(5)]
    server = ParameterServer(make_algorithm(name, outer_opt="nesterov", outer_lr=0.7, outer_momentum=0.9), w0, 1)
    ref = w0.clone().requires_grad_(True)
    opt = torch.optim.SGD([ref], lr=0.7, momentum=0.9, nesterov=True)
    for c in commits:
        server.pull(0)
        server.push(0, c, lr=0.1)
        ref.grad = -c                            # the pseudo-gradient: w_pulled - w_local
        opt.step()
    assert torch.equal(server.w, ref.detach())


def test_outer_optimizer_validation():
    with pytest.raises(ValueError, match="agn: outer_opt must be one of sgd, nesterov, got 'delayed-nesterov'"):
        make_algorithm("agn", outer_opt="delayed-nesterov")
    with pytest.raises(ValueError, match="outer_lr"):
        make_algorithm("diloco", outer_lr=0.0)
    with pytest.raises(ValueError, match="outer_momentum"):
        make_algorithm("downpour", outer_momentum=1.0)
    with pytest.raises(ValueError, match=r"dn_c must be at most 1/N = 1/4"):
        make_algorithm("async-local-sgd", dn_delay=4, dn_c=0.5)
    with pytest.raises(ValueError, match="dn_delay"):
        make_algorithm("async-local-sgd", dn_delay=-1)
    make_algorithm("async-local-sgd", dn_c=0.5).check_workers(2)       # N = 2 workers: c <= 1/2
    with pytest.raises(ValueError, match=r"dn_c must be at most 1/N = 1/3"):
        make_algorithm("async-local-sgd", dn_c=0.5).check_workers(3)


# A float64 reference of each server rule, written from the papers' equations, against the public
# ParameterServer on a random asynchronous schedule (every tau, not only round robin).
def reference_server(name, algo, w, M):
    import numpy as np
    st = {"w": w.copy(), "bak": [w.copy() for _ in range(M)], "v": [np.zeros_like(w) for _ in range(M)],
          "buf": np.zeros_like(w), "sq": np.zeros_like(w), "k": 0, "lr_max": 0.0, "lr": 0.0,
          "D": np.zeros_like(w), "t": 0}

    def pull(m):
        if name.startswith("dana"):
            st["bak"][m] = st["w"] - st["lr"] * algo.momentum * sum(st["v"])
        else:
            st["bak"][m] = st["w"].copy()
        return st["bak"][m]

    def push(m, g, tau, lr):
        w = st["w"]
        if name == "sasgd":                      # Zhang et al.: alpha0/tau for tau >= 1, alpha0 at tau = 0
            tau_counted = tau + algo.staleness_offset   # (offset 1: the lr/(tau+1) variant)
            scale = 1 / tau_counted if tau_counted >= 1 else 1.0
            d = scale * (g + algo.weight_decay * w)     # this gradient's term, then torch's heavy ball
            st["buf"] = algo.momentum * st["buf"] + d
            st["w"] = w - lr * (st["buf"] if algo.momentum else d)
        elif name == "gap-aware" and algo.ga_reading == "authors":
            # FTPipe's GapAware: update_running_avg (raw g^2; with momentum the buffer before this step),
            # step_count += 1, C = max_lr*(sqrt(v/(1 - beta^step_count)) + eps), penalty = 1 + gap/C on the
            # gradient and on the weight decay, then torch's SGD
            st["lr_max"] = max(st["lr_max"], lr)
            k, b = st["k"] + 1, algo.ga_beta
            x = st["buf"] if algo.momentum else g
            st["sq"], st["k"] = b * st["sq"] + (1 - b) * x * x, k
            gap = 1 + np.abs(w - st["bak"][m]) / (st["lr_max"] * (np.sqrt(st["sq"] / (1 - b ** k)) + algo.ga_eps))
            d = (g + algo.weight_decay * w) / gap
            st["buf"] = algo.momentum * st["buf"] + d
            st["w"] = w - lr * (st["buf"] if algo.momentum else d)
        elif name == "gap-aware":                # the applied-step reading: the average of the step, after it
            st["lr_max"] = max(st["lr_max"], lr)
            k, b = st["k"], algo.ga_beta
            gap = 1 + np.abs(w - st["bak"][m]) / (st["lr_max"] * (np.sqrt(st["sq"] / (1 - b ** k)) + algo.ga_eps)) \
                if k else 1.0
            d = g / gap + algo.weight_decay * w
            st["buf"] = algo.momentum * st["buf"] + d
            d = st["buf"] if algo.momentum else d
            st["w"] = w - lr * d
            st["sq"], st["k"] = b * st["sq"] + (1 - b) * d * d, k + 1
        elif name.startswith("dana"):
            if name == "dana-dc":
                g = g + algo.lam * g * g * (w - st["bak"][m])
            st["v"][m] = algo.momentum * st["v"][m] + g
            st["w"], st["lr"] = w - lr * st["v"][m], lr
        else:                                    # async-local-sgd, delayed nesterov on p = -commit
            p, N, mu, c, t_ = -g, algo.dn_delay or M, algo.outer_momentum, algo.dn_c, st["t"]
            st["D"] = st["D"] + p
            if (t_ + 1) % N == 0:
                st["buf"] = mu * st["buf"] + st["D"] / N
                st["w"] = w - algo.outer_lr * ((1 - c * N + c) * mu * st["buf"] + p / N)
                st["D"] = np.zeros_like(w)
            else:
                st["w"] = w - algo.outer_lr * (c * mu * st["buf"] + p / N)
            st["t"] = t_ + 1
    return st, pull, push


@pytest.mark.parametrize("name,params", [
    ("sasgd", {}), ("sasgd", {"staleness_offset": 1}), ("sasgd", {"momentum": 0.5, "weight_decay": 0.01}),
    ("gap-aware", {}), ("gap-aware", {"momentum": 0.9, "weight_decay": 0.01, "ga_beta": 0.9}),
    ("gap-aware", {"ga_reading": "applied-step"}),
    ("gap-aware", {"ga_reading": "applied-step", "momentum": 0.9, "weight_decay": 0.01, "ga_beta": 0.9}),
    ("dana-zero", {}), ("dana-dc", {"lam": 0.5}), ("async-local-sgd", {}), ("async-local-sgd", {"dn_c": 0.2}),
])
@pytest.mark.parametrize("kernels", ["torch", pytest.param("numba", marks=pytest.mark.skipif(
    importlib.util.find_spec("numba") is None, reason="the fused kernels need numba"))])
def test_random_schedules_through_the_server_match_the_float64_reference(name, params, kernels):
    """On both server paths: the rules' torch operators and their fused kernels."""
    import random

    import numpy as np
    M, n = 4, 64
    rng = random.Random(name)
    gen = torch.Generator().manual_seed(7)
    algo = make_algorithm(name, **params)
    w0 = torch.randn(n, generator=gen)
    server = ParameterServer(algo, w0, M, kernels=kernels)
    assert server.kernels == kernels
    st, ref_pull, ref_push = reference_server(name, algo, w0.double().numpy(), M)
    for m in range(M):
        assert np.allclose(server.pull(m).double().numpy(), ref_pull(m), atol=1e-6)
    resumed = None
    for step in range(80):
        m = rng.randrange(M)
        g = torch.randn(n, generator=gen)
        lr = 0.05 if step < 40 else 0.02         # a schedule's step down: lr_max and DANA's stored lr
        tau = server.version - server.pulled_version[m]
        for s in filter(None, (server, resumed)):
            s.push(m, g, lr)
        ref_push(m, g.double().numpy(), tau, lr)
        sent = [s.pull(m) for s in filter(None, (server, resumed))]
        expected = ref_pull(m)
        np.testing.assert_allclose(server.w.double().numpy(), st["w"], rtol=1e-4, atol=1e-5)
        np.testing.assert_allclose(sent[0].double().numpy(), expected, rtol=1e-4, atol=1e-5)
        if len(sent) == 2:
            assert torch.equal(resumed.w, server.w) and torch.equal(sent[0], sent[1])
        if step == 30:                           # a server restored from state_dict() continues bit for bit
            saved = io.BytesIO()
            torch.save(server.state_dict(), saved)   # as a checkpoint holds it
            saved.seek(0)
            resumed = ParameterServer(algo, torch.zeros(n), M, kernels=kernels)
            resumed.load_state_dict(torch.load(saved, weights_only=True))
    assert len(set(server.staleness.taus)) > 2   # the schedule mixed staleness values
