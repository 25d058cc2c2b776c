"""A checkpoint of the local runtime as a consistent cut (a mixin of ``session.Session``).

Each worker is held after its next push (workers parked in a synchronous round at once) and reports its
``Worker.state_dict()``; when every live worker is held, the server saves the run with their states, then
lets them go on (at the end of the budget they stay held until they are stopped).
"""
from __future__ import annotations

from .protocol import OK, STATE


class ConsistentCut:
    """The session's checkpoint methods; the session holds ``holding``, ``states``, ``asked`` and
    ``final_saved``, and its ``send``, ``serve`` and ``release``."""

    def final_gathering(self) -> bool:
        return self.holding is not None and self.training.done

    def hold(self, m: int) -> None:
        """Worker m, between two messages, waits; it reports its state."""
        if m not in self.holding:
            self.holding.append(m)
        self.asked[m] += 1
        self.send(m, (STATE,))

    def maybe_checkpoint(self) -> None:
        """Once every live worker is held between two messages, save; then let them go on
        (unless the budget is spent: they stay held until they are stopped)."""
        if self.holding is None or not self.live or not self.live.issubset(self.states):
            return
        training = self.training
        self.evaluator.drain()              # the metrics so far belong in the checkpoint
        if self.bn_model.numel:             # and the workers' running statistics
            self.bn_model.read(self.bn)
        training.save_checkpoint({"kind": "local", "now": self.now(), "samples": self.samples,
                                  "workers": [self.states.get(m) for m in range(self.M)]})
        held, self.holding, self.states = self.holding, None, {}
        if training.done:
            self.final_saved = True
            return
        if self.algo.synchronous:           # a round is open only if a worker died in it
            self.parked.extend(held)
            self.release()
        else:
            for p in held:
                if p in self.live:
                    self.send(p, (OK, training.lr))

    def final_checkpoint(self) -> None:
        """Gather the workers' states once more at the end, and save them."""
        if self.holding is None:   # e.g. resumed at the budget: the workers hold when they are ready
            self.holding, parked, self.parked = [], self.parked, []
            for p in parked:
                if p in self.live:
                    self.hold(p)
        self.serve(lambda: self.final_saved)
