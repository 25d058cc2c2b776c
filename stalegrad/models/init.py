"""Weight initialisation as the frameworks of the papers we reproduce did it.

A model's starting point is part of the experiment. PyTorch's ``nn.Linear``
and ``nn.Conv*d`` start from Kaiming-uniform with ``a = sqrt(5)`` (weights
``uniform(±sqrt(1 / fan_in))``) and a non-zero bias ``uniform(±1/sqrt(fan_in))``;
the papers' networks did not. ``initialise(model, scheme)`` re-draws the
weights of a built model in place:

``torch``
    Leave the module as built (PyTorch's defaults; the zoo's ResNet-20
    already uses He-normal convs). Draws nothing.

``glorot-uniform``
    Keras 2.0's default for ``Dense`` and ``Conv*D`` (``kernel_initializer=
    'glorot_uniform'``, ``bias_initializer='zeros'``), which is what the AGN
    experiments used (Glorot & Bengio 2010)::

        w ~ uniform(-a, a),  a = sqrt(6 / (fan_in + fan_out))   (std a/sqrt(3))
        b = 0

``he-normal``
    He et al. 2015 ("Delving deep into rectifiers"), which the ResNet paper
    and so the DC-ASGD paper's ResNet-20 use for convolutions; applied to
    the linear layers too, so that a single scheme covers the whole model::

        w ~ normal(0, std),  std = sqrt(2 / fan_in)   (Kaiming normal, fan_in mode, ReLU gain)
        b = 0

    A plain (untruncated) normal, as in the paper and
    ``torch.nn.init.kaiming_normal_``; Keras 2.0's ``he_normal`` truncated it.

Fans are those of ``torch.nn.init._calculate_fan_in_and_fan_out``, which
match Keras: a Linear of shape ``(out, in)`` has ``fan_in = in`` and
``fan_out = out``; a convolution of shape ``(out, in/groups, *kernel)`` has
``fan_in = in/groups * prod(kernel)`` and ``fan_out = out * prod(kernel)``.

Which layers each scheme touches (w: weight re-drawn, b: bias set to 0):

=======================================  =====  ==============  =========
layer                                    torch  glorot-uniform  he-normal
=======================================  =====  ==============  =========
``nn.Linear``, ``nn.Conv1d/2d/3d``       as is  w, b            w, b
(and their subclasses)
BatchNorm, InstanceNorm, LayerNorm,      as is  as is           as is
GroupNorm, RMSNorm
anything else with parameters            as is  reported        reported
=======================================  =====  ==============  =========

Norm layers are left as they are (PyTorch builds them with weight 1 and bias
0, as Keras does), and are not reported. Everything else that owns
parameters (``nn.Embedding``, an RNN, ``nn.PReLU``, a ``nn.Parameter`` set
directly on a user's module, a transposed convolution, a Linear whose weight
is parametrised or not yet materialised, a Linear subclass's extra
parameters) is left as it is and reported, so the caller can say so.

**Naming of what is reported.** One entry per module that owns (directly,
not through its children) at least one parameter that was neither re-drawn
nor is a norm layer's: its qualified name from ``named_modules()``
(``"embed"``, ``"body.1"``), or ``"(root)"`` for parameters set directly on
the module passed in. A parametrised layer is reported once under its own
name, not under its ``parametrizations.*`` children. Entries come in
``named_modules()`` order, each module once even when it is shared.

Draws come from torch's global RNG, so ``torch.manual_seed(seed)`` before
``initialise`` fixes the result; as with ``build_model``, we never seed here.
"""
from __future__ import annotations

import math
from typing import TYPE_CHECKING

from .._lazy import torch
from ..errors import ConfigError

if TYPE_CHECKING:
    from torch import nn

__all__ = ["INITS", "ROOT_NAME", "initialise"]

INITS = ("torch", "glorot-uniform", "he-normal")

# How the module passed to ``initialise`` is named when it owns parameters itself.
ROOT_NAME = "(root)"


def initialise(module: nn.Module, scheme: str) -> list[str]:
    """Re-initialise ``module``'s Linear and Conv1d/2d/3d layers in place with
    ``scheme`` (one of ``INITS``; see the module docstring for the formulas)
    and return the qualified names of the modules with parameters it left
    alone, norm layers excepted (``"(root)"`` for the module itself).

    Raises ``ConfigError("init", ...)`` for an unknown scheme, before
    touching anything.
    """
    if not isinstance(scheme, str) or scheme not in INITS:
        raise ConfigError("init", f"must be one of {', '.join(INITS)}, got {scheme!r}")
    if not isinstance(module, torch.nn.Module):
        raise TypeError(f"initialise needs a torch.nn.Module, got {type(module).__name__}")
    if scheme == "torch":
        return []

    nn = torch.nn
    redrawn = (nn.Linear, nn.Conv1d, nn.Conv2d, nn.Conv3d)
    untouched: list[str] = []
    skip_under: list[str] = []   # prefixes of parametrisation containers already reported
    with torch.no_grad():
        for name, sub in module.named_modules():
            if any(name.startswith(prefix) for prefix in skip_under):
                continue
            if _is_norm(sub):
                continue
            own = dict(sub.named_parameters(recurse=False))
            if _is_parametrised(sub):
                # The weight is computed from parameters under sub.parametrizations;
                # drawing into it is not possible, so we leave the whole layer alone.
                skip_under.append(f"{name}.parametrizations." if name else "parametrizations.")
                untouched.append(name or ROOT_NAME)
                continue
            if isinstance(sub, redrawn) and _drawable(own.get("weight")):
                _draw(own.pop("weight"), scheme)
                bias = own.pop("bias", None)
                if bias is not None and _drawable(bias):
                    bias.zero_()
                elif bias is not None:
                    own["bias"] = bias
            if own:
                untouched.append(name or ROOT_NAME)
    return untouched


def _draw(weight, scheme: str) -> None:
    if weight.numel() == 0:
        return   # a zero-width layer: nothing to draw, and its fans would divide by zero
    fan_in, fan_out = torch.nn.init._calculate_fan_in_and_fan_out(weight)
    if scheme == "glorot-uniform":
        bound = math.sqrt(6.0 / (fan_in + fan_out))
        weight.uniform_(-bound, bound)
    else:   # he-normal
        weight.normal_(0.0, math.sqrt(2.0 / fan_in))


def _drawable(param) -> bool:
    # A lazy layer's parameters have no shape until its first forward pass.
    return param is not None and not isinstance(param, torch.nn.parameter.UninitializedParameter)


def _is_norm(module) -> bool:
    nn = torch.nn
    kinds = [nn.modules.batchnorm._NormBase, nn.LayerNorm, nn.GroupNorm]   # _NormBase: BatchNorm*, InstanceNorm*, SyncBatchNorm
    if hasattr(nn, "RMSNorm"):   # torch >= 2.4
        kinds.append(nn.RMSNorm)
    return isinstance(module, tuple(kinds))


def _is_parametrised(module) -> bool:
    return bool(torch.nn.utils.parametrize.is_parametrized(module))
