"""A parameter server split into K shards, each owning one contiguous slice of the weights.

Every server rule is element-wise, so shard k runs the same ``ParameterServer``
with the same algorithm on its slice (its own per-worker snapshots, MeanSquare
and momentum of that slice) and the concatenation of the shards' weights is the
weights of one unsplit server. What must agree across shards is the version
counter, because tau = version - pulled_version[m] enters the rules (DynSGD)
and the staleness log. The design that makes it agree:

- one caller (the runtime's driver) sends every shard the same sequence of
  ``pull(m)``, ``prepare``/``commit`` and ``prepare_removal``/``commit``
  calls, and each shard executes its calls in the order they were sent (Ray
  runs one caller's calls to an actor in order);
- a push is two-phase: every shard prepares its slice's update and says
  whether it is finite (the update and the state its rule wrote); the driver
  commits with ``apply`` = "all slices are finite", so an update is applied
  everywhere or nowhere, and every shard counts the same versions (a skipped
  update counts on every shard too); a skipped update puts back the rule's
  state on every shard, the shards whose own slice was finite included
  (``core/transaction.py``), so each shard's state stays one server's slice;
- whether the *message* is finite is decided on the whole message, by its
  sender (``message_finite``), not slice by slice.

So after every call each shard holds the same version, the same
``pulled_version`` and the same staleness log, and a message sees the same tau
on every shard. A rule's admission (``Algorithm.admits``: a dropped message),
its rounds (``round_complete``) and its held messages (``server_delta``
returning ``HELD``: Rennala SGD, two-phase like an update, since the sum the
rule keeps may overflow in one shard's slice) depend only on tau, the round's
members and the calls, so every shard drops, holds and closes alike; the
driver's ``ShardedServer`` asks the same pure hooks to mirror them.
``tests/test_sharding.py`` drives K shards and one server with the same calls
and checks equal weights, versions, logs and rule state for every algorithm,
including NaN messages and updates that overflow in one shard only
(``tests/test_time_rules.py``: dropped and held messages, on random schedules;
``tests/test_transactional_updates.py``: the state after a skipped update).

``ShardedServer`` is the driver's side, independent of transport: ``call``
runs one method on every shard (in this process for tests, on Ray actors in
``runtimes/ray``).
"""
from __future__ import annotations

from typing import Callable, Sequence

import math

import torch
from torch import Tensor

from . import server_checks as check
from ..algorithms import Algorithm
from .server import ParameterServer, StalenessLog

# call(method, per-shard argument tuples) -> per-shard results
Call = Callable[[str, Sequence[tuple]], list]


def shard_bounds(n: int, shards: int) -> list[tuple[int, int]]:
    """K contiguous slices [a, b) of n elements, sizes differing by at most one."""
    if not 1 <= shards <= n:
        raise ValueError(f"cannot split {n} parameters into {shards} shards")
    q, r = divmod(n, shards)
    bounds, a = [], 0
    for k in range(shards):
        b = a + q + (1 if k < r else 0)
        bounds.append((a, b))
        a = b
    return bounds


def split_state(sd: dict, bounds: list[tuple[int, int]], per_element: tuple[str, ...]) -> list[dict]:
    """One server ``state_dict`` as K shard ``state_dict``s: the weights, the round and the rule state's
    ``per_element`` fields (``Algorithm.per_element_state``, read from the rule's declared ``State``) sliced."""
    out = []
    for a, b in bounds:
        part = dict(sd)
        part["w"] = sd["w"][a:b].clone()
        part["state"] = {k: (_slice(v, a, b) if k in per_element else v) for k, v in sd["state"].items()}
        part["round"] = {m: (None if g is None else g[a:b].clone()) for m, g in sd["round"].items()}
        out.append(part)
    return out


def merge_states(parts: list[dict], per_element: tuple[str, ...]) -> dict:
    """K shard ``state_dict``s as one server's (their bookkeeping is equal: shard 0's is taken)."""
    first = parts[0]
    merged = dict(first)
    merged["w"] = torch.cat([p["w"] for p in parts])
    merged["state"] = {k: (_cat([p["state"][k] for p in parts]) if k in per_element else v)
                       for k, v in first["state"].items()}
    merged["round"] = {m: (None if g is None else torch.cat([p["round"][m] for p in parts]))
                       for m, g in first["round"].items()}
    return merged


def _slice(v, a: int, b: int):
    if isinstance(v, Tensor):
        return v[a:b].clone()
    return [t[a:b].clone() for t in v]


def _cat(values: list):
    if isinstance(values[0], Tensor):
        return torch.cat(values)
    return [torch.cat([v[i] for v in values]) for i in range(len(values[0]))]


class ShardedServer:
    """The driver's view of K server shards: the calls of ``ParameterServer`` that a runtime makes.

    It mirrors the bookkeeping (version, pulled versions, staleness log) that
    every shard also keeps, so that a runtime knows tau without asking.

    It checks each call before any shard sees it (``server_checks``: the worker id,
    the rate, one slice per shard, and with ``sizes``, the shards' lengths, each
    tensor slice's length), so that a wrong call leaves every shard as it was; each
    shard checks its own slice's dtype and device too.
    """

    def __init__(self, call: Call, shards: int, num_workers: int, synchronous: bool,
                 sizes: Sequence[int] | None = None, algorithm: Algorithm | None = None):
        """``algorithm``: the shards' rule, whose pure hooks (``admits``, ``round_complete``) the mirror asks;
        None: a rule that takes every message and closes a round when every live worker sent."""
        self.call, self.shards, self.synchronous = call, shards, synchronous
        self.algorithm = Algorithm() if algorithm is None else algorithm
        self.num_workers = num_workers
        self.sizes = None if sizes is None else tuple(sizes)
        self.version = 0
        self.pulled_version = [0] * num_workers
        self.live = set(range(num_workers))
        self.round: dict[int, bool] = {}   # synchronous rules: this round's senders, and whether their message was finite
        self.staleness = StalenessLog(num_workers)
        self.held: list[tuple[int, int]] = []   # (worker, tau) of messages the rule holds for its next step
        self.last_dropped = False

    def pull(self, worker: int) -> list:
        """Every shard's slice of the weights for ``worker`` (what ``call`` returns: tensors or references)."""
        if worker.__class__ is not int or not 0 <= worker < self.num_workers:
            worker = check.worker_id(worker, self.num_workers, "ShardedServer.pull")
        self.pulled_version[worker] = self.version
        return self.call("pull", [(worker,)] * self.shards)

    def push(self, worker: int, slices: Sequence, lr: float, message_finite: bool) -> bool:
        """Apply one message given as its K slices; True when the weights changed."""
        if not (worker.__class__ is int and 0 <= worker < self.num_workers and lr.__class__ is float
                and 0.0 < lr < math.inf):
            worker = check.worker_id(worker, self.num_workers, "ShardedServer.push")
            lr = check.learning_rate(lr, "ShardedServer.push")
        check.slices(slices, self.shards, self.sizes, "ShardedServer.push")
        tau = self.version - self.pulled_version[worker]
        results = self.call("prepare", [(worker, s, lr, message_finite) for s in slices])
        self.last_dropped = not self.algorithm.admits(worker, tau, self.num_workers)
        if self.last_dropped:   # every shard refused it too (pending False): nothing to commit
            self.staleness.dropped[worker] += 1
            if any(bool(p) for p, _ in results):
                raise RuntimeError(f"the server shards took a message that the rule drops: {results}")
            return False
        if self.synchronous:
            self.round[worker] = bool(message_finite)
        return self._commit(results, [(worker, tau)])

    def remove_worker(self, worker: int, lr: float = 0.0) -> bool:
        worker = check.worker_id(worker, self.num_workers, "ShardedServer.remove_worker")
        self.last_dropped = False
        self.live.discard(worker)
        self.round.pop(worker, None)
        return self._commit(self.call("prepare_removal", [(worker, lr)] * self.shards), [])

    @property
    def round_open(self) -> bool:
        return bool(self.round)

    def waiting(self, worker: int) -> bool:
        """Whether ``worker``'s message sits in the open synchronous round (``ParameterServer.waiting``)."""
        return worker in self.round

    @property
    def updates_dropped(self) -> int:
        return sum(self.staleness.dropped)

    def _commit(self, results: list, records: list) -> bool:
        if self.synchronous:
            live = self.live
            if not live or not self.algorithm.round_complete(len(live.intersection(self.round)), len(live),
                                                              self.num_workers):
                records = []
            else:   # the round closes: every finite member's tau is counted from its own pull
                records = [(m, self.version - self.pulled_version[m]) for m, ok in sorted(self.round.items()) if ok]
                self.round.clear()
        pending = {bool(p) for p, _ in results}
        if len(pending) != 1:
            raise RuntimeError(f"the server shards disagree on a pending update: {results}")
        if not pending.pop():
            return False
        finite = all(bool(f) for _, f in results)
        applied = self.call("commit", [(finite,)] * self.shards)
        if len(set(applied)) != 1:
            raise RuntimeError(f"the server shards disagree on an update: {applied}")
        if applied[0]:
            if self.held and not self.synchronous:   # the held messages are logged with the step that uses them
                records, self.held = self.held + records, []
            for m, tau in records:
                self.staleness.record(m, tau)
            self.version += 1
        elif finite and not self.synchronous:   # committed, the weights unchanged: the rule holds the message
            self.held += records
        elif self.algorithm.drops_held:   # skipped: the rule dropped what it held too (Rennala's batch)
            self.held = []
        return bool(applied[0])


def local_shards(server: ParameterServer, shards: int) -> tuple[list[ParameterServer], Call]:
    """K in-process shard servers holding ``server``'s state, and a ``call`` over them."""
    n = server.w.numel()
    bounds = shard_bounds(n, shards)
    parts = split_state(server.state_dict(), bounds, server.algorithm.per_element_state)
    servers = []
    for (a, b), part in zip(bounds, parts):
        s = ParameterServer(server.algorithm, server.w[a:b], server.num_workers, on_nonfinite=server.on_nonfinite)
        s.load_state_dict(part)
        servers.append(s)

    def call(method: str, args: Sequence[tuple]) -> list:
        return [getattr(s, method)(*a) for s, a in zip(servers, args)]
    return servers, call
