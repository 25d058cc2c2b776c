"""The core's option values that a run's options are checked against: what a push does with a non-finite
message, the data layouts, and what the probes measure of an algorithm. Kept free of torch so that
``stalegrad --help`` and the command line's argument errors do not import it (``tests/test_cli.py``)."""
from __future__ import annotations

import re

from ..algorithms import Algorithm
from ..errors import ConfigError

MAX_SEED = 2**32 - 1   # the mini-batch streams derive per-worker seeds from it in 64 bits
ON_NONFINITE = ("skip", "stop")   # what a push does with a non-finite message or delta: count and drop it, or stop
PARTITIONS = ("shard", "iid", "replicate:K")   # as the help lists them; parse_partition reads a value
MAX_COPIES = 128   # replicate:K holds K x N sample indices; dist-keras' largest MNIST file had 101 copies


def parse_partition(partition) -> tuple[str, int]:
    """``(layout, copies)`` of a ``partition`` value: ``("shard", 1)``, ``("iid", 1)`` or ``("replicate", K)``.

    ``replicate:K`` is the thesis's layout (Hermans 2017, through dist-keras): the training set written K
    times over, one random permutation of the K x N rows dealt into one contiguous slice per worker (Spark's
    ``repartition(n)``), so a worker holds K x N / n rows, some of them twice, with about
    N (1 - (1 - 1/n)^K) distinct samples. An epoch still counts N samples (one pass over the data set given),
    as under every layout: the thesis's "40 epochs" over its 11 copies are ``--epochs 440``."""
    if partition in ("shard", "iid"):
        return partition, 1
    if isinstance(partition, str) and partition.startswith("replicate:"):
        k = partition.split(":", 1)[1]
        if re.fullmatch(r"[0-9]{1,9}", k) and 1 <= int(k) <= MAX_COPIES:   # (ASCII digits: not ² nor ٣)
            return "replicate", int(k)
    raise ConfigError("partition", f"must be shard, iid or replicate:K with K copies from 1 to {MAX_COPIES} "
                                   f"(the thesis's layout: replicate:11), got {partition!r}")


def canonical_partition(partition) -> str:
    """``partition`` spelled one way for one layout (``replicate:011`` -> ``replicate:11``), as config.json
    records it and a grid names its cells; ConfigError as ``parse_partition``."""
    layout, copies = parse_partition(partition)
    return f"replicate:{copies}" if layout == "replicate" else layout


def check_stops(algorithm: Algorithm, workers: int, runtime) -> None:
    """A rule told to stop late computations (``stops on``: ``Algorithm.stop_threshold``) needs a runtime that
    can (``supports_stops``: the simulator); ConfigError otherwise."""
    if algorithm.stop_threshold(workers) is not None and not getattr(runtime, "supports_stops", False):
        raise ConfigError("stops", f"is on, which needs the simulator (runtime sim): it alone can stop a worker "
                                   f"mid-computation; runtime {runtime.describe().get('name')} cannot (give stops "
                                   f"off: its late messages are then dropped by the server)")


def probe_kind(algorithm: Algorithm) -> str | None:
    """What the simulator's probes measure of ``algorithm``: 'gradient' (one gradient at the pulled
    weights, applied asynchronously), 'commit' (an accumulated commit), or None (not measured)."""
    from ..algorithms.agn import CommitAlgorithm
    if algorithm.synchronous or not algorithm.pull_before_compute or not algorithm.probed:
        return None
    if algorithm.vectorisable:
        return "gradient"
    return "commit" if isinstance(algorithm, CommitAlgorithm) else None
