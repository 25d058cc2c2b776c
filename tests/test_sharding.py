"""A server split into K shards equals one server: weights, versions, tau, skipped updates.

The same random sequence of pulls and pushes (with NaN messages, and updates
that overflow in one shard's slice only) goes to one ParameterServer and to a
ShardedServer over K in-process shards; every algorithm, synchronous ones
with a worker removed mid-round included. A skipped update leaves every rule's
state as it was on every shard (tests/test_transactional_updates.py), so the
shards' state is one server's too, and rules with a momentum (DANA) train on
after an update that overflows.
"""
import random

import pytest
import torch

from stalegrad.algorithms import ALGORITHMS, make_algorithm
from stalegrad.core.server import ParameterServer
from stalegrad.core.sharding import ShardedServer, local_shards, merge_states, shard_bounds, split_state

M, N = 3, 50
# Rules that are not element-wise by design: each shard computes its own reduction over its slice.
PER_SHARD = ("dcasgd-a-damped",)


def algorithm(name):
    params = {"window": 2} if "window" in {f.name for f in ALGORITHMS[name].hyperparameters()} else {}
    if name in ("asgd", "dcasgd-c", "dcasgd-a", "ssgd", "sasgd", "gap-aware"):
        params.update(weight_decay=0.01)
    return make_algorithm(name, **params)


def message(rng: random.Random, kind: str) -> torch.Tensor:
    g = torch.randn(N, generator=torch.Generator().manual_seed(rng.randrange(2**31)))
    if kind == "nan":
        g[rng.randrange(N)] = float("nan")
    elif kind == "overflow":          # finite, but its update overflows float32 in the last shard's slice only
        g[N - 1] = 1e20               # (lr * g with lr = 1e19; g*g in the DC-ASGD term)
    return g


def check_equal(one: ParameterServer, shards: list, sharded: ShardedServer):
    assert torch.equal(torch.cat([s.w for s in shards]), one.w)
    for s in shards:
        assert s.version == one.version and s.pulled_version == one.pulled_version
        assert list(s.staleness.taus) == list(one.staleness.taus)
        assert list(s.staleness.workers) == list(one.staleness.workers)
        assert s.nonfinite_skipped == one.nonfinite_skipped
    assert sharded.version == one.version
    assert list(sharded.staleness.taus) == list(one.staleness.taus)
    assert list(sharded.staleness.workers) == list(one.staleness.workers)


@pytest.mark.parametrize("shards", [1, 3])
@pytest.mark.parametrize("name", [n for n in ALGORITHMS if n != "sgd"])
def test_shards_equal_one_server(name, shards):
    if name in PER_SHARD and shards > 1:
        pytest.skip("a mean over each shard's own weights, documented: tests/test_controls_redrawn_damped.py")
    algo = algorithm(name)
    w0 = torch.randn(N, generator=torch.Generator().manual_seed(0))
    one = ParameterServer(algo, w0, M)
    servers, call = local_shards(ParameterServer(algo, w0, M), shards)
    sharded = ShardedServer(call, shards, M, algo.synchronous, algorithm=algo)
    bounds = shard_bounds(N, shards)
    rng = random.Random(name)
    pushed_this_round: set[int] = set()
    live = set(range(M))
    for m in range(M):
        one.pull(m)
        sharded.pull(m)
    for step in range(120):
        m = rng.choice(sorted(live - pushed_this_round) if algo.synchronous else sorted(live))
        kind = rng.choices(["ok", "nan", "overflow"], [16, 1, 1])[0]
        g = message(rng, kind)
        lr = 1e19 if kind == "overflow" else 0.05
        a = one.push(m, g, lr)
        b = sharded.push(m, [g[x:y] for x, y in bounds], lr, bool(torch.isfinite(g).all()))
        assert a == b
        if algo.synchronous:
            pushed_this_round.add(m)
            if not one.round_open:
                pushed_this_round.clear()
                for k in live:
                    one.pull(k)
                    sharded.pull(k)
            if step == 60 and len(live) > 1:     # a worker is lost mid-round
                gone = next(iter(live - pushed_this_round), None)
                if gone is not None:
                    live.discard(gone)
                    assert one.remove_worker(gone, lr) == sharded.remove_worker(gone, lr)
                    if not one.round_open:
                        pushed_this_round.clear()
                        for k in live:
                            one.pull(k)
                            sharded.pull(k)
        else:
            one.pull(m)
            sharded.pull(m)
        check_equal(one, servers, sharded)
    per_update = algo.batch(M) if name == "rennala" else 1   # (rennala: B messages an update)
    assert one.nonfinite_skipped > 0 and one.version > (20 if algo.synchronous else 60 // per_update)
    merged = merge_states([s.state_dict() for s in servers], algo.per_element_state)["state"]
    for key, value in one.state.to_dict().items():   # the rule's state too: skipped updates put back on every shard
        ours, theirs = (v if isinstance(v, list) else [v] for v in (value, merged[key]))
        assert len(ours) == len(theirs), key
        for a, b in zip(ours, theirs):
            assert torch.equal(a, b) if isinstance(a, torch.Tensor) else a == b, key


def test_state_splits_and_merges_back():
    algo = make_algorithm("dcasgd-a", momentum=0.9)
    server = ParameterServer(algo, torch.randn(N), M)
    for m in range(M):
        server.pull(m)
        server.push(m, torch.randn(N), 0.1)
    sd = server.state_dict()
    bounds = shard_bounds(N, 4)
    assert bounds[0] == (0, 13) and bounds[-1] == (38, 50) and sum(b - a for a, b in bounds) == N
    merged = merge_states(split_state(sd, bounds, algo.per_element_state), algo.per_element_state)
    assert torch.equal(merged["w"], sd["w"]) and merged["version"] == sd["version"]
    for key in ("w_bak", "mean_square"):
        assert all(torch.equal(x, y) for x, y in zip(merged["state"][key], sd["state"][key]))
    assert torch.equal(merged["state"]["momentum_buffer"], sd["state"]["momentum_buffer"])
    with pytest.raises(ValueError, match="cannot split 3 parameters into 4 shards"):
        shard_bounds(3, 4)
