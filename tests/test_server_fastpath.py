"""Fast paths: chunked element-wise rules, fused (t, s) updates, overflow checks, BatchStream.next."""
import copy
import math

import pytest
import torch

import stalegrad.core.server as server_mod
from stalegrad.algorithms import make_algorithm
from stalegrad.core.server import NonFiniteError, ParameterServer
from helpers import state_tensors as tensors

N = 1000   # with CHUNK = 64: 15 full chunks and a partial one


@pytest.fixture(autouse=True, params=["torch", "numba"])
def kernels(request, monkeypatch):
    """Every test here on both server paths: torch operators and the fused kernels."""
    from stalegrad.algorithms import fused
    if request.param == "numba" and fused.choose("cpu", True, "auto") != "numba":
        pytest.skip("numba is not installed (the 'fast' extra)")
    monkeypatch.setenv("STALEGRAD_KERNELS", request.param)
    return request.param


def play(algo, chunked: bool, monkeypatch, *, M=3, pushes=12, poison=None, lr=0.1, seed=0):
    """Pulls and pushes from M workers in a fixed pattern; returns the server.

    ``poison=(i, j, v)``: element j of the i-th message is v, and that push,
    if it is the last, is not followed by a pull."""
    monkeypatch.setattr(server_mod, "CHUNK", 64)
    monkeypatch.setattr(server_mod, "CHUNK_ABOVE", 128 if chunked else 10**12)
    g = torch.Generator().manual_seed(seed)
    server = ParameterServer(algo, torch.randn(N, generator=g), M)
    for m in range(M):
        server.pull(m)
    for i in range(pushes):
        m = (i * 7) % M
        msg = torch.randn(N, generator=g)
        if poison is not None and i == poison[0]:
            msg[poison[1]] = poison[2]
        server.push(m, msg, lr)
        if poison is None or i != poison[0]:
            server.pull(m)
    return server


ALGOS = [("sgd", {}, 1), ("asgd", {}, 3), ("asgd", {"momentum": 0.9, "weight_decay": 0.01}, 3),
         ("dcasgd-c", {}, 3), ("dcasgd-a", {}, 3), ("dcasgd-a", {"momentum": 0.5, "weight_decay": 1e-3}, 4),
         ("dynsgd", {}, 3), ("agn", {}, 3), ("downpour", {}, 2), ("aeasgd", {}, 3), ("ssgd", {}, 3),
         ("ssgd", {"momentum": 0.9}, 2), ("easgd", {}, 3)]


@pytest.mark.parametrize("name,params,M", ALGOS)
def test_chunked_rules_give_the_same_bits(name, params, M, monkeypatch):
    algo = make_algorithm(name, **params)
    whole = play(algo, False, monkeypatch, M=M)
    chunked = play(algo, True, monkeypatch, M=M)
    assert torch.equal(whole.w, chunked.w)
    assert whole.version == chunked.version > 0
    for a, b in zip(tensors(whole.state), tensors(chunked.state)):
        assert torch.equal(a, b)


@pytest.mark.parametrize("name", ["asgd", "dcasgd-c", "dcasgd-a", "agn"])
@pytest.mark.parametrize("where", [3, 500, N - 1])
def test_nonfinite_message_in_any_chunk_changes_nothing(name, where, monkeypatch):
    algo = make_algorithm(name)
    clean = play(algo, True, monkeypatch, pushes=6)
    for chunked in (False, True):
        bad = play(algo, chunked, monkeypatch, pushes=7, poison=(6, where, math.nan))
        assert bad.nonfinite_skipped == 1
        assert torch.equal(bad.w, clean.w)
        for a, b in zip(tensors(clean.state), tensors(bad.state)):
            assert torch.equal(a, b)


@pytest.mark.parametrize("where", [3, N - 1])
def test_nonfinite_update_in_a_late_chunk_is_not_applied_anywhere(where, monkeypatch):
    """dcasgd-c: a finite but huge gradient overflows g*g; the update is dropped whole.

    The rule's state (here DC-ASGD-a's MeanSquare) is put back as it was, the
    chunks written before the bad one included (tests/test_transactional_updates.py:
    every rule)."""
    for name in ("dcasgd-c", "dcasgd-a"):
        algo = make_algorithm(name)
        servers = [play(algo, chunked, monkeypatch, pushes=7, poison=(6, where, 3e30)) for chunked in (False, True)]
        before = play(algo, True, monkeypatch, pushes=6)
        for s in servers:
            assert s.nonfinite_skipped == 1 and s.version == 6
            assert torch.equal(s.w, before.w)
            for a, b in zip(tensors(before.state), tensors(s.state)):
                assert torch.equal(a, b)


def test_update_overflow_from_the_learning_rate_matches_float32_arithmetic():
    """delta = -lr*g is dropped exactly when the float32 product overflows."""
    g = torch.generator = torch.Generator().manual_seed(1)
    for _ in range(200):
        scale = 10.0 ** torch.empty(1).uniform_(25, 45, generator=g).item()
        lr = torch.empty(1).uniform_(0.5, 4.0, generator=g).item() * 10.0 ** torch.randint(-8, 12, (1,), generator=g).item()
        msg = torch.randn(50, generator=g) * scale
        msg = msg.clamp(-3.3e38, 3.3e38)
        server = ParameterServer(make_algorithm("asgd"), torch.zeros(50), 1)
        server.pull(0)
        applied = server.push(0, msg, lr)
        expected = bool(torch.isfinite(torch.mul(msg, -lr)).all()) and bool(torch.isfinite(msg).all())
        assert applied == expected, (scale, lr)


def test_overflowing_update_raises_under_stop():
    server = ParameterServer(make_algorithm("asgd"), torch.zeros(3), 1, on_nonfinite="stop")
    server.pull(0)
    with pytest.raises(NonFiniteError, match="update from worker 0"):
        server.push(0, torch.tensor([1.0, 3e38, 0.0]), lr=10.0)


def test_sgd_with_momentum_and_weight_decay_is_torch_sgd_bit_for_bit():
    g = torch.Generator().manual_seed(0)
    w0 = torch.randn(300, generator=g)
    server = ParameterServer(make_algorithm("sgd", momentum=0.9, weight_decay=0.01), w0, 1)
    ref = w0.clone().requires_grad_(True)
    opt = torch.optim.SGD([ref], lr=0.05, momentum=0.9, weight_decay=0.01)
    for _ in range(20):
        grad = torch.randn(300, generator=g)
        server.pull(0)
        server.push(0, grad, lr=0.05)
        ref.grad = grad.clone()
        opt.step()
    assert torch.equal(server.w, ref.detach())


def test_rules_do_not_modify_the_message(monkeypatch):
    for name, params, M in ALGOS:
        algo = make_algorithm(name, **params)
        for chunked in (False, True):
            monkeypatch.setattr(server_mod, "CHUNK", 64)
            monkeypatch.setattr(server_mod, "CHUNK_ABOVE", 128 if chunked else 10**12)
            server = ParameterServer(algo, torch.randn(N), M)
            for m in range(M):
                server.pull(m)
            server.push(0, torch.randn(N), 0.1)
            msg = torch.randn(N)
            keep = msg.clone()
            for m in range(M):
                server.push(m, msg, 0.1)
            assert torch.equal(msg, keep), name


def test_a_rule_that_is_not_elementwise_runs_on_whole_vectors(monkeypatch):
    """Only rules marked @elementwise are chunked: a subclass that overrides the rule is not."""
    from dataclasses import dataclass

    from stalegrad.algorithms import ASGD

    @dataclass(frozen=True)
    class Normalised(ASGD):
        def server_delta(self, state, w, worker, msg, tau, lr, out):
            torch.mul(msg, -lr / float(msg.norm()), out=out)   # a global reduction

    monkeypatch.setattr(server_mod, "CHUNK", 64)
    monkeypatch.setattr(server_mod, "CHUNK_ABOVE", 128)
    server = ParameterServer(Normalised(), torch.zeros(N), 1)
    server.pull(0)
    msg = torch.randn(N)
    server.push(0, msg, 1.0)
    torch.testing.assert_close(server.w, -msg / msg.norm())


def test_flat_model_gradient_with_an_unused_parameter():
    from stalegrad.core.worker import FlatModel

    class TwoHeads(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.used, self.unused = torch.nn.Linear(4, 3), torch.nn.Linear(4, 3)

        def forward(self, x):
            return self.used(x)

    model = FlatModel(TwoHeads())
    ref = copy.deepcopy(model.module)
    x, y = torch.randn(6, 4), torch.randint(0, 3, (6,))
    loss, grad = model.loss_and_grad(model.flat.clone(), x, y)
    torch.nn.functional.cross_entropy(ref(x), y).backward()
    expected = torch.cat([ref.used.weight.grad.reshape(-1), ref.used.bias.grad,
                          torch.zeros(15)])
    torch.testing.assert_close(grad, expected)
    # every parameter's .grad is a view of the flat gradient
    assert model.module.used.weight.grad.data_ptr() == grad.data_ptr()


def _reference_next(stream):
    """BatchStream.next as first written (cat of the pass's tail and a fresh shuffle, then a slice)."""
    if stream.pos + stream.batch_size > len(stream.order):
        rest = stream.order[stream.pos:]
        stream.order = torch.cat([rest, stream.pool[torch.randperm(len(stream.pool), generator=stream.rng)]])
        stream.pos = 0
    idx = stream.order[stream.pos:stream.pos + stream.batch_size]
    stream.pos += stream.batch_size
    return idx


@pytest.mark.parametrize("n,M,batch,partition", [(256, 2, 128, "shard"), (1000, 3, 7, "shard"), (50, 1, 50, "iid"),
                                                 (97, 4, 24, "shard"), (300, 2, 64, "iid")])
def test_batch_stream_gives_the_same_indices_as_before(n, M, batch, partition):
    from stalegrad.core.worker import BatchStream
    for m in range(M):
        fast = BatchStream(n, m, M, batch, partition, seed=5)
        ref = BatchStream(n, m, M, batch, partition, seed=5)
        for i in range(60):
            if i == 30 and hasattr(fast, "extend"):   # a lost worker's shard joins mid-pass
                fast.extend(torch.arange(n, n + 9))
                ref.extend(torch.arange(n, n + 9))
            assert torch.equal(fast.next(), _reference_next(ref))
