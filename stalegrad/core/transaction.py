"""A server update applied whole or not at all, the rule's state included.

A rule computes its update and writes its state in one call (``server_delta``, ``round_delta``,
``fused_apply``), before the server knows whether the update is finite. So the server keeps, before the
call, what the call may change: the state's scalars (a shallow copy of the state's fields: DANA's last
rate, Gap-Aware's counts, async-local-sgd's update count, Rennala's gathered count) and the old values of
the tensors the rule says it writes (``Algorithm.writes``, fields of the rule's declared ``State``: the
momentum buffer, the pushing worker's MeanSquare, ...). An update whose amount, or whose written state, is
not finite puts all of it back (and the weights, where a fused kernel had added the update already):
weights, state, version, counters and the staleness log are as if the message had never come, so the
next update gives the bits of a server that never saw it. A server split into shards commits or undoes
every update on every shard together (``commit(apply)``), so each shard's state is that of one server's
slice. Rennala's update is the step on a batch of held messages: a skipped step drops the batch whole
(``Algorithm.drops_held``), since the message that overflowed its sum would overflow the next step too;
the state is then as before the batch.

Where the old values come from, the cheapest way each path allows:

- a fused kernel keeps them itself, in the loop that writes them (``keep``: one store more per written
  element, no pass of its own);
- a rule on cache-sized chunks: each chunk's slice is copied just before the rule runs on it (in cache);
- a rule on whole vectors: one copy of each written tensor before the call.

A rule that writes no tensor (asgd, agn, dynsgd, aeasgd, easgd, sasgd without momentum) pays only the
shallow copy of its state's fields. Which written tensors are checked: each float tensor the rule wrote that
is not the update's own tensor (a momentum buffer returned as the step is checked as the step).
"""
from __future__ import annotations

import math
from typing import NamedTuple

from torch import Tensor

from ..algorithms.state import RuleState


class Pending(NamedTuple):
    """An update between ``ParameterServer.prepare`` and ``commit``."""
    steps: list | None   # (a, b, t, s): add s*t to w[a:b] (a None: to all of w); None: the rule holds the message
    finite: bool         # whether the update, and the state it wrote, is finite
    what: str            # the update, in words, for the non-finite count's error
    records: list        # (worker, tau) of each message the update applies, for the staleness log
    undo: "Undo"         # what puts the update back


class Undo:
    """The old values of what one server update may write, for one server (one update at a time)."""

    def __init__(self, algorithm, w: Tensor):
        self.algorithm = algorithm
        self.shape = w.shape
        self.buffers: dict = {}          # (key, index) -> a tensor like the state's, reused from update to update
        self.fits: dict = {}             # (key, index, id(t)) -> (t, its buffer): t known to fit that buffer
        self.state: RuleState | None = None
        self.fields: dict = {}           # the state's fields before the update (its scalars' old values)
        self.targets: list[tuple[Tensor, Tensor]] = []   # (a tensor the update writes, where its old values are)
        self.keys: dict[str, Tensor] = {}   # key -> old-value buffer, for a fused kernel (one tensor per key)
        self.keyed = True                # whether ``keys`` holds every target (else ``keep`` copies the rest)
        self.weights = None              # (w, old w): a fused kernel added the update to w already
        self.upto = 0                    # old values kept of elements [0, upto) of each target shaped like w

    def begin(self, state: RuleState, worker: int | None) -> "Undo":
        """Start an update of ``worker``'s push (None: a round): nothing is copied yet."""
        if state is not self.state:   # (a loaded state: forget the tensors known, hold none of them)
            self.fits.clear()
        self.state, self.fields, self.weights, self.upto = state, dict(vars(state)), None, 0
        declared = self.algorithm.writes(state, worker)
        targets, keys = [], {}
        for key in (self.fields if declared is None else declared):
            value = getattr(state, key)   # (a name State does not declare: an AttributeError, not a tensor left out)
            if isinstance(value, Tensor):
                targets.append((value, self._buffer(key, None, value)))
                keys[key] = targets[-1][1]
            elif isinstance(value, (list, tuple)):
                if worker is None or declared is None:   # a round, or a rule that did not say: every worker's
                    targets += [(t, self._buffer(key, i, t)) for i, t in enumerate(value) if isinstance(t, Tensor)]
                elif isinstance(value[worker], Tensor):   # the pushing worker's (one buffer for any worker's)
                    targets.append((value[worker], self._buffer(key, -1, value[worker])))
                    keys[key] = targets[-1][1]
        # a fused kernel keeps the old values of the keys a rule declared itself; any other target is copied
        self.keys = keys if declared is not None else {}
        self.targets, self.keyed = targets, len(self.keys) == len(targets)
        return self

    def _buffer(self, key: str, index, t: Tensor) -> Tensor:
        fit = self.fits.get((key, index, id(t)))
        if fit is not None and fit[0] is t:
            return fit[1]
        old = self.buffers.get((key, index))
        if old is None or old.shape != t.shape or old.dtype != t.dtype or old.device != t.device:
            old = self.buffers[(key, index)] = t.new_empty(t.shape)
            self.fits = {k: v for k, v in self.fits.items() if k[:2] != (key, index)}
        self.fits[(key, index, id(t))] = (t, old)
        return old

    def save(self, a: int = 0, b: int | None = None) -> None:
        """Copy the old values: of elements [a, b) of each target shaped like w (a chunk, about to be
        written), or, ``b`` None, of every target whole. A target not shaped like w is copied whole at a = 0."""
        for t, old in self.targets:
            if b is None or t.shape != self.shape:
                if a == 0:
                    old.copy_(t)
            else:
                old[a:b].copy_(t[a:b])
        self.upto = math.inf if b is None else b

    def keep(self, w: Tensor, old_w: Tensor) -> dict[str, Tensor]:
        """For a fused kernel, which adds to ``w`` in place (keeping it in ``old_w``) and writes the old
        values of each state tensor it writes into ``keep[key]``: the buffers by key (any other target,
        of a rule that did not say what it writes, is copied here)."""
        if not self.keyed:
            handed = {id(old) for old in self.keys.values()}
            for t, old in self.targets:
                if id(old) not in handed:
                    old.copy_(t)
        self.weights, self.upto = (w, old_w), math.inf
        return self.keys

    def state_finite(self, step: Tensor | None, extremes, a: int | None = None, b: int | None = None) -> bool:
        """Whether every float tensor the update wrote (elements [a, b)) is finite; ``step``, the update's own
        tensor, checked already as the update, is skipped. ``extremes(t)``: t's (min, max), NaN propagating."""
        for t, _ in self.targets:
            if not t.is_floating_point():
                continue   # (the redrawn control's integer sign keys)
            if a is not None and t.shape == self.shape:
                t = t[a:b]
            if step is not None and step.data_ptr() == t.data_ptr() and step.numel() == t.numel():
                continue
            lo, hi = extremes(t)
            if not (math.isfinite(lo) and math.isfinite(hi)):
                return False
        return True

    def restore(self) -> bool:
        """Put back what the update changed: the written tensors (the elements saved), the state's scalars
        (the state object itself is kept: whoever holds it sees the old values), and the weights a kernel changed.
        True when the rule then dropped the messages it held for its step (``Algorithm.drops_held``)."""
        for t, old in self.targets:
            if self.upto == math.inf or t.shape != self.shape:
                t.copy_(old)
            elif self.upto:
                t[:self.upto].copy_(old[:self.upto])
        vars(self.state).update(self.fields)
        if self.weights is not None:
            self.weights[0].copy_(self.weights[1])
        if self.algorithm.drops_held:
            self.algorithm.drop_held(self.state)
        return self.algorithm.drops_held

