"""The deterministic simulator of asynchronous training (``--runtime sim``).

One process plays M workers against a virtual clock (``events.EventLoop``),
replays a recorded trace (``events.Replay``), or batches the gradients of
waiting workers (``vectorised.VectorisedLoop``). All randomness (delays, data
order, initial weights) comes from the seed, so a seed fixes the final
``weights_sha256``.
"""
from __future__ import annotations

import random
import warnings
from contextlib import contextmanager
from dataclasses import dataclass

from ..core.delays import DEFAULT_DELAY, DelayModel, Trace, check_clock, deprecation, parse_delay, renamed_delay
from ..errors import ConfigError, check_finite_positive
from .base import Training
from .events import EventLoop, Replay


PULLS = ("with-push", "separate")


@dataclass
class Simulator:
    """The simulated runtime: one process plays the M workers on a virtual clock, each message at the time its
    worker's speed profile says it finishes, so that a seed fixes the run to the bit (``docs/simulator.md``).

    ``delay``: the speed profile, a ``DelayModel`` or its name (``parse_delay``; default "gamma:2", and
    "round-robin", "straggler:K", "trace:FILE", ...: ``docs/delays.md``); ``step_time``: virtual seconds of one
    local step of a speed-1 worker (default 1.0); ``message_time``: median virtual seconds of a message's
    transport, exponential (default 0.0: none); ``pull``: "with-push" (default: the weights come back with the
    push) or "separate" (a second request, one transport later; needs ``message_time``); ``vectorised``: the
    waiting workers' gradients in one batched call (default False; the same run within float rounding, faster
    for many workers); ``threads``: torch's intra-op threads (default None: the fastest count, measured)."""
    delay: str | DelayModel = DEFAULT_DELAY   # docs/delays.md: measured, not round-robin lockstep
    step_time: float = 1.0   # virtual seconds of one local step of a speed-1 worker
    message_time: float = 0.0  # median virtual seconds of a message's transport (exponential): a real run's
    pull: str = "with-push"    # "with-push": the weights come back with the push; "separate": a second request
    vectorised: bool = False  # batch the gradients of workers whose pushes fall due together
    threads: int | None = None  # torch's intra-op threads; None: measured (numerics.ThreadGovernor)
    supports_probes = True    # calls training.probes.observe (stalegrad/core/prober.py) with every message
    supports_stops = True     # stops a computing worker when the rule says so (Algorithm.stop_threshold)
    _governor = None          # inside numerics(): the ThreadGovernor

    def __post_init__(self):
        check_finite_positive("step_time", self.step_time)
        check_finite_positive("message_time", self.message_time, strict=False)
        if self.pull not in PULLS:
            raise ConfigError("pull", f"must be one of {', '.join(PULLS)}, got {self.pull!r}")
        if self.pull != "with-push" and not self.message_time:
            raise ConfigError("pull", "separate makes a pull come a message's transport after its push: give "
                                      "the transport with message_time")
        if not isinstance(self.delay, (str, DelayModel)):
            raise ConfigError("delay", f"must be a delay model or its name, not {type(self.delay).__name__}")
        if renamed_delay(self.delay) is not None:   # 'uniform': once here, then under its new name
            warnings.warn(deprecation(self.delay), DeprecationWarning, stacklevel=3)
            self.delay = renamed_delay(self.delay)
        if not isinstance(self.vectorised, bool):
            raise ConfigError("vectorised", f"must be True or False, got {self.vectorised!r}")
        if self.threads is not None and (not isinstance(self.threads, int) or isinstance(self.threads, bool)
                                         or not 1 <= self.threads <= 1024):
            raise ConfigError("threads", f"must be an integer from 1 to 1024 (torch's threads; leave it unset to let "
                                         f"the simulator measure which count is faster), got {self.threads!r}")

    @contextmanager
    def numerics(self):
        """The whole run computes in here: bits independent of the thread count (``stalegrad.numerics``);
        yields what config.json records of it."""
        from .. import numerics
        with numerics.pinned(self.threads) as governor:
            self._governor = governor
            try:
                yield numerics.describe(governor)
            finally:
                self._governor = None

    def check(self, config) -> None:
        """Refuse a delay model that does not fit the run (before anything runs)."""
        delay = parse_delay(self.delay, config.workers) if isinstance(self.delay, str) else self.delay
        check_clock(delay, self.step_time, config.algorithm.steps_per_message, config.workers)
        algo = config.algorithm
        if isinstance(delay, Trace) and not algo.synchronous and algo.stop_threshold(config.workers) is not None:
            raise ConfigError("stops", "is on, but a trace replay pulls at the recorded versions and cannot stop a "
                                       "worker; give stops off (late messages are then dropped), or another delay")

    def describe(self) -> dict:
        spec = self.delay if isinstance(self.delay, str) else self.delay.spec
        out = {"name": "sim", "delay": spec, "step_time": self.step_time, "vectorised": self.vectorised,
               "threads": self.threads}
        if self.message_time:   # (only when given: what a run records is otherwise unchanged)
            out.update(message_time=self.message_time, pull=self.pull)
        return out

    def _agree_threads(self, training: Training) -> None:
        """Run only at thread counts that give one thread's bits for this model and these shapes."""
        import copy

        import torch

        from .. import numerics
        from ..core.worker import FlatModel
        governor, factory = self._governor, training.worker_factory
        if factory.model is None or factory.model.flat.device.type != "cpu" or governor.candidates == [1]:
            return
        model = FlatModel(copy.deepcopy(factory.model.module))
        gen = torch.Generator().manual_seed(0)
        shape = tuple(factory.x.shape[1:])
        classes = int(factory.y.max()) + 1
        x = torch.randn((factory.batch_size, *shape), generator=gen).to(factory.x.dtype)
        y = torch.randint(0, classes, (factory.batch_size,), generator=gen)
        n_test = len(training.test_data.y)
        # the evaluation's chunks of 1000 and the test set's last one; a last chunk of 1 to 8 (the validation
        # set's, whose size a runtime does not see) is where the tiny-output products are
        sizes = sorted({min(1000, n_test), n_test % 1000, *range(1, 9)} - {0})
        inputs = [torch.randn((k, *shape), generator=gen).to(factory.x.dtype) for k in sizes]
        w = factory.w0.clone()

        def step():
            with torch.random.fork_rng():
                torch.manual_seed(0)
                loss, grad = model.loss_and_grad(w, x, y)
                out = [torch.tensor(loss), grad.clone()]
                model.module.eval()
                with torch.no_grad():
                    out += [model.predict(chunk) for chunk in inputs]
            return out

        agree = numerics.agreeing_counts(step, governor.candidates)
        changing = sorted(set(governor.candidates) - set(agree))
        if changing:
            text = (f"threads: {', '.join(map(str, changing))} would change "
                    f"this run's bits (a kernel of torch's that splits a sum by thread at these shapes, e.g. a "
                    f"batch of {factory.batch_size}); ran at {', '.join(map(str, agree))}")
            training.note(text)
            numerics.warn(text)
            governor.restrict(agree)

    def run(self, training: Training, *, seed: int = 0, resume: dict | None = None) -> None:
        """Drive ``training`` to its sample budget; ``resume`` is the state a checkpoint saved."""
        M = training.server.num_workers
        delay = self.delay if isinstance(self.delay, DelayModel) else parse_delay(self.delay, M)
        rng = random.Random(seed)
        loop = None
        if self.vectorised:
            from .vectorised import VectorisedLoop, unsupported   # torch.func: only when asked for
            why = unsupported(training, delay, resume) or (
                "a message's transport (message_time) is drawn one message at a time" if self.message_time else None)
            if why is None:
                loop = VectorisedLoop(training, delay, self.step_time, rng)
            else:
                training.note(f"vectorised simulation not used: {why}; the workers ran one at a time")
        if loop is None and isinstance(delay, Trace) and not training.server.algorithm.synchronous:
            loop = Replay(training, delay, self.step_time)
        elif loop is None:
            loop = EventLoop(training, delay, self.step_time, rng)
        if isinstance(loop, EventLoop):
            loop.message_time, loop.pull = self.message_time, self.pull
        elif self.message_time:
            training.note("message_time not used: a trace replay pulls at the recorded versions and times")
        if self._governor is not None:
            self._agree_threads(training)
            loop.pace = self._governor.tick
        if resume is None:
            loop.begin()
        else:
            loop.load_state_dict(resume)
        loop.run()
        if self._governor is not None:
            training.note(threads_used={str(n): k for n, k in sorted(self._governor.messages.items())})
