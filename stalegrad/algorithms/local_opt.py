"""Worker-side local optimizers on flat vectors, as (init, step) pairs.

The commit algorithms (agn, downpour, dynsgd, easgd, aeasgd) take several local
steps between two messages. Their optimizer state lives on the worker and is
kept across pulls, as in dist-keras, where the Keras optimizer is never reset.
"""
from __future__ import annotations

from typing import TYPE_CHECKING

from .._lazy import torch
from ..errors import ConfigError

if TYPE_CHECKING:
    from torch import Tensor

LOCAL_OPTIMIZERS = ("adam", "sgd")


def check(algorithm, momentum: str = "local_momentum") -> None:
    """The local optimizer's momentum lies in [0, 1): sgd's buffer b <- momentum*b + g grows without
    bound at 1 or more (the steps then diverge; 1e6 made every commit NaN). ConfigError otherwise."""
    v = getattr(algorithm, momentum)
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not 0 <= v < 1:
        raise ConfigError(momentum, f"must be in [0, 1) (the local sgd's momentum; 0.9 is usual), got {v!r}",
                          algorithm.name)


def init(name: str, w: Tensor, momentum: float = 0.0) -> dict:
    if name == "adam":
        return {"step": 0, "m": torch.zeros_like(w), "v": torch.zeros_like(w)}
    if name == "sgd":
        return {"buf": torch.zeros_like(w)} if momentum else {}
    raise ConfigError("local_opt", f"must be one of {', '.join(LOCAL_OPTIMIZERS)}, got {name!r}")


def stack(states: list[dict]) -> dict:
    """K workers' states as one batched state (copies): tensors stacked to (K, n), Adam's step
    counts to a (K, 1) float64 tensor, so that ``step`` updates the K workers at once."""
    out = {}
    for key, value in states[0].items():
        if key == "step":
            out[key] = torch.tensor([[s[key]] for s in states], dtype=torch.float64, device=states[0]["m"].device)
        else:
            out[key] = torch.stack([s[key] for s in states])
    return out


def unstack(batched: dict, states: list[dict]) -> None:
    """Write a batched state back into the K workers' own states (in place)."""
    for k, s in enumerate(states):
        for key, value in batched.items():
            if key == "step":
                s[key] = int(value[k, 0])
            else:
                s[key].copy_(value[k])


def step(name: str, state: dict, w: Tensor, g: Tensor, lr: float, *, momentum: float = 0.0,
         weight_decay: float = 0.0, betas=(0.9, 0.999), eps: float = 1e-8) -> None:
    """One in-place step on ``w``. Adam follows torch.optim.Adam (L2 weight decay).

    Batched: ``w`` and ``g`` may be (K, n), K workers stacked, with a state from ``stack``; every
    row then takes the step it would take alone (Adam with its own step count)."""
    if weight_decay:
        g = g.add(w, alpha=weight_decay)
    if name == "sgd":
        if momentum:
            buf = state["buf"]
            buf.mul_(momentum).add_(g)
            g = buf
        w.add_(g, alpha=-lr)
        return
    b1, b2 = betas
    state["step"] += 1
    t = state["step"]
    m, v = state["m"], state["v"]
    m.mul_(b1).add_(g, alpha=1 - b1)
    v.mul_(b2).addcmul_(g, g, value=1 - b2)
    bias1 = 1 - b1 ** t
    bias2 = 1 - b2 ** t
    if isinstance(t, int):
        denom = (v / bias2).sqrt_().add_(eps)
        w.addcdiv_(m, denom, value=-lr / bias1)
    else:   # one count per row: the same float32 factors, applied as addcdiv applies its value (value*m/denom)
        denom = (v / bias2.float()).sqrt_().add_(eps)
        w.addcdiv_(m * (-lr / bias1).float(), denom)
