"""Transactional server updates (issue 43, item 2): an update that is not finite changes nothing.

For every rule, on both kernel paths (torch operators, fused numba kernels), on whole vectors and on
cache-sized chunks (the bad element in the first chunk or the last, after the others were written),
and on a server split into 3 shards: a few finite updates, a snapshot of the whole server
(``state_dict()``: weights, rule state, version, pulled versions, staleness log, the open round, held
messages; plus the count of skipped updates), then one update that is not finite (a finite but huge
message at a huge rate, so that the rule's state would overflow; or a NaN message). Every piece of
the snapshot must be unchanged, bit for bit, the skip counted; and the next finite update must give
the bits of a twin server that never saw the bad update. ``dana-dc`` with momentum 0.9 trains on
after an overflowing push on a 2M-weight server (it froze before: every later update was skipped).

An update is a push (asynchronous rules), a round (synchronous ones: every message of it huge, or a
NaN message and the rest huge), or Rennala's batch of B messages (the first huge: the step that sums
it is dropped whole, the messages held for it too).
"""
import importlib.util

import pytest
import torch

import stalegrad.core.server as server_mod
from stalegrad.algorithms import ALGORITHMS, make_algorithm
from stalegrad.core.server import NonFiniteError, ParameterServer
from stalegrad.core.sharding import ShardedServer, local_shards, merge_states, shard_bounds
from stalegrad.core.transaction import Undo
from helpers import state_tensors as tensors

N, M, BIG, BIG_LR, LR = 1000, 3, 3e38, 1e10, 0.05
KERNELS = ["torch", pytest.param("numba", marks=pytest.mark.skipif(
    importlib.util.find_spec("numba") is None, reason="numba is not installed (the 'fast' extra)"))]
# Rules whose update is the message itself: finite whenever the message is (no update of theirs overflows)
PASS_THROUGH = ("aeasgd",)
PER_SHARD = ("dcasgd-a-damped",)   # a mean over each shard's own slice: shards are not one server


def algorithm(name):
    """The rule with state to overflow: a momentum (DANA's is 0.9 anyway), weight decay, an outer Nesterov."""
    fields = {f.name for f in ALGORITHMS[name].hyperparameters()}
    params = {"window": 2} if "window" in fields else {}
    if "momentum" in fields:
        params.update(momentum=0.9, weight_decay=0.01)
    if name in ("agn", "downpour", "dynsgd"):
        params["outer_opt"] = "nesterov"
    if name == "async-local-sgd":   # (its outer step of c/N: a rate that makes one huge commit overflow)
        params.update(outer_lr=10.0, dn_c=0.2)
    return make_algorithm(name, **params)


def workers(algo):
    return 1 if algo.sequential else M


class Server:
    """One ParameterServer, or K shards behind a ShardedServer, driven alike."""

    def __init__(self, algo, kernels, shards=0, monkeypatch=None):
        w0 = torch.randn(N, generator=torch.Generator().manual_seed(0))
        self.algo, self.M = algo, workers(algo)
        if shards:
            monkeypatch.setenv("STALEGRAD_KERNELS", kernels)
            self.shards, call = local_shards(ParameterServer(algo, w0, self.M, kernels=kernels), shards)
            assert all(s.kernels == kernels for s in self.shards)
            self.sharded = ShardedServer(call, shards, self.M, algo.synchronous, algorithm=algo)
            self.bounds = shard_bounds(N, shards)
        else:
            self.one, self.shards = ParameterServer(algo, w0, self.M, kernels=kernels), None
        self.pull_all()

    def push(self, m, msg, lr):
        if self.shards is None:
            return self.one.push(m, msg, lr)
        return self.sharded.push(m, [msg[a:b] for a, b in self.bounds], lr, bool(torch.isfinite(msg).all()))

    def pull_all(self):
        for m in range(self.M):
            (self.one if self.shards is None else self.sharded).pull(m)

    @property
    def round_open(self):
        return (self.one if self.shards is None else self.sharded).round_open

    @property
    def skipped(self):
        if self.shards is None:
            return self.one.nonfinite_skipped
        counts = {s.nonfinite_skipped for s in self.shards}
        assert len(counts) == 1, counts   # every shard skipped the same updates
        return counts.pop()

    def snapshot(self):
        """The whole server's state_dict, cloned (shards: merged into one server's, and the driver's mirror)."""
        if self.shards is None:
            return clone(self.one.state_dict())
        parts = [clone(s.state_dict()) for s in self.shards]
        for p in parts[1:]:   # the bookkeeping that merge_states takes from shard 0 is every shard's
            for key in ("version", "pulled_version", "live", "staleness", "held"):
                assert_same(parts[0][key], p[key], key)
        sd = merge_states(parts, self.algo.per_element_state)
        mirror = self.sharded
        assert mirror.version == sd["version"] and [list(r) for r in mirror.held] == sd["held"]
        assert list(mirror.staleness.taus) == sd["staleness"]["taus"].tolist()
        return sd


def clone(x):
    if isinstance(x, torch.Tensor):
        return x.clone()
    if isinstance(x, dict):
        return {k: clone(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return type(x)(clone(v) for v in x)
    return x


def bits(t):
    return t.view(torch.int32) if t.dtype == torch.float32 else t


def assert_same(a, b, path="state_dict", skip=("nonfinite_skipped",)):
    """Equal bits for tensors, equal values for everything else, key by key."""
    if isinstance(a, torch.Tensor):
        assert isinstance(b, torch.Tensor) and a.dtype == b.dtype and torch.equal(bits(a), bits(b)), path
    elif isinstance(a, dict):
        assert a.keys() == b.keys(), path
        for k in a:
            if k not in skip:
                assert_same(a[k], b[k], f"{path}.{k}", skip)
    elif isinstance(a, (list, tuple)):
        assert len(a) == len(b), path
        for i, (x, y) in enumerate(zip(a, b)):
            assert_same(x, y, f"{path}[{i}]", skip)
    else:
        assert a == b, (path, a, b)


def messages(gen, k):
    return [torch.randn(N, generator=gen) * 0.1 for _ in range(k)]


def update(server: Server, msgs, lr, step) -> int:
    """One update of the rule (a push, a round, Rennala's batch), taking msgs in order; then every worker
    pulls. Returns how many messages it took."""
    algo = server.algo
    if algo.synchronous:
        for m in range(server.M):
            server.push(m, msgs[m], lr)
            if not server.round_open:
                return m + 1
        raise AssertionError("the round did not close")
    if algo.name == "rennala":
        for m in range(algo.batch(server.M)):
            server.push(m, msgs[m], lr)
        return algo.batch(server.M)
    server.push(step % server.M, msgs[0], lr)
    return 1


def bad_update(server: Server, kind: str, where: int, gen) -> int:
    """One update that is not finite; returns the skips it counts (a NaN message and an update: 2)."""
    algo = server.algo
    size = algo.batch(server.M) if algo.name == "rennala" else server.M if algo.synchronous else 1
    msgs = messages(gen, size)
    if kind == "nan":
        msgs[0][where] = float("nan")
        if not algo.synchronous:   # (Rennala too: a NaN message is dropped before the rule, nothing held)
            server.push(1 % server.M, msgs[0], LR)
            return 1
    for msg in (msgs[1:] if kind == "nan" else msgs if algo.synchronous else msgs[:1]):
        msg[where] = BIG
    if algo.synchronous:
        taken = update(server, msgs, BIG_LR, 0)
        return 2 if kind == "nan" and taken > 1 else 1
    if algo.name == "rennala":   # the first message of the batch huge: the step that sums them overflows
        update(server, msgs, BIG_LR, 0)
        return 1
    server.push(1 % server.M, msgs[0], BIG_LR)
    return 1


def history(server: Server, gen, updates=3):
    for step in range(updates):
        update(server, messages(gen, M), LR, step)
        server.pull_all()


def play_and_compare(name, kind, where, kernels, make):
    """The bad update leaves the snapshot as it was; the next update equals a twin's that never saw it."""
    algo = algorithm(name)
    if kind == "overflow" and name in PASS_THROUGH:
        pytest.skip(f"{name}'s update is the message itself: finite whenever the message is")
    server, twin = make(algo), make(algo)
    for s in (server, twin):
        history(s, torch.Generator().manual_seed(1))
    before, skipped = server.snapshot(), server.skipped
    counted = bad_update(server, kind, where, torch.Generator().manual_seed(2))
    assert server.skipped == skipped + counted
    assert_same(before, server.snapshot())
    for s in (server, twin):
        update(s, messages(torch.Generator().manual_seed(3), M), LR, 5)
        s.pull_all()
    assert server.snapshot()["version"] == twin.snapshot()["version"] == before["version"] + 1
    assert_same(twin.snapshot(), server.snapshot())


@pytest.mark.parametrize("name", list(ALGORITHMS))
@pytest.mark.parametrize("kind", ["overflow", "nan"])
@pytest.mark.parametrize("kernels", KERNELS)
@pytest.mark.parametrize("chunked,where", [(False, N - 1), (True, 3), (True, N - 1)])
def test_an_update_that_is_not_finite_changes_nothing(name, kind, kernels, chunked, where, monkeypatch):
    monkeypatch.setattr(server_mod, "CHUNK", 64)   # 15 chunks and a partial one; ``where`` in the first or the last
    monkeypatch.setattr(server_mod, "CHUNK_ABOVE", 128 if chunked else 10**12)
    play_and_compare(name, kind, where, kernels, lambda algo: Server(algo, kernels))


@pytest.mark.parametrize("name", list(ALGORITHMS))
@pytest.mark.parametrize("kind", ["overflow", "nan"])
@pytest.mark.parametrize("kernels", KERNELS)
@pytest.mark.parametrize("where", [3, N - 1])
def test_every_shard_skips_and_undoes_the_same_update(name, kind, kernels, where, monkeypatch):
    """3 shards, the bad element in the first shard's slice or the last's: the shards whose own slice was
    finite put their state back too (commit(apply=False)), so the shards equal one server, state included."""
    play_and_compare(name, kind, where, kernels, lambda algo: Server(algo, kernels, shards=3, monkeypatch=monkeypatch))
    if name in PER_SHARD:
        return
    algo = algorithm(name)
    one, sharded = Server(algo, kernels), Server(algo, kernels, shards=3, monkeypatch=monkeypatch)
    for s in (one, sharded):
        history(s, torch.Generator().manual_seed(1))
        bad_update(s, kind, where, torch.Generator().manual_seed(2))
        history(s, torch.Generator().manual_seed(4), updates=2)
    assert one.skipped == sharded.skipped
    assert one.skipped > 0 or (kind == "overflow" and name in PASS_THROUGH)
    assert_same(one.snapshot(), sharded.snapshot())


@pytest.mark.parametrize("kernels", KERNELS)
def test_dana_dc_trains_on_after_an_overflowing_push(kernels):
    """The case of the issue: dana-dc, momentum 0.9, a 2M-weight server, one push of a finite but huge gradient at
    lr 10. Before, its momentum overflowed and every later push was skipped (the weights frozen); now the push is
    skipped alone, and the rule goes on descending a quadratic 0.5*|w - target|^2."""
    n = 2_000_000
    gen = torch.Generator().manual_seed(0)
    target, w0 = torch.randn(n, generator=gen), torch.zeros(n)
    server = ParameterServer(make_algorithm("dana-dc", momentum=0.9), w0, 2, kernels=kernels)
    pulled = [server.pull(0), server.pull(1)]
    for i in range(6):
        m = i % 2
        assert server.push(m, pulled[m] - target, 0.01)
        pulled[m] = server.pull(m)
    distance = torch.dist(server.w, target).item()
    huge = pulled[0] - target
    huge[123] = 1e30
    assert not server.push(0, huge, 10.0)
    assert server.nonfinite_skipped == 1 and server.version == 6
    for i in range(30):
        m = i % 2
        assert server.push(m, pulled[m] - target, 0.01), f"push {i} after the overflow was skipped"
        pulled[m] = server.pull(m)
    assert server.nonfinite_skipped == 1 and server.version == 36
    assert torch.dist(server.w, target).item() < 0.9 * distance


@pytest.mark.parametrize("kernels", KERNELS)
@pytest.mark.parametrize("chunked", [False, True])
def test_a_finite_update_whose_state_overflows_is_skipped_too(kernels, chunked, monkeypatch):
    """DC-ASGD-a: g = 1e20 makes g*g, hence the MeanSquare, infinite, while the update stays finite (the
    Taylor term is divided by sqrt(inf)); applied, that worker's MeanSquare would stay infinite for good."""
    monkeypatch.setattr(server_mod, "CHUNK", 64)
    monkeypatch.setattr(server_mod, "CHUNK_ABOVE", 128 if chunked else 10**12)
    server = ParameterServer(make_algorithm("dcasgd-a"), torch.zeros(N), 2, kernels=kernels)
    server.pull(0), server.pull(1)
    assert server.push(0, torch.full((N,), 1e-3), 0.01)   # w moves: w - w_bak[1] is small, not zero
    before = clone(server.state_dict())
    g = torch.full((N,), 1e-3)
    g[N - 1] = 1e20
    assert not server.push(1, g, 0.01)
    assert server.nonfinite_skipped == 1
    assert_same(before, server.state_dict())


def test_under_stop_the_state_is_put_back_before_the_error():
    server = ParameterServer(algorithm("dcasgd-a"), torch.randn(N), 2, on_nonfinite="stop")
    server.pull(0), server.pull(1)
    server.push(0, torch.randn(N), LR)
    before = clone(server.state_dict())
    g = torch.randn(N)
    g[7] = BIG
    with pytest.raises(NonFiniteError, match="update from worker 1"):
        server.push(1, g, BIG_LR)
    assert_same(before, server.state_dict())


@pytest.mark.parametrize("name", list(ALGORITHMS))
@pytest.mark.parametrize("kernels", KERNELS)
def test_writes_names_every_tensor_an_update_changes(name, kernels):
    """``Algorithm.writes`` (what the server keeps before an update) covers every state tensor that a push
    (or round, or batch) changes, but those that ``drop_held`` resets after a skip (Rennala's sum: a skipped
    step drops its batch); the rest of the state is read only (w_bak, the scrambled control's signs)."""
    algo = algorithm(name)
    server = Server(algo, kernels)
    one, gen = server.one, torch.Generator().manual_seed(5)
    for step in range(7):
        for m in range(server.M):
            undo = Undo(algo, one.w).begin(one.state, None if algo.synchronous else m)
            kept = {id(t) for t, _ in undo.targets} | reset_by_drop_held(algo, one.state)
            before = [(t, t.clone()) for t in tensors(one.state)]
            update(server, messages(gen, M), LR, m) if algo.synchronous else one.push(m, messages(gen, 1)[0], LR)
            changed = [t for t, old in before if not torch.equal(bits(t), bits(old))]
            assert all(id(t) in kept for t in changed), f"{name}: a push changed a tensor it does not declare"
            if algo.synchronous:
                break
        server.pull_all()
    assert one.version > 0


def reset_by_drop_held(algo, state) -> set:
    """The ids of the state tensors that ``drop_held`` writes (found on a copy filled with ones)."""
    if not algo.drops_held:
        return set()
    copy = algo.State.from_dict(clone(state.to_dict()))
    for t in tensors(copy):
        t.fill_(1)
    algo.drop_held(copy)
    return {id(t) for t, c in zip(tensors(state), tensors(copy)) if not bool((c == 1).all())}


