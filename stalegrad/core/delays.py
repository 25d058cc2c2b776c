"""Speed profiles (delay models): how long each worker's steps take.

A model gives the duration of one message of a worker, ``duration(worker, rng, now, base)``: ``base`` is
``step_time`` x the message's local steps, ``now`` the second the message starts at. The simulator reads it
as its virtual clock; the local and Ray runtimes make it real (``core/pacing.py``: a worker waits out the drawn
time beyond its measured compute), so one profile is one cluster in every runtime. Three kinds:

- constant per worker: ``heterogeneous:sqrt|linear``, ``straggler:K``, ``round-robin``;
- random per message: ``exponential``, ``gamma:SHAPE``, the heavy-tailed ``lognormal:SIGMA``;
- changing in time: ``slowdown:K@T`` (the last worker K times slower from second T), ``pause:D@T`` (the last
  worker stops for D seconds at second T);

and ``trace:FILE``, a recorded run. All randomness comes from the ``random.Random`` the caller passes in, so a
seed fixes the whole schedule.
"""
from __future__ import annotations

import math
import random
import warnings
from dataclasses import dataclass, field
from pathlib import Path

from ..errors import ConfigError
from . import traces
from .traces import TRACE_COLUMNS, write_trace   # noqa: F401 (their home before 0.5)


DELAY_MODELS = ("exponential", "gamma:SHAPE", "lognormal:SIGMA", "heterogeneous:sqrt|linear", "straggler:K",
                "slowdown:K@T", "pause:D@T", "round-robin", "trace:FILE")
# The simulator's default (Simulator, the CLI, TOML, grids): docs/delays.md has the traces it was chosen from.
DEFAULT_DELAY = "gamma:2"
# The parameters a model accepts, checked when the spec is parsed (``parse_delay``: the CLI, TOML files, grids'
# dry runs and ``Simulator.check`` all go through it), so that every draw takes bounded time and means a compute
# time:
# - gamma SHAPE in [0.01, 1e6]. random.gammavariate computes sqrt(2*SHAPE - 1): past 8.99e307 that overflows and it
#   loops forever (gamma:1e308 hung a run). Long before, the model stops meaning anything: at 1e6 the step times
#   vary by 0.1% (coefficient of variation 1/sqrt(SHAPE)), equal speeds for any purpose (use round-robin); below
#   0.01 a growing share of the draws underflows to exactly 0 (about e^(-744*SHAPE) of them: half at 0.001, and
#   NaN below 1e-308, where 1/SHAPE overflows), the rest spread over 40/SHAPE mean steps. The measured clusters of
#   docs/delays.md fit SHAPE 1.5 to 4.
# - straggler K in [1, 1e12]: the last worker is K times slower. Below 1 it would be the fastest, and a tiny K stops
#   the virtual clock (now + K*step_time == now); past 1e12 it never pushes in any run this simulator can make
#   (check_clock bounds the clock's overflow besides).
# exponential, round-robin and heterogeneous take no number; a trace's worker ids are checked in read_trace.
# - lognormal SIGMA in [0.01, 3]: exp(SIGMA*Z - SIGMA^2/2), mean 1, the heavy tail of shared clusters (a few steps
#   many times the median). At 3 the median step is 0.011 of the mean and one in 1000 is 60 times it; past that
#   almost all the time is in a handful of draws.
# - slowdown K in [1, 1e12] (as straggler's K), from second T in [0, 1e12]; pause D and T in [0, 1e12] seconds.
GAMMA_SHAPES = (0.01, 1e6)
STRAGGLER_SLOWDOWNS = (1.0, 1e12)
LOGNORMAL_SIGMAS = (0.01, 3.0)
SECONDS = (0.0, 1e12)
# Old names, accepted for one release with a one-line deprecation message: old -> new.
RENAMED_DELAYS = {"uniform": "round-robin"}


def renamed_delay(spec) -> str | None:
    """The new name of a deprecated delay spec (``uniform``), else None."""
    return RENAMED_DELAYS.get(spec) if isinstance(spec, str) else None


def deprecation(old: str) -> str:
    """The one-line message of a deprecated delay name."""
    return f"delay {old!r} is now called {RENAMED_DELAYS[old]!r} (the old name goes in the next release)"


class DelayModel:
    spec = ""

    def factor(self, worker: int, rng: random.Random) -> float:
        """The message's duration in units of ``base`` (one draw for the random models)."""
        raise NotImplementedError

    def duration(self, worker: int, rng: random.Random, now: float, base: float) -> float:
        """Seconds that a message of ``worker`` starting at second ``now`` takes, ``base`` being step_time x
        its local steps. Models that change in time override it; the others scale ``base``."""
        return base * self.factor(worker, rng)

    def longest(self, num_workers: int) -> float:
        """A bound on ``factor`` (for the random models, one no draw exceeds in practice: e^-40)."""
        return 1.0

    def fastest(self, worker: int) -> float:
        """The smallest mean ``factor`` of ``worker`` at any time (1 for the random models, whose mean is 1):
        what the local and Ray runtimes size an automatic step time by."""
        return 1.0


@dataclass
class RoundRobin(DelayModel):
    """Equal speeds: the workers push in a fixed cycle, in lockstep, staleness exactly M-1 once warm.
    A stress test: no real cluster keeps that order (docs/delays.md)."""
    spec: str = "round-robin"

    def factor(self, worker, rng):
        return 1.0


Uniform = RoundRobin   # its name before 0.4


@dataclass
class Gamma(DelayModel):
    """i.i.d. compute times, Gamma(shape, 1/shape): mean 1, variance 1/shape."""
    shape: float = 1.0
    spec: str = ""

    def __post_init__(self):   # a Gamma built in Python is held to the bounds of a parsed one
        _check_bounds(self.shape, self.spec or f"gamma:{self.shape!r}", "SHAPE", GAMMA_SHAPES)

    def factor(self, worker, rng):
        return rng.gammavariate(self.shape, 1.0 / self.shape)

    def longest(self, num_workers):
        return 40.0 * max(1.0, 1.0 / self.shape) if self.shape > 0 else math.inf


@dataclass
class Exponential(DelayModel):
    """i.i.d. exponential compute times with mean 1 (memoryless)."""
    spec: str = "exponential"

    def factor(self, worker, rng):
        return rng.expovariate(1.0)

    def longest(self, num_workers):
        return 40.0


@dataclass
class Heterogeneous(DelayModel):
    """Fixed per-worker step times: worker i (1-based) takes sqrt(i) or i."""
    kind: str = "sqrt"
    spec: str = ""

    def factor(self, worker, rng):
        i = worker + 1
        return math.sqrt(i) if self.kind == "sqrt" else float(i)

    def longest(self, num_workers):
        return self.factor(num_workers - 1, None)

    def fastest(self, worker):
        return self.factor(worker, None)


@dataclass
class Straggler(DelayModel):
    """Equal speeds except the last worker, ``slowdown`` times slower."""
    slowdown: float = 10.0
    num_workers: int = 1
    spec: str = ""

    def __post_init__(self):
        _check_bounds(self.slowdown, self.spec or f"straggler:{self.slowdown!r}", "K", STRAGGLER_SLOWDOWNS)

    def factor(self, worker, rng):
        return self.slowdown if worker == self.num_workers - 1 else 1.0

    def longest(self, num_workers):
        return max(1.0, self.slowdown)

    def fastest(self, worker):
        return self.factor(worker, None)


@dataclass
class LogNormal(DelayModel):
    """i.i.d. heavy-tailed compute times, exp(sigma*Z - sigma^2/2) with Z standard normal: mean 1, median
    exp(-sigma^2/2); the tail of shared machines, where a few steps take many times the median."""
    sigma: float = 1.0
    spec: str = ""

    def __post_init__(self):
        _check_bounds(self.sigma, self.spec or f"lognormal:{self.sigma!r}", "SIGMA", LOGNORMAL_SIGMAS)

    def factor(self, worker, rng):
        return rng.lognormvariate(-0.5 * self.sigma ** 2, self.sigma)

    def longest(self, num_workers):
        return math.exp(-0.5 * self.sigma ** 2 + 9.0 * self.sigma)   # 9 standard deviations: e^-40 of the draws


@dataclass
class Slowdown(DelayModel):
    """Equal speeds until second ``at``; from then on the last worker is ``slowdown`` times slower (a
    machine that another job starts sharing). The factor is the one at the message's start."""
    slowdown: float = 10.0
    at: float = 0.0
    num_workers: int = 1
    spec: str = ""

    def __post_init__(self):
        shown = self.spec or f"slowdown:{self.slowdown!r}@{self.at!r}"
        _check_bounds(self.slowdown, shown, "K", STRAGGLER_SLOWDOWNS)
        _check_bounds(self.at, shown, "T", SECONDS)

    def factor(self, worker, rng):   # (after the change; duration() is what the runtimes read)
        return self.slowdown if worker == self.num_workers - 1 else 1.0

    def duration(self, worker, rng, now, base):
        return base * self.slowdown if worker == self.num_workers - 1 and now >= self.at else base

    def longest(self, num_workers):
        return max(1.0, self.slowdown)


@dataclass
class Pause(DelayModel):
    """Equal speeds, except that the last worker stops for ``seconds`` at second ``at`` (a pre-empted or
    swapping machine): a message under way at ``at`` ends ``seconds`` later, one that would start during the
    pause starts when it ends."""
    seconds: float = 10.0
    at: float = 0.0
    num_workers: int = 1
    spec: str = ""

    def __post_init__(self):
        shown = self.spec or f"pause:{self.seconds!r}@{self.at!r}"
        _check_bounds(self.seconds, shown, "D", SECONDS)
        _check_bounds(self.at, shown, "T", SECONDS)

    def factor(self, worker, rng):
        return 1.0

    def duration(self, worker, rng, now, base):
        end = self.at + self.seconds
        if worker == self.num_workers - 1 and now < end and now + base > self.at:
            return base + end - max(now, self.at)
        return base

    def longest(self, num_workers):
        return 1.0 + self.seconds   # in steps of 1 s and more; check_clock bounds it, not its exact value


@dataclass
class Trace(DelayModel):
    """Replay a recorded order of pushes.

    The file is a CSV with a header and at least a ``worker`` column; the
    local runtime also writes ``pulled`` (the version the worker pulled for
    that push), ``applied`` and ``wall_s``. With ``pulled``, the replay makes
    each worker pull exactly when the server reaches that version, so the
    sequence of tau is reproduced exactly. A file of bare worker ids, one per
    line, also works: each worker then pulls right after its push.
    """
    path: Path = Path()
    workers: list[int] = field(default_factory=list)
    pulled: list[int] | None = None
    wall_s: list[float] | None = None
    spec: str = ""

    def factor(self, worker, rng):
        # The simulator's synchronous rules and the real runtimes' pacing: a worker's mean recorded step.
        return self.mean_gap.get(worker, 1.0)

    def longest(self, num_workers):
        return max([1.0, *self.mean_gap.values()])

    def fastest(self, worker):   # (a real runtime paces each worker at its recorded mean speed)
        return self.mean_gap.get(worker, 1.0)

    @property
    def mean_gap(self) -> dict[int, float]:
        if self.wall_s is None:
            return {}
        last, gaps = {}, {}
        for w, t in zip(self.workers, self.wall_s):
            if w in last:
                gaps.setdefault(w, []).append(t - last[w])
            last[w] = t
        means = {w: sum(g) / len(g) for w, g in gaps.items() if g}
        scale = sum(means.values()) / len(means) if means else 1.0
        return {w: (g / scale if scale > 0 else 1.0) for w, g in means.items()}


# The longest virtual step a run may take: a clock of 1e58 such messages still stays a finite float.
MAX_MESSAGE_S = 1e250


def check_clock(delay: DelayModel, step_time: float, steps_per_message: int, num_workers: int) -> None:
    """ConfigError when the virtual clock could overflow: step time x longest delay factor x steps must
    stay below MAX_MESSAGE_S (so the clock of any run stays finite)."""
    longest = delay.longest(num_workers)
    try:
        product = step_time * longest * steps_per_message
    except OverflowError:
        product = math.inf
    if not product <= MAX_MESSAGE_S:
        culprit = "delay" if not longest * steps_per_message <= MAX_MESSAGE_S else "step_time"
        shown = delay.spec or type(delay).__name__
        raise ConfigError(culprit, f"makes one message take {product:g} virtual seconds (step_time {step_time:g} x "
                                   f"the longest step of delay {shown!r}, {longest:g}, x {steps_per_message} steps); "
                                   f"the virtual clock would overflow: keep it under {MAX_MESSAGE_S:g}")


def _bad(spec: str, problem: str) -> ConfigError:
    return ConfigError("delay", f"{spec!r}: {problem}")


def read_trace(path: str | Path) -> Trace:
    """A trace CSV (``traces.read``) as a delay model; ConfigError naming ``delay`` on a bad file."""
    workers, pulled, wall = traces.read(path, lambda problem: _bad(f"trace:{path}", problem))
    return Trace(path=Path(path), workers=workers, pulled=pulled, wall_s=wall, spec=f"trace:{path}")


def parse_delay(spec: str, num_workers: int) -> DelayModel:
    """Parse a delay spec; ConfigError naming ``delay`` on bad input."""
    if not isinstance(spec, str):
        raise ConfigError("delay", f"must be a delay model's name, e.g. gamma:2, got {spec!r}")
    if renamed_delay(spec) is not None:
        warnings.warn(deprecation(spec), DeprecationWarning, stacklevel=2)
        spec = renamed_delay(spec)
    name, _, arg = spec.partition(":")
    if name == "round-robin" and not arg:
        return RoundRobin()
    if name == "exponential" and not arg:
        return Exponential()
    if name == "gamma":
        shape = _bounded_float(arg, spec, "SHAPE", GAMMA_SHAPES)
        return Gamma(shape=shape, spec=spec)
    if name == "heterogeneous":
        if arg not in ("sqrt", "linear"):
            raise _bad(spec, "heterogeneous takes sqrt or linear, e.g. heterogeneous:sqrt")
        return Heterogeneous(kind=arg, spec=spec)
    if name == "straggler":
        k = _bounded_float(arg, spec, "K", STRAGGLER_SLOWDOWNS)
        return Straggler(slowdown=k, num_workers=num_workers, spec=spec)
    if name == "lognormal":
        return LogNormal(sigma=_bounded_float(arg, spec, "SIGMA", LOGNORMAL_SIGMAS), spec=spec)
    if name in ("slowdown", "pause"):
        first, at_sign, at = arg.partition("@")
        if not at_sign:
            raise _bad(spec, f"{name} takes {'K' if name == 'slowdown' else 'D'}@T (T in seconds), e.g. {_EXAMPLE[name]}")
        when = _bounded_float(at, spec, "T", SECONDS)
        if name == "slowdown":
            k = _bounded_float(first, spec, "K", STRAGGLER_SLOWDOWNS)
            return Slowdown(slowdown=k, at=when, num_workers=num_workers, spec=spec)
        d = _bounded_float(first, spec, "D", SECONDS)
        return Pause(seconds=d, at=when, num_workers=num_workers, spec=spec)
    if name == "trace":
        if not arg:
            raise _bad(spec, "a trace needs a file: trace:FILE")
        trace = read_trace(arg)
        if max(trace.workers) >= num_workers:
            raise _bad(spec, f"the trace names worker {max(trace.workers)} but the run has {num_workers} "
                             f"workers; run {max(trace.workers) + 1} workers")
        return trace
    raise ConfigError("delay", f"{spec!r} is not a delay model; use one of {', '.join(DELAY_MODELS)}")


def _bounded_float(arg: str, spec: str, what: str, bounds: tuple[float, float]) -> float:
    try:
        v = float(arg)
    except ValueError:
        v = float("nan")
    return _check_bounds(v, spec, what, bounds)


def _check_bounds(v, spec: str, what: str, bounds: tuple[float, float]) -> float:
    low, high = bounds
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not low <= v <= high:   # (NaN fails too)
        name = spec.split(":")[0]
        raise _bad(spec, f"{what} must be a number from {low:g} to {high:g}, e.g. {_EXAMPLE[name]}")
    return float(v)


_EXAMPLE = {"gamma": "gamma:2", "straggler": "straggler:10", "lognormal": "lognormal:1",
            "slowdown": "slowdown:4@30", "pause": "pause:10@30"}
