"""Whether a model fits the data it is to train on, checked by ``train`` before anything runs.

The command line builds its model for the data (``models/``) from data sets that ``data/`` has checked;
``stalegrad.train`` takes any ``nn.Module`` and any ``x``/``y`` tensors. Without these checks a model of the
wrong input shape, a head with fewer outputs than the data has classes, float or out-of-range labels and
samples of another dtype than the weights all failed mid-run with torch's own error; here each is one
``ConfigError`` naming the parameter, before the first step.
"""
from __future__ import annotations

import operator

import torch
from torch import nn

from ..errors import ConfigError


def resolve_model(model, input_shape, num_classes) -> nn.Module:
    """``model`` as a module: a module as it is, a model name built for the data, a factory called."""
    from ..models import build_model
    if isinstance(model, nn.Module):
        return model
    if isinstance(model, str):
        return build_model(model, input_shape, num_classes)
    if callable(model):
        built = model()
        if not isinstance(built, nn.Module):
            raise ConfigError("model", f"factory returned {type(built).__name__}, not a torch.nn.Module")
        return built
    raise ConfigError("model", f"must be a torch.nn.Module, a factory, or a model name, not {type(model).__name__}")


def num_classes(train_data, test_data) -> int:
    """The data's classes: its ``num_classes``, else one more than the largest label of either set.
    Checks the labels first (``ConfigError``): class indices of dtype int64, from 0, below the count."""
    for name, data in (("train_data", train_data), ("test_data", test_data)):
        y = data.y
        if not isinstance(y, torch.Tensor) or y.dtype != torch.int64 or y.dim() != 1:
            shown = f"{y.dtype} tensor of shape {tuple(y.shape)}" if isinstance(y, torch.Tensor) else type(y).__name__
            raise ConfigError(name, f"holds labels as a {shown}; labels are class indices, a 1-D torch.int64 "
                                    "tensor (y.long())")
        if len(y) and int(y.min()) < 0:
            raise ConfigError(name, f"holds the label {int(y.min())}; labels are class indices from 0")
    given = getattr(train_data, "num_classes", None)
    largest = max(int(d.y.max()) for d in (train_data, test_data) if len(d.y))
    if given is None:
        return largest + 1
    try:
        given = operator.index(given) if not isinstance(given, bool) else 0   # (a numpy integer too)
    except TypeError:
        given = 0
    if given < 1:
        raise ConfigError("train_data", f"has num_classes {getattr(train_data, 'num_classes')!r}; it must be a "
                                        "positive integer")
    for name, data in (("train_data", train_data), ("test_data", test_data)):
        if len(data.y) and int(data.y.max()) >= given:
            raise ConfigError(name, f"holds the label {int(data.y.max())}, but the data has {given} classes "
                                    f"(labels 0..{given - 1}); fix the labels or num_classes")
    return given


def check_model(module: nn.Module, train_data, test_data, classes: int) -> None:
    """``module`` takes the data's samples (shape and dtype) and scores at least ``classes`` classes:
    one forward pass of two training samples, in eval mode, without gradients or random draws."""
    x = train_data.x
    weights = next((p for p in module.parameters()), None)
    for name, data in (("train_data", train_data), ("test_data", test_data)):
        if not isinstance(data.x, torch.Tensor) or not data.x.is_floating_point():
            shown = data.x.dtype if isinstance(data.x, torch.Tensor) else type(data.x).__name__
            raise ConfigError(name, f"holds samples of type {shown}; samples are a floating-point tensor")
        if weights is not None and data.x.dtype != weights.dtype:
            raise ConfigError(name, f"holds {data.x.dtype} samples, but the model's weights are {weights.dtype}; "
                                    f"convert the samples (x.to({weights.dtype})) or the model")
    sample = x[:2].to(weights.device if weights is not None else x.device)
    modes = [(m, m.training) for m in module.modules()]   # each put back as it was
    try:
        module.eval()
        with torch.no_grad(), torch.random.fork_rng(devices=[]):
            out = module(sample)
    except Exception as e:   # torch's shape and type errors, or the model's own
        first = (str(e).splitlines() or [type(e).__name__])[0][:160]
        raise ConfigError("model", f"cannot take the data's samples of shape {tuple(x.shape[1:])} ({first}); "
                                   "give a model built for them") from None
    finally:
        for m, training in modes:
            m.training = training
    if not isinstance(out, torch.Tensor) or out.dim() != 2 or out.shape[0] != len(sample):
        shown = tuple(out.shape) if isinstance(out, torch.Tensor) else type(out).__name__
        raise ConfigError("model", f"returns {shown} for a batch of {len(sample)} samples; it must return one row "
                                   "of class scores per sample")
    if out.shape[1] < classes:
        raise ConfigError("model", f"returns {out.shape[1]} class scores per sample, but the data has {classes} "
                                   f"classes (labels 0..{classes - 1}); give it a head of {classes} outputs")
