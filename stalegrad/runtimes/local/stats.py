"""What the local runtime measures: transport latencies, throughput, the order of pushes.

The workers keep their own pull and push latencies in rings of shared
memory (``protocol.record_latency``); the server keeps the rest here: the
pushes it applied, its own time per request, a timeline of local steps, and
(``--record-trace``) the order of pushes, which ``--runtime sim --delay
trace:FILE`` replays.
"""
from __future__ import annotations

import os

from torch import Tensor

from ...core.delays import write_trace
from .protocol import PULL_RING, PUSH_RING, STEPS, latencies

SAMPLE_EVERY = 0.2   # seconds between two points of the timeline


class Measurements:
    """The server's record of one run; every time is on the runtime's clock (seconds)."""

    def __init__(self, num_workers: int, record_trace: bool):
        self.pushes = [0] * num_workers
        self.ready_at: dict[int, float] = {}
        self.started_at: float | None = None
        self.timeline: list[tuple[float, int]] = []    # (time, local steps of all workers)
        self.handling: dict[str, list[float]] = {"pull": [], "push": []}   # server seconds per request
        self.trace: list[tuple] | None = [] if record_trace else None   # (worker, pulled, applied, time)
        self._last_sample = float("-inf")

    def pushed(self, m: int, pulled_version: int, applied_version: int, now: float) -> None:
        """Worker m's push is about to be applied to version ``applied_version``."""
        self.pushes[m] += 1
        if self.trace is not None:
            self.trace.append((m, pulled_version, applied_version, now))

    def handled(self, kind: str, seconds: float) -> None:
        self.handling[kind].append(seconds)

    def sample(self, now: float, meters: Tensor, force: bool = False) -> None:
        """A point of the timeline, at most every ``SAMPLE_EVERY`` seconds (``force``: now)."""
        if force or now - self._last_sample >= SAMPLE_EVERY:
            self._last_sample = now
            self.timeline.append((now, int(meters[:, STEPS].sum())))

    def collect(self, meters: Tensor, numel: int, threads: int, lost: int) -> dict:
        """The figures of the run (``LocalRuntime.stats``); ``["transport"]`` goes to summary.json."""
        pulls, pushes = [], []
        for row in meters:
            pulls += latencies(row, PULL_RING)
            pushes += latencies(row, PUSH_RING)
        transport = {
            "pull_ms_median": quantile_ms(pulls, 0.5), "pull_ms_p90": quantile_ms(pulls, 0.9),
            "push_ms_median": quantile_ms(pushes, 0.5), "push_ms_p90": quantile_ms(pushes, 0.9),
            "weight_bytes_per_message": 2 * 4 * numel,   # one pull and one push of float32 weights
        }
        return {
            "transport": transport, "pull_s": pulls, "push_s": pushes,
            "local_steps": [int(v) for v in meters[:, STEPS].tolist()], "pushes": list(self.pushes),
            "timeline": list(self.timeline), "ready_at": dict(self.ready_at), "started_at": self.started_at,
            "server_pull_ms_median": quantile_ms(self.handling["pull"], 0.5),
            "server_push_ms_median": quantile_ms(self.handling["push"], 0.5),
            "server_busy_s": sum(self.handling["pull"]) + sum(self.handling["push"]),
            "threads_per_worker": threads, "workers_lost": lost,
        }

    def write_trace(self, path: str | os.PathLike) -> None:
        """The order of pushes as a trace CSV (``delays.write_trace``: atomic, no temporary file
        left behind on an ``OSError``)."""
        if self.trace is not None:
            write_trace(path, self.trace)


def quantile_ms(values: list[float], q: float) -> float | None:
    """The ``q`` quantile of ``values`` (seconds) in milliseconds; None for none."""
    if not values:
        return None
    s = sorted(values)
    return round(1000 * s[min(len(s) - 1, int(q * len(s)))], 4)
