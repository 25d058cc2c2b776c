"""Delay models of the simulator: how long each worker computes.

A model gives the virtual duration of one local step of a worker; the
simulator multiplies it by the steps in a message and by ``step_time``.
All randomness comes from the ``random.Random`` the simulator passes in, so a
seed fixes the whole schedule.
"""
from __future__ import annotations

import csv
import math
import os
import random
import stat
import warnings
from dataclasses import dataclass, field
from pathlib import Path

from ..errors import ConfigError


DELAY_MODELS = ("exponential", "gamma:SHAPE", "heterogeneous:sqrt|linear", "straggler:K", "round-robin", "trace:FILE")
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
GAMMA_SHAPES = (0.01, 1e6)
STRAGGLER_SLOWDOWNS = (1.0, 1e12)
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
        raise NotImplementedError

    def longest(self, num_workers: int) -> float:
        """A bound on ``factor`` (for the random models, one no draw exceeds in practice: e^-40)."""
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
        # Only used by synchronous algorithms: a worker's mean recorded step.
        return self.mean_gap.get(worker, 1.0)

    def longest(self, num_workers):
        return max([1.0, *self.mean_gap.values()])

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


TRACE_COLUMNS = ("worker", "pulled", "applied", "wall_s")


def write_trace(path: str | Path, rows) -> None:
    """Write pushes ``(worker, pulled version, applied version, wall seconds)`` as a trace CSV,
    atomically (a temporary file renamed into place; none is left behind on an OSError)."""
    path = Path(path)
    tmp = path.with_name(f".{path.name}.tmp")
    try:
        with open(tmp, "w", newline="") as f:
            out = csv.writer(f)
            out.writerow(TRACE_COLUMNS)
            for m, pulled, applied, t in rows:
                out.writerow([m, pulled, applied, f"{t:.6f}"])
        os.replace(tmp, path)
    except OSError:
        tmp.unlink(missing_ok=True)
        raise


# A push is one short CSV line (~30 bytes): this is millions of pushes, and what a run can hold in memory.
MAX_TRACE_BYTES = 256 * 2**20


def read_trace(path: str | Path) -> Trace:
    path = Path(path)
    spec = f"trace:{path}"
    try:
        info = path.stat()
        if not stat.S_ISREG(info.st_mode):   # /dev/zero, a FIFO, a directory: nothing a recording writes
            raise _bad(spec, "not a regular file; a trace is a CSV written by --record-trace")
        if info.st_size > MAX_TRACE_BYTES:
            raise _bad(spec, f"the trace is {info.st_size / 2**20:.0f} MiB, more than the {MAX_TRACE_BYTES >> 20} "
                             "MiB a trace may have; keep the pushes you need")
        with open(path, "rb") as f:   # read no more than the limit, should the file grow meanwhile
            text = f.read(MAX_TRACE_BYTES + 1).decode()
        if len(text) > MAX_TRACE_BYTES:
            raise _bad(spec, f"the trace grew past the {MAX_TRACE_BYTES >> 20} MiB a trace may have")
    except OSError as e:
        raise _bad(spec, f"cannot read the trace ({e.strerror}); record one with "
                         "'stalegrad train --runtime local --record-trace FILE'") from None
    except UnicodeDecodeError:
        raise _bad(spec, "not a text file; a trace is a CSV written by --record-trace") from None
    lines = [ln for ln in text.splitlines() if ln.strip()]
    if not lines:
        raise _bad(spec, "the trace is empty")
    try:
        if lines[0].strip().lstrip("-").isdigit():   # bare worker ids, one a line: checked as the CSV's are
            workers, pulled, wall = [int(ln) for ln in lines], None, None
        else:
            rows = list(csv.DictReader(lines))
            header = next(csv.reader(lines[:1]))
            if "worker" not in header:
                raise ValueError(f"its header {','.join(header)!r} has no 'worker' column")
            if not rows:
                raise _bad(spec, "the trace has a header but no pushes; record a run with --record-trace")
            workers = [int(r["worker"]) for r in rows]
            pulled = [int(r["pulled"]) for r in rows] if "pulled" in header else None
            wall = [float(r["wall_s"]) for r in rows] if "wall_s" in header else None
    except ConfigError:
        raise
    except (ValueError, TypeError, KeyError, csv.Error) as e:
        raise _bad(spec, f"malformed trace ({e}); expected a CSV with columns "
                         "worker[,pulled,applied,wall_s] or one worker id per line") from None
    negative = next((i for i, w in enumerate(workers) if w < 0), None)
    if negative is not None:   # (-1 would index the last worker, -5 past the first: refused in either form)
        raise _bad(spec, f"push {negative + 1} names worker {workers[negative]}; worker ids count from 0")
    if wall is not None and not all(math.isfinite(t) for t in wall):
        raise _bad(spec, "a wall_s value is not a finite number")
    return Trace(path=path, workers=workers, pulled=pulled, wall_s=wall, spec=spec)


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
        raise _bad(spec, f"{what} must be a number from {low:g} to {high:g}, e.g. {name}:{_EXAMPLE[name]}")
    return float(v)


_EXAMPLE = {"gamma": 2, "straggler": 10}
