"""Whether a model fits the data it is to train on, checked by ``train`` before anything runs.

The command line builds its model for the data (``models/``) from data sets that ``data/`` has checked;
``stalegrad.train`` takes any ``nn.Module`` and any ``x``/``y`` tensors. Without these checks a model of the
wrong input shape, a head with fewer outputs than the data has classes, float or out-of-range labels and
samples of another dtype than the weights all failed mid-run with torch's own error; here each is one
``ConfigError`` naming the parameter, before the first step. So are ``train``'s other arguments
(``check_arguments``): data sets without ``x`` and ``y`` tensors, a ``config`` that is no ``RunConfig``, a
callback that cannot be called, a ``checkpoint_path`` without ``checkpoint_every``.
"""
from __future__ import annotations

import operator

import torch
from torch import nn

from ..errors import ConfigError


def check_arguments(train_data, test_data, config, callbacks: dict) -> None:
    """``train``'s arguments besides the options: ConfigError naming the first that ``train`` cannot use (an
    AttributeError from deep inside before, or, for a callback, a TypeError mid-run)."""
    from .config import RunConfig
    for name, data in (("train_data", train_data), ("test_data", test_data)):
        if not all(isinstance(getattr(data, k, None), torch.Tensor) for k in ("x", "y")):
            raise ConfigError(name, f"must be a data set with x and y tensors (a stalegrad.data.Dataset, or any "
                                    f"object with x and y), not {type(data).__name__}; for tensors (x, y) give "
                                    "types.SimpleNamespace(x=x, y=y)")
    if config is not None and not isinstance(config, RunConfig):
        raise ConfigError("config", f"must be a RunConfig, not {type(config).__name__}; give the options as "
                                    "keywords (algorithm='asgd', epochs=2) or config=RunConfig(...)")
    for name, hook in callbacks.items():
        if hook is not None and not callable(hook):
            raise ConfigError(name, f"must be a function or None, not {type(hook).__name__}")


def check_checkpoint(config, checkpoint_path) -> None:
    """A (validated) configuration's checkpoints have a file, and a file has checkpoints (never dropped silently)."""
    if config.checkpoint_every and checkpoint_path is None:
        raise ConfigError("checkpoint_path", "is needed by checkpoint_every: the file to write checkpoints to")
    if checkpoint_path is not None and not config.checkpoint_every:
        raise ConfigError("checkpoint_path", "is given, but checkpoint_every is 0, so no checkpoint would be written "
                                             "there; give checkpoint_every=N (server updates) too, or drop "
                                             "checkpoint_path")


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
    trained = [p for p in module.parameters() if p.requires_grad]
    if not trained:
        raise ConfigError("model", "has no trainable parameters (none with requires_grad); give it some to train")
    if other := next((p.dtype for p in trained if p.dtype != torch.float32), None):
        raise ConfigError("model", f"has {other} parameters, but the server trains one float32 vector of weights; "
                                   "convert the model (model.float()) and its samples (x.float())")
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
