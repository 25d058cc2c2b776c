"""What a run needs of this machine, checked before anything is written: memory for its weights, its
workers and their samples.

A run keeps copies of the model's parameters: the server's weights, the model it evaluates (weights and
gradients), the update it writes, the algorithm's server state (DC-ASGD's snapshot per worker, the redrawn
control's int64 sign keys, ...) with the old values a transactional update keeps of what it writes
(``transaction.Undo``), and, for each worker, its algorithm state (AGN's Adam moments, ...), the weights it
pulled and the message it sends. The copies an algorithm keeps are measured, in bytes, from ``server_init``,
``worker_init`` and ``Undo.begin`` run on a small vector; the model itself can be built on PyTorch's ``meta``
device (``meta_model``), so that a model too large to build is refused, not built.

Each worker also holds its mini-batch stream (``worker.BatchStream``): under ``--partition iid`` a permutation of
every sample and the pass it is in, 16 bytes a sample per worker (100,000 workers on digits' 1,437 samples:
2.3 GB); under ``shard`` and ``replicate:K`` a slice of one permutation of the K copies, 16 x K bytes a sample
over all workers. Beside that, a worker's objects (its ``Worker``, stream, generator and their tensors) take about
``WORKER_OBJECT_BYTES``, and the run itself ``RUN_BYTES``. tests/test_resources_measured.py holds the estimate
against a run's measured peak memory.
"""
from __future__ import annotations

import os

from ..errors import UsageError
from .options import parse_partition

# Beside the algorithm's own state: the server's weights, its model's weights and gradients, the update.
SERVER_COPIES = 4
# Beside the algorithm's own state, per worker: the weights it pulled and the message it sends.
WORKER_COPIES = 2
# A worker's Python objects and its generator's state (torch's CPU generator: about 2.7 KB resident each),
# beside its tensors' contents: measured 8 to 12 KB a worker in the simulator (tests/test_resources_measured.py).
WORKER_OBJECT_BYTES = 10 * 2**10
INDEX_BYTES = 8   # a sample index: int64
# What a run allocates whatever its shape: the evaluation's activations, torch's first workspaces, the run's own
# objects (measured: 13 MB for one worker of logreg on digits in a fresh process, 30 MB in a forked one).
RUN_BYTES = 32 * 2**20


def available_memory() -> int | None:
    """Bytes of memory available to new processes (Linux's MemAvailable, else the free pages);
    None where neither can be read."""
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    try:
        pages, size = os.sysconf("SC_AVPHYS_PAGES"), os.sysconf("SC_PAGE_SIZE")
    except (AttributeError, ValueError, OSError):
        return None
    return pages * size if pages > 0 and size > 0 else None


def meta_model(build):
    """``build()`` on the meta device: the module's shapes without its memory."""
    import torch
    with torch.device("meta"):
        return build()


def _bytes(state) -> int:
    """The bytes of the tensors in ``state`` (a tensor, a rule's state, dicts, lists and tuples of them), each
    counted once."""
    import torch
    seen: set = set()

    def walk(x) -> int:
        if isinstance(x, torch.Tensor):
            if id(x) in seen:
                return 0
            seen.add(id(x))
            return x.numel() * x.element_size()
        if callable(getattr(x, "to_dict", None)):   # (a rule's RuleState)
            x = x.to_dict()
        if isinstance(x, dict):
            return sum(walk(v) for v in x.values())
        if isinstance(x, (list, tuple)):
            return sum(walk(v) for v in x)
        return 0
    return walk(state)


def _server_bytes(algorithm, w, workers: int) -> int:
    """The server state's bytes with ``workers`` workers, and its transaction's undo buffers (``Undo``: kept from
    update to update, one like each tensor the rule may write, ``server_writes``, every one where it does not say;
    of a per-worker list, the pushing worker's, or every worker's for a synchronous rule's round)."""
    state = algorithm.server_init(w, workers)
    fields = state.to_dict() if callable(getattr(state, "to_dict", None)) else dict(state)
    declared = algorithm.server_writes
    undo = 0
    for name, value in fields.items():
        if declared is not None and name not in declared:
            continue
        if isinstance(value, (list, tuple)) and value and not (algorithm.synchronous or declared is None):
            value = value[0]   # (one buffer serves whichever worker pushes)
        undo += _bytes(value)
    return _bytes(fields) + undo


def state_copies(algorithm) -> tuple[float, float, float]:
    """(server copies of the weights with one worker, more per added worker, copies per worker) that the
    algorithm's own state holds, its transaction's undo buffers included, in bytes over the weights' bytes (an
    int64 tensor the weights' length is two float32 copies), measured on a small CPU vector (4 KiB: a meta vector
    would spare nothing and its first use imports torch's meta kernels, 0.5 to 0.9 s of every run's start)."""
    import torch
    n = 1024
    w = torch.zeros(n)
    size = n * w.element_size()
    one, two = _server_bytes(algorithm, w, 1), _server_bytes(algorithm, w, 2)
    return one / size, (two - one) / size, _bytes(algorithm.worker_init(w, 2)) / size


def index_bytes(num_samples: int, workers: int, partition: str) -> int:
    """The bytes of sample indices the workers' mini-batch streams hold (``BatchStream``: each one's pool and the
    order of its pass): iid, every sample for every worker; shard and replicate:K, the K copies dealt out once."""
    layout, copies = parse_partition(partition)
    per_stream = num_samples * (workers if layout == "iid" else copies)
    return 2 * INDEX_BYTES * per_stream


def memory_estimate(algorithm, workers: int, num_params: int, element_bytes: int, data_bytes: int,
                    stream_bytes: int = 0) -> dict:
    """The bytes a run of ``algorithm`` on ``workers`` workers keeps, and how they add up; ``stream_bytes``: the
    workers' sample indices (``index_bytes``)."""
    base, per_added, per_worker_state = state_copies(algorithm)
    server = SERVER_COPIES + base + per_added * (workers - 1)
    per_worker = WORKER_COPIES + per_worker_state + (1 if algorithm.synchronous else 0)   # + a buffered message
    copies = server + workers * per_worker
    objects = workers * WORKER_OBJECT_BYTES
    return {"bytes": int(copies * num_params * element_bytes) + data_bytes + stream_bytes + objects + RUN_BYTES,
            "copies": copies, "server_copies": server, "worker_copies": per_worker, "data_bytes": data_bytes,
            "stream_bytes": stream_bytes, "object_bytes": objects}


def _size(b: float) -> str:
    for unit, scale in (("TiB", 2**40), ("GiB", 2**30), ("MiB", 2**20)):
        if b >= scale:
            return f"{b / scale:.3g} {unit}"
    return f"{b / 2**10:.3g} KiB"


def run_estimate(config, module, train_data, test_data) -> dict:
    """``memory_estimate`` of a run of ``config`` (its algorithm, workers, partition) with ``module`` (possibly
    on the meta device) on these data sets, and the model's ``num_params``."""
    params = list(module.parameters())
    num_params = sum(p.numel() for p in params)
    element = max((p.element_size() for p in params), default=4)
    data = sum(t.numel() * t.element_size() for d in (train_data, test_data) for t in (d.x, d.y))
    streams = index_bytes(int(train_data.y.shape[0]), config.workers, config.partition)
    return {**memory_estimate(config.algorithm, config.workers, num_params, element, data, streams),
            "num_params": num_params}


def check_memory(config, module, train_data, test_data, available: int | None = None) -> None:
    """UsageError, naming the estimate, when the run cannot fit in this machine's available memory
    (``module`` may live on the meta device): called before any worker is built. No check where the
    available memory is unknown or the weights live on another device."""
    available = available_memory() if available is None else available
    if available is None or config.device != "cpu":
        return
    est = run_estimate(config, module, train_data, test_data)
    if est["bytes"] > available:
        streams = (f"; {_size(est['stream_bytes'])} of sample indices (--partition {config.partition}"
                   f"{': every sample for each worker' if config.partition == 'iid' else ''})"
                   if est["stream_bytes"] >= 2**20 else "")
        raise UsageError(
            f"the run needs about {_size(est['bytes'])} of memory ({est['num_params']:,} parameters x "
            f"{est['copies']:,.0f} copies: {est['server_copies']:g} on the server and {est['worker_copies']:g} for "
            f"each of {config.workers:,} workers{streams}; {_size(est['object_bytes'])} of the workers' objects; "
            f"plus {_size(est['data_bytes'])} of data), more than the {_size(available)} available on this machine; "
            "use fewer workers or a smaller model")
