"""Model zoo: the networks the papers we reproduce train, sized from the data.

Every model is built from the dataset's per-sample ``input_shape`` and its
``num_classes`` and returns raw logits of shape ``(N, num_classes)``; the
caller applies cross-entropy. The library accepts any ``torch.nn.Module``, so
these are conveniences, not a registry that must be extended.

    logreg    flatten + Linear
    mlp       flatten + Linear/ReLU stack (``hidden``, default (256, 128))
    agn-mlp   the AGN paper's 1000-2000-1000 ReLU MLP
    cnn       small LeNet-style convnet for (C,H,W) images, H,W >= 8
    resnet20  CIFAR ResNet-20 (He et al. 2016), option-A shortcuts

The networks themselves are in ``zoo.py``; this module holds their names and
the checks of a model against the data, and imports torch only to build one.

The models start from PyTorch's defaults (Kaiming-normal for ResNet-20's
convs, as in the paper) unless ``initialise`` (``init.py``) re-draws them:
``--init glorot-uniform`` as Keras did for the AGN paper, ``he-normal`` as the
ResNet paper did. Every draw comes from the global RNG, so ``torch.manual_seed``
before ``build_model`` fixes the initial weights. We never seed here: the
caller owns reproducibility, and seeding inside would silently make every
run of a sweep start from the same point.

It may import only the top-level modules; never ``algorithms``, ``data``,
``core``, ``runtimes``, ``run``, ``study`` or ``cli`` (``tests/test_architecture.py``).
"""
from __future__ import annotations

import importlib
import math
from typing import TYPE_CHECKING, Sequence

from ..errors import UsageError
from .init import INITS, initialise

if TYPE_CHECKING:
    from torch import nn

__all__ = ["MODELS", "INITS", "ModelError", "ResNet20", "build_model", "count_parameters", "initialise"]


MODELS = ("logreg", "mlp", "agn-mlp", "cnn", "resnet20")

DEFAULT_MLP_HIDDEN = (256, 128)
AGN_MLP_HIDDEN = (1000, 2000, 1000)
# Both conv nets halve the spatial size twice; below 8x8 the last feature map
# would be 1x1 or empty, which is no longer the architecture being named.
MIN_IMAGE_SIDE = 8

_TAKES_HIDDEN = ("mlp",)


def __getattr__(name: str):
    # The networks need torch; the names and checks above do not (the CLI lists MODELS without it).
    if name == "ResNet20":
        return importlib.import_module(".zoo", __name__).ResNet20
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


class ModelError(UsageError):
    """One-line user-facing message: which model, which dataset shape, why it
    cannot fit, what to use instead. A ``UsageError`` (so a ValueError too)."""


def count_parameters(model: nn.Module) -> int:
    """Number of scalar parameters (not buffers such as BatchNorm running
    statistics, which are never sent as gradients)."""
    return sum(p.numel() for p in model.parameters())


def build_model(
    name: str,
    input_shape: Sequence[int],
    num_classes: int,
    *,
    hidden: Sequence[int] | None = None,
) -> nn.Module:
    """Build model ``name`` for samples of shape ``input_shape`` (without the
    batch dimension) and ``num_classes`` classes. Raises ModelError when the
    model cannot be built for that data."""
    if name not in MODELS:
        raise ModelError(f"unknown model {name!r}; choose one of {', '.join(MODELS)}")
    shape = _check_input_shape(name, input_shape)
    _check_num_classes(name, num_classes)
    if hidden is not None and name not in _TAKES_HIDDEN:
        fix = ("its sizes are fixed by the AGN paper" if name == "agn-mlp"
               else "its architecture is fixed")
        raise ModelError(
            f"model {name!r} does not take hidden sizes ({fix}); "
            f"drop hidden=, or use mlp for custom hidden sizes")

    from torch import nn

    from .zoo import ResNet20, cnn, mlp

    in_features = math.prod(shape)
    if name == "logreg":
        return nn.Sequential(nn.Flatten(), nn.Linear(in_features, num_classes))
    if name == "mlp":
        sizes = DEFAULT_MLP_HIDDEN if hidden is None else _check_hidden(hidden)
        return mlp(in_features, sizes, num_classes)
    if name == "agn-mlp":
        return mlp(in_features, AGN_MLP_HIDDEN, num_classes)

    channels, height, width = _check_image(name, shape)
    if name == "cnn":
        return cnn(channels, height, width, num_classes)
    return ResNet20(channels, num_classes)


# --- argument checks ---------------------------------------------------------

def _fmt_shape(shape: Sequence[int]) -> str:
    # "(32,)" and "(1,8,8)": compact, and the same spelling users see in docs.
    inner = ",".join(str(d) for d in shape)
    return f"({inner},)" if len(shape) == 1 else f"({inner})"


def _is_int(x: object) -> bool:
    # bool is an int subclass, but hidden=(True,) is surely a mistake.
    return isinstance(x, int) and not isinstance(x, bool)


def _check_input_shape(name: str, input_shape: Sequence[int]) -> tuple[int, ...]:
    try:
        shape = tuple(input_shape)
    except TypeError:
        raise ModelError(
            f"model {name!r}: input_shape must be a tuple of sizes such as (32,) "
            f"or (3,32,32), got {input_shape!r}") from None
    if not shape or not all(_is_int(d) and d > 0 for d in shape):
        raise ModelError(
            f"model {name!r}: input_shape must be a non-empty tuple of positive "
            f"ints such as (32,) or (3,32,32), got {input_shape!r}")
    return shape


def _check_num_classes(name: str, num_classes: int) -> None:
    if not _is_int(num_classes) or num_classes < 2:
        raise ModelError(
            f"model {name!r}: num_classes must be an int >= 2 for cross-entropy "
            f"classification, got {num_classes!r}")


def _check_hidden(hidden: Sequence[int]) -> tuple[int, ...]:
    if isinstance(hidden, (str, bytes)) or not isinstance(hidden, Sequence):
        raise ModelError(
            f"model 'mlp': hidden must be a tuple of layer sizes such as (256, 128), "
            f"got {hidden!r}")
    sizes = tuple(hidden)
    if not sizes:
        raise ModelError(
            "model 'mlp': hidden=() leaves no hidden layer; "
            "use logreg for a single linear layer")
    if not all(_is_int(h) and h > 0 for h in sizes):
        raise ModelError(
            f"model 'mlp': hidden sizes must be positive ints such as (256, 128), "
            f"got {hidden!r}")
    return sizes


def _check_image(name: str, shape: tuple[int, ...]) -> tuple[int, int, int]:
    if len(shape) == 1:
        raise ModelError(
            f"model {name!r} needs image input (C,H,W); dataset has flat input "
            f"of shape {_fmt_shape(shape)}; use mlp or logreg")
    if len(shape) != 3:
        raise ModelError(
            f"model {name!r} needs image input (C,H,W); dataset has input of shape "
            f"{_fmt_shape(shape)}; reshape it to (C,H,W) or use mlp or logreg")
    channels, height, width = shape
    if height < MIN_IMAGE_SIDE or width < MIN_IMAGE_SIDE:
        raise ModelError(
            f"model {name!r} needs images of at least {MIN_IMAGE_SIDE}x{MIN_IMAGE_SIDE} "
            f"(it downsamples twice); dataset has input of shape {_fmt_shape(shape)}; "
            f"use mlp or logreg")
    return channels, height, width


# --- fully connected ---------------------------------------------------------
