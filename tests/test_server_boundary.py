"""ParameterServer's boundary (issue 32, item 3): a wrong call is a one-line UsageError that changes nothing.

Every pull and push is checked, on both kernel paths (numba's fused kernels and torch's operators):
the message's length, shape, dtype and device against the weights', the worker id (0 <= m < M,
negative ids refused, not counted from the end), a finite rate > 0. Before issue 32 a message longer
than the weights made dcasgd-a's and gap-aware's kernels write past them (a segfault), a shorter one
was applied as a partial update and counted as a version, worker -1 was logged as -1, lr = -1 was
applied, a float64 message raised numba's multi-line TypingError and worker M a bare IndexError.

A property test drives servers of several algorithms with random wrong calls and checks that each
raises UsageError and leaves the weights, version, pulled versions, algorithm state, round and
staleness log exactly as they were (and that the server still takes a right call afterwards).
"""
import importlib.util
import math

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import stalegrad as sg
from stalegrad.errors import UsageError
from stalegrad.core.server import ParameterServer
from stalegrad.core.sharding import ShardedServer, local_shards, shard_bounds

HAS_NUMBA = importlib.util.find_spec("numba") is not None
KERNELS = ["torch", pytest.param("numba", marks=pytest.mark.skipif(not HAS_NUMBA, reason="needs numba"))]
# dcasgd-a and gap-aware have the fused kernels that wrote past the weights; asgd the one-pass torch
# rule; agn a commit rule; sasgd, dcasgd-c and dana-dc kernels of their own; ssgd a synchronous round
ALGOS = {"dcasgd-a": {}, "gap-aware": {"momentum": 0.5}, "asgd": {}, "agn": {"window": 2},
         "sasgd": {"momentum": 0.5}, "dcasgd-c": {}, "dana-dc": {}, "ssgd": {}}
N, M = 40, 3


def warmed(name: str, kernels: str) -> ParameterServer:
    """A server with a few right calls behind it, so that its state, log and round are not empty."""
    server = ParameterServer(sg.make_algorithm(name, **ALGOS[name]), torch.randn(N, generator=gen(0)), M,
                             kernels=kernels)
    for m in range(M):
        server.pull(m)
    g = gen(1)
    pushes = [0] if server.algorithm.synchronous else [0, 1, 0, 2]   # ssgd: worker 0's message waits
    for m in pushes:
        server.push(m, torch.randn(N, generator=g), 0.1)
        server.pull(m)
    return server


def gen(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def snapshot(server: ParameterServer) -> dict:
    def copy(x):
        if isinstance(x, torch.Tensor):
            return x.clone()
        if isinstance(x, dict):
            return {k: copy(v) for k, v in x.items()}
        if isinstance(x, (list, tuple)):
            return [copy(v) for v in x]
        return x
    return {"w": server.w.clone(), "version": server.version, "pulled": list(server.pulled_version),
            "workers": server.staleness.workers.tolist(), "taus": server.staleness.taus.tolist(),
            "skipped": server.nonfinite_skipped, "state": copy(server.state.to_dict()), "round": copy(server.round),
            "live": set(server.live)}


def assert_unchanged(before: dict, server: ParameterServer) -> None:
    after = snapshot(server)
    assert set(before) == set(after)
    for key in before:
        assert equal(before[key], after[key]), key


def equal(a, b) -> bool:
    if isinstance(a, torch.Tensor):
        return isinstance(b, torch.Tensor) and torch.equal(a, b)
    if isinstance(a, dict):
        return a.keys() == b.keys() and all(equal(a[k], b[k]) for k in a)
    if isinstance(a, list):
        return len(a) == len(b) and all(equal(x, y) for x, y in zip(a, b))
    return a == b


def refused(call) -> str:
    with pytest.raises(UsageError) as e:
        call()
    text = str(e.value)
    assert len(text.splitlines()) == 1, text
    return text


# ---- the probe's repro lines, one by one -------------------------------------------------------------
@pytest.mark.parametrize("kernels", KERNELS)
@pytest.mark.parametrize("name", ["dcasgd-a", "gap-aware"])
def test_a_longer_message_is_refused_not_written_past_the_weights(name, kernels):
    p = sg.ParameterServer(sg.make_algorithm(name), torch.zeros(1000), 2, kernels=kernels)
    p.pull(0)
    before = snapshot(p)
    text = refused(lambda: p.push(0, torch.ones(1100), 0.1))
    assert "1100 elements, the weights 1000" in text and "push a vector of 1000 elements" in text
    assert_unchanged(before, p)


@pytest.mark.parametrize("kernels", KERNELS)
def test_a_shorter_message_is_not_a_partial_update_counted_as_a_version(kernels):
    p = ParameterServer(sg.make_algorithm("dcasgd-a"), torch.zeros(1000), 2, kernels=kernels)
    p.pull(0)
    before = snapshot(p)
    assert "900 elements, the weights 1000" in refused(lambda: p.push(0, torch.ones(900), 0.1))
    assert_unchanged(before, p)
    assert p.version == 0 and torch.equal(p.w, torch.zeros(1000))


@pytest.mark.parametrize("kernels", KERNELS)
@pytest.mark.parametrize("worker", [-1, -2, 2, 10**9])
def test_a_worker_id_out_of_range_is_refused_on_push_and_pull(worker, kernels):
    p = ParameterServer(sg.make_algorithm("dcasgd-a"), torch.zeros(1000), 2, kernels=kernels)
    p.pull(0), p.pull(1)
    before = snapshot(p)
    text = refused(lambda: p.push(worker, torch.ones(1000), 0.1))
    assert f"worker {worker} is out of range: this server has 2 workers, ids 0 to 1" in text
    assert "ParameterServer.pull" in refused(lambda: p.pull(worker))
    assert "ParameterServer.remove_worker" in refused(lambda: p.remove_worker(worker))
    assert_unchanged(before, p)
    assert p.staleness.summary()["updates"] == 0


@pytest.mark.parametrize("kernels", KERNELS)
@pytest.mark.parametrize("lr", [-1, -0.1, 0, 0.0, -0.0, math.inf, -math.inf, math.nan, None, "0.1", True])
def test_a_rate_that_is_not_finite_and_positive_is_refused(lr, kernels):
    p = ParameterServer(sg.make_algorithm("dcasgd-a"), torch.zeros(1000), 2, kernels=kernels)
    p.pull(0)
    before = snapshot(p)
    assert "lr must be a finite number > 0" in refused(lambda: p.push(0, torch.ones(1000), lr))
    assert_unchanged(before, p)


@pytest.mark.parametrize("kernels", KERNELS)
@pytest.mark.parametrize("dtype", [torch.float64, torch.float16, torch.int32])
def test_a_message_of_another_dtype_is_refused(dtype, kernels):
    p = ParameterServer(sg.make_algorithm("dcasgd-a"), torch.zeros(1000), 2, kernels=kernels)
    p.pull(0)
    before = snapshot(p)
    text = refused(lambda: p.push(0, torch.ones(1000, dtype=dtype), 0.1))
    assert f"the message is {dtype}, the weights torch.float32" in text and "msg.to(torch.float32)" in text
    assert_unchanged(before, p)


def test_a_message_on_another_device_and_other_shapes_are_refused():
    p = ParameterServer(sg.make_algorithm("asgd"), torch.zeros(12), 2)
    p.pull(0)
    before = snapshot(p)
    assert "is on meta, the weights on cpu" in refused(lambda: p.push(0, torch.ones(12, device="meta"), 0.1))
    assert "shape (3, 4), the weights (12,)" in refused(lambda: p.push(0, torch.ones(3, 4), 0.1))
    assert "must be a torch.Tensor" in refused(lambda: p.push(0, [0.0] * 12, 0.1))
    assert "must be a torch.Tensor" in refused(lambda: p.push(0, np.zeros(12, np.float32), 0.1))
    assert "out" in refused(lambda: p.pull(0, out=torch.empty(13)))
    assert_unchanged(before, p)


def test_equivalent_right_values_are_taken():
    """A numpy integer id, an integer rate and a float64 server's float64 message are right calls."""
    p = ParameterServer(sg.make_algorithm("asgd"), torch.zeros(4, dtype=torch.float64), 2)
    p.pull(np.int64(1))
    assert p.push(np.int64(1), torch.ones(4, dtype=torch.float64), 1)
    assert torch.equal(p.w, -torch.ones(4, dtype=torch.float64))
    assert p.staleness.workers.tolist() == [1] and p.pulled_version == [0, 0]
    assert "torch.float32, the weights torch.float64" in refused(lambda: p.push(0, torch.ones(4), 0.1))


def test_a_server_of_no_workers_is_refused():
    with pytest.raises(UsageError, match="num_workers must be an integer >= 1, got 0"):
        ParameterServer(sg.make_algorithm("asgd"), torch.zeros(3), 0)


# ---- random wrong calls --------------------------------------------------------------------------------
def _wrong_rates():
    return st.one_of(st.floats(max_value=0.0), st.integers(max_value=0),
                     st.sampled_from([math.inf, -math.inf, math.nan, None, "0.1", True, False, 1j, [0.1]]))


WRONG = st.one_of(
    st.tuples(st.just("length"), st.integers(0, 3 * N).filter(lambda k: k != N)),
    st.tuples(st.just("dtype"), st.sampled_from([torch.float64, torch.float16, torch.bfloat16, torch.int32,
                                                 torch.int64, torch.bool, torch.complex64])),
    st.tuples(st.just("shape"), st.sampled_from([(N, 1), (1, N), (2, N // 2), (4, 10), ()])),
    st.tuples(st.just("device"), st.just("meta")),
    st.tuples(st.just("type"), st.sampled_from(["list", "numpy", "none", "number"])),
    st.tuples(st.just("worker"), st.one_of(st.integers(max_value=-1), st.integers(min_value=M),
                                           st.sampled_from([True, False, 1.0, None, "0", -0.5]))),
    st.tuples(st.just("lr"), _wrong_rates()),
    st.tuples(st.just("pull"), st.one_of(st.integers(max_value=-1), st.integers(min_value=M),
                                         st.sampled_from([True, 0.0, None, "1"]))),
)


def wrong_call(server: ParameterServer, how: tuple, phase: str):
    kind, value = how
    msg, worker, lr = torch.randn(N, generator=gen(5)), 1, 0.1
    if kind == "length":
        msg = torch.randn(value, generator=gen(5))
    elif kind == "dtype":
        msg = msg.to(value)
    elif kind == "shape":
        msg = torch.randn(value, generator=gen(5)) if value else torch.tensor(1.0)
    elif kind == "device":
        msg = torch.empty(N, device=value)
    elif kind == "type":
        msg = {"list": msg.tolist(), "numpy": msg.numpy(), "none": None, "number": 0.5}[value]
    elif kind == "worker":
        worker = value
    elif kind == "lr":
        lr = value
    else:
        return lambda: server.pull(value)
    if phase == "prepare":   # the shards' first phase (runtimes/ray): the same checks
        return lambda: server.prepare(worker, msg, lr, True)
    return lambda: server.push(worker, msg, lr)


@pytest.mark.parametrize("kernels", KERNELS)
@settings(max_examples=120, deadline=None)
@given(name=st.sampled_from(sorted(ALGOS)), how=WRONG, phase=st.sampled_from(["push", "prepare"]))
def test_random_wrong_calls_are_refused_and_change_nothing(kernels, name, how, phase):
    server = warmed(name, kernels)
    assert server.kernels == kernels
    before = snapshot(server)
    refused(wrong_call(server, how, phase))
    assert_unchanged(before, server)
    # and the server takes the next right call as it would have
    twin = warmed(name, kernels)
    g = torch.randn(N, generator=gen(9))
    assert server.push(1, g, 0.1) == twin.push(1, g.clone(), 0.1)
    assert torch.equal(server.w, twin.w) and server.version == twin.version


# ---- a server split into shards --------------------------------------------------------------------
@pytest.mark.parametrize("kernels", KERNELS)
def test_sharded_server_refuses_a_wrong_call_before_any_shard_sees_it(kernels):
    K = 3
    w0 = torch.randn(N, generator=gen(0))
    servers, call = local_shards(ParameterServer(sg.make_algorithm("dcasgd-a"), w0, M, kernels=kernels), K)
    bounds = shard_bounds(N, K)
    sharded = ShardedServer(call, K, M, False, sizes=[b - a for a, b in bounds])
    for m in range(M):
        sharded.pull(m)
    g = torch.randn(N, generator=gen(1))
    assert sharded.push(0, [g[a:b] for a, b in bounds], 0.1, True)
    before = [snapshot(s) for s in servers]
    version, taus, pulled = sharded.version, sharded.staleness.taus.tolist(), list(sharded.pulled_version)
    good = [g[a:b] for a, b in bounds]
    longer = good[:2] + [torch.cat([good[2], torch.ones(3)])]
    wrong = [lambda: sharded.push(-1, good, 0.1, True), lambda: sharded.push(M, good, 0.1, True),
             lambda: sharded.push(1, good, -0.1, True), lambda: sharded.push(1, good, math.nan, True),
             lambda: sharded.push(1, good[:2], 0.1, True), lambda: sharded.push(1, longer, 0.1, True),
             lambda: sharded.push(1, good[:2] + [good[2].double()], 0.1, True),
             lambda: sharded.pull(-1), lambda: sharded.remove_worker(M)]
    for call_ in wrong:
        refused(call_)
    for b, s in zip(before, servers):
        assert_unchanged(b, s)
    assert sharded.version == version and sharded.staleness.taus.tolist() == taus
    assert sharded.pulled_version == pulled and sharded.live == set(range(M))
