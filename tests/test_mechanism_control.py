"""The mechanism control of issue 31, ``dcasgd-a-scrambled``: DC-ASGD-a's Taylor term with the signs of
w - w_bak[m] scrambled per coordinate. The reference is the formula, in float64, written from the paper's
DC-ASGD-a rule with the sign mask inserted, replayed over a schedule of pulls and pushes."""
import math

import pytest
import torch

import stalegrad as sg
from stalegrad.algorithms.controls import sign_mask


def replay(name, pushes, n=64, M=3, lr=0.05, kernels=None, lam0=2.0, mom=0.95, eps=1e-7):
    """(the server's weights, the float64 reference's) after ``pushes``: (worker, message seed) pairs, each
    worker pulling again right after its push."""
    w0 = torch.randn(n, generator=torch.Generator().manual_seed(0))
    server = sg.ParameterServer(sg.make_algorithm(name, lam0=lam0), w0.clone(), M, kernels=kernels)
    s = sign_mask(n, "cpu", torch.float64) if name == "dcasgd-a-scrambled" else torch.ones(n, dtype=torch.float64)
    w, bak, ms = w0.double(), [w0.double().clone() for _ in range(M)], [torch.zeros(n, dtype=torch.float64)] * M
    for m in range(M):
        server.pull(m)
    for m, k in pushes:
        g32 = torch.randn(n, generator=torch.Generator().manual_seed(100 + k))
        server.push(m, g32, lr)
        server.pull(m)
        g = g32.double()
        ms[m] = mom * ms[m] + (1 - mom) * g * g
        w = w - lr * (g + lam0 / torch.sqrt(ms[m] + eps) * g * g * (s * (w - bak[m])))
        bak[m] = w.clone()
    return server.w.double(), w


SCHEDULE = [(0, 1), (1, 2), (2, 3), (0, 4), (0, 5), (2, 6), (1, 7), (1, 8), (2, 9), (0, 10)]


@pytest.mark.parametrize("kernels", ["torch", None])
def test_the_control_follows_its_formula(kernels):
    ours, ref = replay("dcasgd-a-scrambled", SCHEDULE, kernels=kernels)
    assert torch.allclose(ours, ref, rtol=0, atol=1e-5)


def test_the_reference_with_unit_signs_is_dcasgd_a():
    """The same replay without the mask reproduces the library's dcasgd-a: the reference is the paper's rule."""
    ours, ref = replay("dcasgd-a", SCHEDULE, kernels="torch")
    assert torch.allclose(ours, ref, rtol=0, atol=1e-5)


def test_the_term_has_dcasgd_a_size_at_every_coordinate_and_a_random_sign():
    """One stale push from the same state: the two rules' corrections differ only in sign, coordinate by
    coordinate, and the signs disagree on about half of them."""
    n, lr = 4096, 0.1
    w0 = torch.randn(n, generator=torch.Generator().manual_seed(1))
    moves = torch.randn(n, generator=torch.Generator().manual_seed(2))
    g = torch.randn(n, generator=torch.Generator().manual_seed(3))
    steps = {}
    for name in ("dcasgd-a", "dcasgd-a-scrambled", "asgd"):
        kw = {} if name == "asgd" else {"lam0": 2.0}
        server = sg.ParameterServer(sg.make_algorithm(name, **kw), w0.clone(), 2, kernels="torch")
        server.pull(0), server.pull(1)
        server.push(1, moves, lr)              # worker 1 moves w: worker 0's gradient is now stale
        before = server.w.clone()
        server.push(0, g, lr)
        steps[name] = server.w - before
    plain = steps["asgd"]
    dc, control = steps["dcasgd-a"] - plain, steps["dcasgd-a-scrambled"] - plain
    assert torch.allclose(dc.abs(), control.abs(), rtol=0, atol=1e-6)   # float32 rounding of w (about 1)
    flipped = ((dc * control) < 0).float().mean().item()
    assert 0.45 < flipped < 0.55
    mask = sign_mask(n, "cpu", torch.float32)
    assert set(mask.unique().tolist()) == {-1.0, 1.0}
    assert torch.equal(mask, sign_mask(n, "cpu", torch.float32))   # one mask, the same in every run


def test_the_control_trains_in_the_simulator_and_is_reproducible():
    from helpers import TRAIN, TEST
    runs = [sg.train("logreg", TRAIN, TEST, algorithm="dcasgd-a-scrambled", workers=4, epochs=2, batch_size=16,
                     lr=0.1, seed=2) for _ in range(2)]
    assert runs[0].summary["weights_sha256"] == runs[1].summary["weights_sha256"]
    assert math.isfinite(runs[0].summary["final_test_acc"])
    dc = sg.train("logreg", TRAIN, TEST, algorithm="dcasgd-a", workers=4, epochs=2, batch_size=16, lr=0.1, seed=2)
    assert dc.summary["weights_sha256"] != runs[0].summary["weights_sha256"]
