"""The mechanism controls of issue 42: ``dcasgd-a-redrawn`` (DC-ASGD-a's Taylor term with its sign redrawn per
coordinate at every push) and ``dcasgd-a-damped`` (a scalar pull towards w_bak[m] of the term's mean size).

The references are the formulas in float64, written from DC-ASGD-a's rule, with the signs of a splitmix64
written here in Python integers (not the library's numpy), replayed over schedules of pulls and pushes."""
import copy
import math

import numpy as np
import pytest
import torch

import stalegrad as sg
import stalegrad.core.server as server_mod
from stalegrad.algorithms import fused
from stalegrad.core.sharding import ShardedServer, local_shards, shard_bounds

REDRAWN, DAMPED = "dcasgd-a-redrawn", "dcasgd-a-damped"
SEED, U64 = 42, (1 << 64) - 1


def splitmix_sign(i: int, t: int) -> int:
    """The sign of weight i at push t: the top bit of splitmix64's mix of 42 + (i + t*2**32)*golden."""
    z = (SEED + (i + (t << 32)) * 0x9E3779B97F4A7C15) & U64
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & U64
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & U64
    return 1 if (z ^ (z >> 31)) >> 63 else -1


def signs(n: int, t: int) -> torch.Tensor:
    return torch.tensor([splitmix_sign(i, t) for i in range(n)], dtype=torch.float64)


def gradient(k: int, n: int) -> torch.Tensor:
    return torch.randn(n, generator=torch.Generator().manual_seed(100 + k))


def replay(name, pushes, n=64, M=3, lr=0.05, kernels=None, lam0=2.0, mom=0.95, eps=1e-7, momentum=0.0, wd=0.0):
    """(the server's weights, the float64 reference's) after ``pushes``: (worker, message seed) pairs, each
    worker pulling again right after its push."""
    w0 = torch.randn(n, generator=torch.Generator().manual_seed(0))
    algo = sg.make_algorithm(name, lam0=lam0, ms_momentum=mom, eps=eps, momentum=momentum, weight_decay=wd)
    server = sg.ParameterServer(algo, w0.clone(), M, kernels=kernels)
    w, bak = w0.double(), [w0.double().clone() for _ in range(M)]
    ms, buf = [torch.zeros(n, dtype=torch.float64)] * M, torch.zeros(n, dtype=torch.float64)
    for m in range(M):
        server.pull(m)
    for t, (m, k) in enumerate(pushes):
        g32 = gradient(k, n)
        server.push(m, g32, lr)
        server.pull(m)
        g = g32.double()
        ms[m] = mom * ms[m] + (1 - mom) * g * g
        factor = lam0 / torch.sqrt(ms[m] + eps) * g * g
        if name == REDRAWN:
            gc = g + factor * (signs(n, t) * (w - bak[m]))
        else:
            gc = g + factor.mean() * (w - bak[m])
        buf = momentum * buf + gc + wd * w
        w = w - lr * buf
        bak[m] = w.clone()
    return server, w


SCHEDULE = [(0, 1), (1, 2), (2, 3), (0, 4), (0, 5), (2, 6), (1, 7), (1, 8), (2, 9), (0, 10)]


@pytest.mark.parametrize("kernels", ["torch", None])
@pytest.mark.parametrize("name", [REDRAWN, DAMPED])
def test_the_controls_follow_their_formulas(name, kernels):
    server, ref = replay(name, SCHEDULE, kernels=kernels)
    assert torch.allclose(server.w.double(), ref, rtol=0, atol=1e-5)
    assert server.version == len(SCHEDULE) and max(server.staleness.taus) >= 2


@pytest.mark.parametrize("name", [REDRAWN, DAMPED])
def test_the_controls_follow_their_formulas_with_momentum_and_weight_decay(name):
    server, ref = replay(name, SCHEDULE, kernels="torch", momentum=0.5, wd=1e-3)
    assert torch.allclose(server.w.double(), ref, rtol=0, atol=1e-5)


def test_the_formulas_tell_the_controls_from_dcasgd_a():
    """The references are not all one rule: each control's replay leaves dcasgd-a's weights (and each other's)."""
    finals = {name: replay(name, SCHEDULE, kernels="torch", lam0=8.0)[0].w for name in ("dcasgd-a", REDRAWN, DAMPED)}
    a, r, d = finals["dcasgd-a"], finals[REDRAWN], finals[DAMPED]
    assert (a - r).abs().max() > 1e-4 and (a - d).abs().max() > 1e-4 and (r - d).abs().max() > 1e-4


def test_the_library_signs_are_splitmix64_bit_for_bit():
    """Keys across the whole int64 range: the numpy uint64 arithmetic wraps as Python's exact integers do."""
    from stalegrad.algorithms.controls import redrawn_signs
    keys = torch.randint(0, 2**63 - 1, (3000,), generator=torch.Generator().manual_seed(5), dtype=torch.int64)
    keys[:3] = torch.tensor([0, 1, 2**63 - 1])
    expected = [splitmix_sign(k & (2**32 - 1), k >> 32) for k in keys.tolist()]
    assert redrawn_signs(keys, torch.float64).tolist() == expected


def corrections(name, steps, n=4096, lr=0.1, lam0=2.0, mom=0.95, eps=1e-7):
    """Worker 0 pushes ``steps`` stale gradients, each after worker 1 moved w. Per push: the control's
    correction (the step over -lr, less g), and, from the server's state before the push, the drift
    w - w_bak[0] and DC-ASGD-a's factor lam0/sqrt(ms+eps)*g*g (ms updated first), in float64."""
    server = sg.ParameterServer(sg.make_algorithm(name, lam0=lam0), torch.randn(n), 2, kernels="torch")
    server.pull(0), server.pull(1)
    ms, out = torch.zeros(n, dtype=torch.float64), []
    for k in range(steps):
        server.push(1, gradient(1000 + k, n), lr)
        server.pull(1)
        before, bak, g = server.w.double(), server.state.w_bak[0].double(), gradient(k, n).double()
        server.push(0, gradient(k, n), lr)
        server.pull(0)
        ms = mom * ms + (1 - mom) * g * g
        out.append(((before - server.w.double()) / lr - g, before - bak, lam0 / torch.sqrt(ms + eps) * g * g))
    return out


def test_the_redrawn_sign_has_dcasgd_a_size_and_is_fresh_at_every_push():
    """At every push |correction| = |DC-ASGD-a's term|, with signs about half +1, agreeing with the term on
    about half the weights, and drawn afresh: two pushes' signs agree on about half the weights."""
    drawn = []
    for t, (correction, drift, factor) in enumerate(corrections(REDRAWN, 3)):
        term = factor * drift
        assert torch.allclose(correction.abs(), term.abs(), rtol=1e-3, atol=1e-5)
        big = term.abs() > 1e-2   # where float32 rounding of w cannot flip the measured sign
        assert big.double().mean() > 0.2
        s = torch.sign(correction[big] / term[big])
        assert 0.45 < (s > 0).double().mean() < 0.55
        assert torch.equal(s, signs(len(term), 2 * t + 1)[big])   # push 2t+1: worker 1 pushed just before
        drawn.append(signs(len(term), 2 * t + 1))
    assert 0.45 < (drawn[0] == drawn[1]).double().mean() < 0.55
    assert 0.45 < (drawn[1] == drawn[2]).double().mean() < 0.55
    assert 0.45 < (drawn[0][1:] == drawn[0][:-1]).double().mean() < 0.55   # neighbours independent too


def test_the_damped_scalar_is_the_mean_of_dcasgd_a_factor():
    """One scalar per push, c = mean_i(lam0/sqrt(ms+eps)*g*g): correction / (w - w_bak) is c at every weight."""
    for correction, drift, factor in corrections(DAMPED, 2):
        c = factor.mean().item()
        big = drift.abs() > 1e-2
        ratios = correction[big] / drift[big]
        assert big.double().mean() > 0.2
        assert torch.allclose(ratios, torch.full_like(ratios, c), rtol=1e-3)   # one scalar, not one per weight
        assert not torch.allclose(ratios, factor[big], rtol=0.1)               # DC-ASGD-a's shape is gone


def play(name, chunked, monkeypatch, n=1000, M=3, pushes=12, kernels="torch"):
    monkeypatch.setattr(server_mod, "CHUNK", 64)
    monkeypatch.setattr(server_mod, "CHUNK_ABOVE", 128 if chunked else 10**12)
    server = sg.ParameterServer(sg.make_algorithm(name, lam0=4.0), torch.randn(n), M, kernels=kernels)
    for m in range(M):
        server.pull(m)
    for i in range(pushes):
        m = (i * 7) % M
        server.push(m, gradient(i, n), 0.1)
        server.pull(m)
    return server


def same_bits(a, b):
    assert torch.equal(a.w, b.w) and a.version == b.version
    x_state, y_state = a.state.to_dict(), b.state.to_dict()
    assert x_state.keys() == y_state.keys()
    for key in x_state:
        x, y = x_state[key], y_state[key]
        assert all(torch.equal(u, v) for u, v in zip(x, y)) if isinstance(x, list) else torch.equal(x, y)


@pytest.mark.parametrize("name", [REDRAWN, DAMPED])
def test_chunked_and_whole_vectors_give_the_same_bits(name, monkeypatch):
    """The redrawn signs come from each weight's own key, so chunks draw what the whole vector draws; the
    damped mean is taken over the whole vector, never per chunk (both would fail with a per-chunk draw)."""
    torch.manual_seed(3)
    chunked = play(name, True, monkeypatch)
    torch.manual_seed(3)
    whole = play(name, False, monkeypatch)
    same_bits(chunked, whole)
    assert getattr(type(chunked.algorithm).server_delta, "elementwise", False) == (name == REDRAWN)


@pytest.mark.parametrize("name", [REDRAWN, DAMPED])
def test_the_same_pushes_give_the_same_bits_at_one_and_two_threads(name, monkeypatch):
    """200K weights: torch's own float32 sum splits by thread there; the damped mean does not."""
    before = torch.get_num_threads()
    servers = []
    try:
        for threads in (1, 2, 2):
            torch.set_num_threads(threads)
            torch.manual_seed(7)
            servers.append(play(name, False, monkeypatch, n=200_000, pushes=6))
    finally:
        torch.set_num_threads(before)
    same_bits(servers[0], servers[1])
    same_bits(servers[1], servers[2])


@pytest.mark.parametrize("name", [REDRAWN, DAMPED])
def test_without_a_fused_kernel_the_numba_server_runs_the_torch_rule(name, monkeypatch):
    if fused.choose("cpu", True, "auto") != "numba":
        pytest.skip("numba is not installed (the 'fast' extra)")
    torch.manual_seed(4)
    numba = play(name, False, monkeypatch, kernels="numba")
    torch.manual_seed(4)
    same_bits(numba, play(name, False, monkeypatch, kernels="torch"))
    assert numba.kernels == "numba"


@pytest.mark.parametrize("name", [REDRAWN, DAMPED])
def test_a_server_loaded_from_its_state_dict_goes_on_with_the_same_bits(name, monkeypatch):
    torch.manual_seed(5)
    server = play(name, False, monkeypatch, pushes=5)
    copy_ = sg.ParameterServer(server.algorithm, torch.zeros(1000), 3, kernels="torch")
    copy_.load_state_dict(copy.deepcopy(server.state_dict()))
    for i in range(5, 12):
        for s in (server, copy_):
            s.push(i % 3, gradient(i, 1000), 0.1)
            s.pull(i % 3)
    same_bits(server, copy_)
    if name == REDRAWN:   # the push count travels in the state: 12 pushes, key = i + 12*2**32
        assert torch.equal(server.state.sign_key, torch.arange(1000) + (12 << 32))


def sharded_play(name, shards, n=50, M=3, pushes=15):
    algo = sg.make_algorithm(name, lam0=4.0)
    w0 = torch.randn(n, generator=torch.Generator().manual_seed(0))
    one = sg.ParameterServer(algo, w0, M, kernels="torch")
    servers, call = local_shards(sg.ParameterServer(algo, w0, M, kernels="torch"), shards)
    sharded = ShardedServer(call, shards, M, False, algorithm=algo)
    bounds = shard_bounds(n, shards)
    for m in range(M):
        one.pull(m), sharded.pull(m)
    for i in range(pushes):
        m, g = (i * 2) % M, gradient(i, n)
        assert one.push(m, g, 0.05) and sharded.push(m, [g[a:b] for a, b in bounds], 0.05, True)
        one.pull(m), sharded.pull(m)
    return one.w, torch.cat([s.w for s in servers]), bounds


def test_redrawn_shards_equal_one_server():
    one, sharded, _ = sharded_play(REDRAWN, 3)
    assert torch.equal(one, sharded)


def test_damped_shards_each_average_over_their_own_slice():
    """The documented behaviour: shard k's c is the mean of DC-ASGD-a's factor over its own weights, so K
    shards are K damped servers side by side (the float64 replay of each slice), not one server."""
    n, M, lam0, mom, eps, lr = 50, 3, 4.0, 0.95, 1e-7, 0.05
    one, sharded, bounds = sharded_play(DAMPED, 3, n=n, M=M)
    assert not torch.allclose(one, sharded, rtol=0, atol=1e-6)
    w0 = torch.randn(n, generator=torch.Generator().manual_seed(0)).double()
    for a, b in bounds:
        w, bak, ms = w0[a:b].clone(), [w0[a:b].clone() for _ in range(M)], [torch.zeros(b - a).double()] * M
        for i in range(15):
            m, g = (i * 2) % M, gradient(i, n)[a:b].double()
            ms[m] = mom * ms[m] + (1 - mom) * g * g
            w = w - lr * (g + (lam0 / torch.sqrt(ms[m] + eps) * g * g).mean() * (w - bak[m]))
            bak[m] = w.clone()
        assert torch.allclose(sharded[a:b].double(), w, rtol=0, atol=1e-5)


@pytest.mark.parametrize("name", [REDRAWN, DAMPED])
def test_an_update_that_overflows_is_skipped_whole(name):
    server = sg.ParameterServer(sg.make_algorithm(name), torch.randn(100), 2, kernels="torch")
    server.pull(0), server.pull(1)
    server.push(1, gradient(0, 100), 0.1)
    before = server.w.clone()
    g = gradient(1, 100)
    g[7] = 1e30   # g*g overflows float32: the damped mean is inf or NaN, the redrawn term at weight 7 too
    assert server.push(0, g, 0.1) is False
    assert torch.equal(server.w, before) and server.nonfinite_skipped == 1


def test_the_controls_train_in_the_simulator_and_are_reproducible():
    from helpers import TEST, TRAIN
    sha = {}
    for name in (REDRAWN, DAMPED, "dcasgd-a", "dcasgd-a-scrambled"):
        runs = [sg.train("logreg", TRAIN, TEST, algorithm=name, workers=4, epochs=2, batch_size=16, lr=0.1, seed=2)
                for _ in range(2 if name in (REDRAWN, DAMPED) else 1)]
        assert len({r.summary["weights_sha256"] for r in runs}) == 1
        assert math.isfinite(runs[0].summary["final_test_acc"])
        sha[name] = runs[0].summary["weights_sha256"]
    assert len(set(sha.values())) == 4   # four rules, four results


@pytest.mark.parametrize("name", [REDRAWN, DAMPED])
def test_a_resumed_run_ends_with_the_uninterrupted_run_bits(name, tmp_path, monkeypatch):
    from helpers import TEST, TRAIN, cut

    def train(path, resume=None):
        return sg.train("logreg", TRAIN, TEST, name, 3, sg.Simulator(delay="gamma:2"), epochs=2, batch_size=8,
                        lr=0.1, seed=5, checkpoint_every=7, checkpoint_path=path, resume=resume)
    full = train(tmp_path / "full.pt")
    cut(train, tmp_path / "cut.pt", monkeypatch, at_version=10)
    saved = torch.load(tmp_path / "cut.pt", weights_only=True)
    assert saved["run"]["server"]["version"] == 7
    resumed = train(tmp_path / "cut.pt", resume=tmp_path / "cut.pt")
    assert resumed.summary["weights_sha256"] == full.summary["weights_sha256"]
    assert np.isfinite(resumed.summary["final_test_acc"])
