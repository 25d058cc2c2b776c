"""The checks at the parameter server's boundary, on every pull and push, in both kernel paths.

A wrong call is a one-line ``UsageError`` before anything changes (no weights, version, pulled
version, algorithm state or staleness log moves): a message that is not a tensor of the weights'
shape, dtype and device (a longer one made the fused kernels write past the weights; a shorter one
was applied as a partial update), a worker id outside 0..M-1 (negative ids are not counted from the
end), a learning rate that is not a finite number > 0.

``ParameterServer`` and ``ShardedServer`` test the common case inline (a few comparisons of
attributes) and call these functions only when that test fails: to say what is wrong, or to accept
an equivalent value (a numpy integer id, an integer rate) in its plain Python form.
"""
from __future__ import annotations

import math
import numbers
import operator

from torch import Tensor

from ..errors import UsageError


def worker_id(worker, num_workers: int, call: str) -> int:
    """``worker`` as a Python int in 0..num_workers-1, or UsageError."""
    ids = f"0 to {num_workers - 1}" if num_workers > 1 else "0"
    if isinstance(worker, bool) or not hasattr(type(worker), "__index__"):
        raise UsageError(f"{call}: the worker id must be an integer from {ids}, got {worker!r}")
    m = operator.index(worker)
    if not 0 <= m < num_workers:
        raise UsageError(f"{call}: worker {m} is out of range: this server has {num_workers} "
                         f"worker{'s' if num_workers != 1 else ''}, ids {ids} (negative ids are not counted "
                         "from the end); pass one of those")
    return m


def learning_rate(lr, call: str) -> float:
    """``lr`` as a Python float, finite and > 0, or UsageError."""
    value = None
    if isinstance(lr, numbers.Real) and not isinstance(lr, bool):
        try:
            value = float(lr)
        except OverflowError:
            value = None
    if value is None or not 0.0 < value < math.inf:
        raise UsageError(f"{call}: lr must be a finite number > 0, got {lr!r}; pass this step's learning rate")
    return value


def message(msg, w: Tensor, call: str, what: str = "the message") -> None:
    """UsageError unless ``msg`` is a tensor of ``w``'s shape, dtype and device."""
    if not isinstance(msg, Tensor):
        raise UsageError(f"{call}: {what} must be a torch.Tensor of {w.numel()} {w.dtype} elements "
                         f"(shaped like the weights), got {type(msg).__name__}")
    if msg.shape != w.shape:
        if msg.dim() == w.dim() == 1:
            raise UsageError(f"{call}: {what} holds {msg.numel()} elements, the weights {w.numel()}: "
                             f"push a vector of {w.numel()} elements (this model's gradient or commit)")
        raise UsageError(f"{call}: {what} has shape {tuple(msg.shape)}, the weights {tuple(w.shape)}: "
                         "push a tensor shaped like the weights (reshape it if it holds as many elements)")
    if msg.dtype != w.dtype:
        raise UsageError(f"{call}: {what} is {msg.dtype}, the weights {w.dtype}: convert it first, "
                         f"msg.to({w.dtype})")
    if msg.device != w.device:
        raise UsageError(f"{call}: {what} is on {msg.device}, the weights on {w.device}: move it first, "
                         f"msg.to('{w.device}')")


def push(worker, msg, lr, w: Tensor, num_workers: int, call: str) -> tuple[int, float]:
    """Every check of a push (worker id, rate, message), in that order; the id and rate in plain form."""
    m = worker_id(worker, num_workers, call)
    rate = learning_rate(lr, call)
    message(msg, w, call)
    return m, rate


def slices(parts, shards: int, sizes, call: str) -> None:
    """The slices of a message to ``shards`` shards: one per shard, and, where they are tensors and
    the shards' sizes are known, each a vector as long as its shard, all of one dtype and device (each
    shard checks those against its weights: then they all refuse a message, or none does)."""
    if len(parts) != shards:
        raise UsageError(f"{call}: got {len(parts)} slices of the message for {shards} shards; "
                         "split it with shard_bounds")
    first = parts[0] if shards and isinstance(parts[0], Tensor) else None
    for k, (part, n) in enumerate(zip(parts, sizes or ())):
        if isinstance(part, Tensor) and part.shape != (n,):
            raise UsageError(f"{call}: slice {k} of the message has shape {tuple(part.shape)}, shard {k} "
                             f"holds {n} weights; split the message with shard_bounds")
        if first is not None and isinstance(part, Tensor) and (part.dtype, part.device) != (first.dtype, first.device):
            raise UsageError(f"{call}: slice {k} of the message is {part.dtype} on {part.device}, slice 0 "
                             f"{first.dtype} on {first.device}; split one message with shard_bounds")
