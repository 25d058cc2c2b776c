"""The fused server kernels (stalegrad/algorithms/fused.py) against the torch-operator rules.

sgd, asgd and dcasgd-c must give the torch path's bits, state included; dcasgd-a the
same MeanSquare bits and weights within float32 rounding (its square root is IEEE's,
torch's CPU sqrt is MKL's), and exactly an independent float32 formula. Both the serial
and the parallel kernels, the torch path chunked and not. The non-finite cases run on
both paths in test_server_fastpath.py and test_sharding.py.
"""
import math

import numpy as np
import pytest
import torch

pytest.importorskip("numba")

import stalegrad as sg  # noqa: E402
import stalegrad.server as server_mod  # noqa: E402
from stalegrad.algorithms import fused, make_algorithm  # noqa: E402
from stalegrad.errors import ConfigError  # noqa: E402
from stalegrad.runtimes import Simulator  # noqa: E402
from stalegrad.server import ParameterServer  # noqa: E402

from helpers import TEST, TRAIN  # noqa: E402

EXACT = [("sgd", {}), ("sgd", {"momentum": 0.9, "weight_decay": 0.01}), ("asgd", {"momentum": 0.9}),
         ("asgd", {"weight_decay": 1e-3}), ("dcasgd-c", {}), ("dcasgd-c", {"lam": 2.0}),
         ("dcasgd-c", {"momentum": 0.5, "weight_decay": 1e-3})]
ADAPTIVE = [("dcasgd-a", {}), ("dcasgd-a", {"momentum": 0.5, "weight_decay": 1e-3}), ("dcasgd-a", {"lam0": 0.5})]


def play(name, params, kernels, n, *, M=3, pushes=12, seed=0, lr=0.1):
    algo = make_algorithm(name, **params)
    M = 1 if algo.sequential else M
    g = torch.Generator().manual_seed(seed)
    server = ParameterServer(algo, torch.randn(n, generator=g), M, kernels=kernels)
    assert server.kernels == kernels
    for m in range(M):
        server.pull(m)
    for i in range(pushes):
        m = (i * 7) % M
        # large enough that the DC terms matter: w - w_bak of order 1, g*g of order 1
        assert server.push(m, torch.randn(n, generator=g) * 2, lr)
        if i % 2:
            server.pull(m)
    return server


def state_tensors(server):
    out = []
    for key, value in sorted(server.state.items()):
        out += [(key, v) for v in (value if isinstance(value, list) else [value])]
    return out


@pytest.fixture(params=["serial", "parallel"])
def kernel_kind(request, monkeypatch):
    """Serial kernels on one thread; parallel ones on two threads from 256 elements."""
    if request.param == "parallel":
        monkeypatch.setattr(fused, "PARALLEL_ABOVE", 256)
        threads = torch.get_num_threads()
        torch.set_num_threads(2)
        yield request.param
        torch.set_num_threads(threads)
    else:
        yield request.param


@pytest.mark.parametrize("name,params", EXACT)
@pytest.mark.parametrize("n", [1, 7, 1000])
def test_fused_gives_the_torch_paths_bits(name, params, n, kernel_kind):
    torch_path, numba_path = play(name, params, "torch", n), play(name, params, "numba", n)
    assert torch.equal(numba_path.w, torch_path.w)
    assert numba_path.version == torch_path.version == 12
    for (k, a), (_, b) in zip(state_tensors(torch_path), state_tensors(numba_path)):
        assert torch.equal(a, b), k


@pytest.mark.parametrize("name,params", EXACT[1:2] + EXACT[-1:] + ADAPTIVE[1:2])
def test_fused_against_the_chunked_torch_path(name, params, monkeypatch):
    monkeypatch.setattr(server_mod, "CHUNK", 64)
    monkeypatch.setattr(server_mod, "CHUNK_ABOVE", 128)
    torch_path, numba_path = play(name, params, "torch", 1000), play(name, params, "numba", 1000)
    # dcasgd-a: 1-ulp square roots, through momentum over 12 updates (values of order 1)
    torch.testing.assert_close(numba_path.w, torch_path.w, rtol=1e-5, atol=1e-5)
    if name != "dcasgd-a":
        assert torch.equal(numba_path.w, torch_path.w)


@pytest.mark.parametrize("name,params", ADAPTIVE)
def test_dcasgd_a_within_float32_rounding_of_the_torch_path(name, params, kernel_kind):
    torch_path, numba_path = play(name, params, "torch", 1000), play(name, params, "numba", 1000)
    for m in range(3):   # the MeanSquare does not take a square root: same bits
        assert torch.equal(numba_path.state["mean_square"][m], torch_path.state["mean_square"][m])
    # a 1-ulp square root moves the correction term by an ulp, the weights (of order 1) by
    # about that many float32 roundings after 12 updates
    torch.testing.assert_close(numba_path.w, torch_path.w, rtol=1e-5, atol=1e-5)
    assert not torch.equal(numba_path.w, torch_path.w)   # the IEEE square root does differ


def _fma32(a, b, c):
    # a*b is exact in float64 (24 + 24 bits); the sum is rounded once to float64, then to float32
    return (a.astype(np.float64) * b.astype(np.float64) + c.astype(np.float64)).astype(np.float32)


def test_dcasgd_a_is_the_float32_formula_with_an_ieee_square_root():
    rng = np.random.default_rng(3)
    n = 4099
    g, w, wb = (rng.standard_normal(n).astype(np.float32) for _ in range(3))
    ms = rng.random(n).astype(np.float32)
    f = np.float32
    lr, lam0, mom, eps = 0.1, 2.0, 0.95, 1e-7
    m_ref = _fma32(f(1 - mom) * g, g, ms * f(mom))
    d_ref = g + (f(lam0) * ((w - wb) * g * g)) / np.sqrt(m_ref + f(eps))
    w_ref = _fma32(d_ref, np.full(n, f(-lr)), w)
    wt, mst, old = torch.from_numpy(w.copy()), torch.from_numpy(ms.copy()), torch.empty(n)
    ok = fused.dcasgd_a_apply(torch.from_numpy(g), wt, torch.from_numpy(wb), mst, None, old, lam0=lam0,
                              ms_momentum=mom, eps=eps, weight_decay=0.0, momentum=0.0, s=-lr)
    assert ok
    assert np.array_equal(mst.numpy(), m_ref)
    assert np.array_equal(wt.numpy(), w_ref)
    assert np.array_equal(old.numpy(), w)


def test_a_non_finite_update_leaves_the_weights_as_they_were():
    """The kernel adds in place and keeps the old weights: the server puts them back."""
    server = ParameterServer(make_algorithm("dcasgd-c"), torch.randn(1000), 2, kernels="numba")
    server.pull(0)
    server.push(0, torch.randn(1000), 0.1)
    before = server.w.clone()
    g = torch.randn(1000)
    g[999] = 3e30   # g*g overflows in the last element only: every other element was already added
    assert not server.push(1, g, 0.1)
    assert torch.equal(server.w, before) and server.nonfinite_skipped == 1


def test_commit_without_apply_puts_the_old_weights_back():
    """A shard whose own slice is finite is told that another one's was not."""
    server = ParameterServer(make_algorithm("dcasgd-a"), torch.randn(600), 1, kernels="numba")
    server.pull(0)
    before = server.w.clone()
    assert server.prepare(0, torch.randn(600), 0.1) == (True, True)
    assert not torch.equal(server.w, before)   # applied in place already
    assert not server.commit(apply=False)
    assert torch.equal(server.w, before) and server.version == 0 and server.nonfinite_skipped == 1


def test_parallel_kernels_are_deterministic_and_equal_the_serial_ones(monkeypatch):
    runs = []
    for parallel_above in (10**9, 256, 256):
        monkeypatch.setattr(fused, "PARALLEL_ABOVE", parallel_above)
        threads = torch.get_num_threads()
        torch.set_num_threads(2)
        try:
            runs.append(play("dcasgd-a", {"momentum": 0.9}, "numba", 5000))
        finally:
            torch.set_num_threads(threads)
    assert torch.equal(runs[0].w, runs[1].w) and torch.equal(runs[1].w, runs[2].w)


def test_finite_limit_is_the_float32_overflow_bound():
    rng = np.random.default_rng(0)
    for s in [1.0, -0.1, 1e-30, 3.0e38, 7.5] + list(10.0 ** rng.uniform(-40, 38, 200)):
        limit = fused.finite_limit(s)
        a = abs(float(np.float32(s)))
        assert float(limit) * a < fused.F32_OVERFLOW
        with np.errstate(over="ignore"):
            above = np.nextafter(limit, np.float32(np.inf))
        assert not math.isfinite(above) or float(above) * a >= fused.F32_OVERFLOW


def test_max_abs_with_nan_inf_and_negative_values():
    t = torch.randn(1001)
    assert fused.max_abs(t) == float(t.abs().max())
    t[17] = -float("inf")
    assert fused.max_abs(t) == math.inf
    t[500] = float("nan")
    assert math.isnan(fused.max_abs(t))
    assert fused.max_abs(torch.tensor([-0.0, 0.0])) == 0.0


def test_choosing_the_kernels(monkeypatch):
    monkeypatch.delenv("STALEGRAD_KERNELS", raising=False)
    assert fused.choose("cpu", True) == "numba"
    assert fused.choose("cuda", True) == "torch" and fused.choose("cpu", False) == "torch"
    monkeypatch.setenv("STALEGRAD_KERNELS", "torch")
    assert fused.choose("cpu", True) == "torch"
    assert ParameterServer(make_algorithm("asgd"), torch.zeros(3), 1).kernels == "torch"
    monkeypatch.setenv("STALEGRAD_KERNELS", "fast")
    with pytest.raises(ConfigError, match="STALEGRAD_KERNELS must be one of auto, numba, torch, got 'fast'"):
        fused.choose("cpu", True)
    with pytest.raises(ConfigError, match="cannot be used"):
        fused.choose("cuda", True, "numba")
    monkeypatch.delenv("STALEGRAD_KERNELS")
    assert ParameterServer(make_algorithm("asgd"), torch.zeros(3, dtype=torch.float64), 1).kernels == "torch"


def run(algo, kernels, monkeypatch, **params):
    monkeypatch.setenv("STALEGRAD_KERNELS", kernels)
    return sg.train("logreg", TRAIN, TEST, make_algorithm(algo, **params), 4, Simulator(delay="gamma:2"),
                    epochs=1.0, batch_size=8, seed=5)


def test_seeded_runs_same_weights_and_the_kernels_in_the_summary(monkeypatch):
    a, b = run("dcasgd-a", "numba", monkeypatch), run("dcasgd-a", "numba", monkeypatch)
    assert a.summary["weights_sha256"] == b.summary["weights_sha256"]
    assert a.summary["server_kernels"] == "numba"
    # the rules that round as torch does give the torch path's run exactly
    c, d = run("dcasgd-c", "numba", monkeypatch, momentum=0.9), run("dcasgd-c", "torch", monkeypatch, momentum=0.9)
    assert c.summary["weights_sha256"] == d.summary["weights_sha256"]
    assert d.summary["server_kernels"] == "torch"
