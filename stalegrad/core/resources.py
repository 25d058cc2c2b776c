"""What a run needs of this machine, checked before anything is written: memory for its weights.

A run keeps copies of the model's parameters: the server's weights, the model it evaluates (weights and
gradients), the update it writes, the algorithm's server state (DC-ASGD's snapshot per worker, ...),
and, for each worker, its algorithm state (AGN's Adam moments, ...), the weights it pulled and the
message it sends. The copies an algorithm keeps are read from ``server_init`` and ``worker_init`` run
on PyTorch's ``meta`` device, which allocates nothing; the model itself can be built there too
(``meta_model``), so that a model too large to build is refused, not built.
"""
from __future__ import annotations

import os

from ..errors import UsageError

# Beside the algorithm's own state: the server's weights, its model's weights and gradients, the update.
SERVER_COPIES = 4
# Beside the algorithm's own state, per worker: the weights it pulled and the message it sends.
WORKER_COPIES = 2


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


def _numel(state) -> int:
    import torch
    if isinstance(state, torch.Tensor):
        return state.numel()
    if isinstance(state, dict):
        return sum(_numel(v) for v in state.values())
    if isinstance(state, (list, tuple)):
        return sum(_numel(v) for v in state)
    return 0


def state_copies(algorithm) -> tuple[float, float, float]:
    """(server copies of the weights with one worker, more per added worker, copies per worker) that the
    algorithm's own state holds, measured on a small CPU vector (4 KiB: a meta vector would spare nothing
    and its first use imports torch's meta kernels, 0.5 to 0.9 s of every run's start)."""
    import torch
    n = 1024
    w = torch.zeros(n)
    one, two = _numel(algorithm.server_init(w, 1)), _numel(algorithm.server_init(w, 2))
    return one / n, (two - one) / n, _numel(algorithm.worker_init(w, 2)) / n


def memory_estimate(algorithm, workers: int, num_params: int, element_bytes: int, data_bytes: int) -> dict:
    """The bytes a run of ``algorithm`` on ``workers`` workers keeps, and how they add up."""
    base, per_added, per_worker_state = state_copies(algorithm)
    server = SERVER_COPIES + base + per_added * (workers - 1)
    per_worker = WORKER_COPIES + per_worker_state + (1 if algorithm.synchronous else 0)   # + a buffered message
    copies = server + workers * per_worker
    return {"bytes": int(copies * num_params * element_bytes) + data_bytes, "copies": copies,
            "server_copies": server, "worker_copies": per_worker, "data_bytes": data_bytes}


def _size(b: float) -> str:
    for unit, scale in (("TiB", 2**40), ("GiB", 2**30), ("MiB", 2**20)):
        if b >= scale:
            return f"{b / scale:.3g} {unit}"
    return f"{b / 2**10:.3g} KiB"


def check_memory(config, module, train_data, test_data, available: int | None = None) -> None:
    """UsageError, naming the estimate, when the run cannot fit in this machine's available memory
    (``module`` may live on the meta device). No check where the available memory is unknown."""
    available = available_memory() if available is None else available
    if available is None or config.device != "cpu":
        return
    params = list(module.parameters())
    num_params = sum(p.numel() for p in params)
    element = max((p.element_size() for p in params), default=4)
    data = sum(t.numel() * t.element_size() for d in (train_data, test_data) for t in (d.x, d.y))
    est = memory_estimate(config.algorithm, config.workers, num_params, element, data)
    if est["bytes"] > available:
        raise UsageError(
            f"the run needs about {_size(est['bytes'])} of memory ({num_params:,} parameters x "
            f"{est['copies']:,.0f} copies: {est['server_copies']:g} on the server and {est['worker_copies']:g} for "
            f"each of {config.workers:,} workers; plus {_size(data)} of data), more than the {_size(available)} "
            "available on this machine; use fewer workers or a smaller model")
