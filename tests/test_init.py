"""stalegrad.models.init: Keras-style glorot-uniform and He-normal re-initialisation.

Expected bounds and standard deviations are computed here from the layer
shapes by hand, not with torch's fan helper. Before each re-initialisation
every Linear/Conv parameter is filled with NaN, so a layer the scheme missed
cannot pass by keeping its build-time values (ResNet-20 already builds its
convs He-normal)."""
import math
import subprocess
import sys

import pytest
import torch
from torch import nn

from stalegrad.errors import ConfigError
from stalegrad.models import build_model
from stalegrad.models.init import INITS, initialise

MNIST = (1, 28, 28)
CIFAR = (3, 32, 32)
BIG = 1000   # statistics are only checked on layers with at least this many weights
LAYERS = (nn.Linear, nn.Conv2d)


def _layers(model):
    return [(name, m) for name, m in model.named_modules() if isinstance(m, LAYERS)]


def _poison(model):
    with torch.no_grad():
        for _, layer in _layers(model):
            for p in layer.parameters(recurse=False):
                if not isinstance(p, nn.parameter.UninitializedParameter):
                    p.fill_(float("nan"))


def _fans(weight):
    # Linear (out, in); Conv2d (out, in, kh, kw): receptive field = kh*kw.
    out_ch, in_ch, *kernel = weight.shape
    field = math.prod(kernel)
    return in_ch * field, out_ch * field


def _build(name, shape, seed=0):
    torch.manual_seed(seed)
    return build_model(name, shape, 10)


def _weights(model):
    return [p.detach().clone() for p in model.parameters()]


def _biases_zero(layer):
    return layer.bias is None or torch.equal(layer.bias, torch.zeros_like(layer.bias))


# --- glorot-uniform ----------------------------------------------------------

@pytest.mark.parametrize("name,shape", [("agn-mlp", MNIST), ("cnn", MNIST), ("cnn", CIFAR)])
def test_glorot_uniform_draws_within_the_keras_bound(name, shape):
    model = _build(name, shape)
    _poison(model)
    torch.manual_seed(1)
    assert initialise(model, "glorot-uniform") == []
    layers = _layers(model)
    assert len(layers) == 4
    for lname, layer in layers:
        w = layer.weight.detach()
        fan_in, fan_out = _fans(w)
        a = math.sqrt(6 / (fan_in + fan_out))
        assert torch.isfinite(w).all(), lname
        assert w.abs().max() <= a, lname
        assert layer.bias is not None and _biases_zero(layer), lname
        n = w.numel()
        if n >= BIG:
            # std of uniform(-a, a) is a/sqrt(3); the estimate's relative error is ~0.45/sqrt(n)
            tol = max(0.02, 5 * 0.45 / math.sqrt(n))
            assert w.std().item() == pytest.approx(a / math.sqrt(3), rel=tol), lname
            assert w.abs().max() > 0.95 * a, lname   # P(all n below 0.95a) = 0.95**n
            assert abs(w.mean().item()) < 5 * a / math.sqrt(3 * n), lname


def test_glorot_uniform_bound_of_the_agn_mlp_layers():
    # The AGN paper's 784-1000-2000-1000-10 network, bounds spelled out.
    model = _build("agn-mlp", MNIST)
    initialise(model, "glorot-uniform")
    shapes = [tuple(m.weight.shape) for _, m in _layers(model)]
    assert shapes == [(1000, 784), (2000, 1000), (1000, 2000), (10, 1000)]
    bounds = [math.sqrt(6 / 1784), math.sqrt(6 / 3000), math.sqrt(6 / 3000), math.sqrt(6 / 1010)]
    for (_, layer), a in zip(_layers(model), bounds):
        assert a * 0.95 < layer.weight.abs().max().item() <= a


# --- he-normal ---------------------------------------------------------------

@pytest.mark.parametrize("name,shape", [("resnet20", CIFAR), ("cnn", CIFAR), ("agn-mlp", MNIST)])
def test_he_normal_std_is_sqrt_two_over_fan_in(name, shape):
    model = _build(name, shape)
    _poison(model)
    torch.manual_seed(1)
    assert initialise(model, "he-normal") == []
    checked = 0
    for lname, layer in _layers(model):
        w = layer.weight.detach()
        assert torch.isfinite(w).all(), lname
        assert _biases_zero(layer), lname
        n = w.numel()
        if n < BIG:
            continue
        fan_in, _ = _fans(w)
        std = math.sqrt(2 / fan_in)
        # relative error of a normal's sample std is ~1/sqrt(2n): 2.2% at n=1000
        assert w.std().item() == pytest.approx(std, rel=0.10 if n < 10_000 else 0.05), lname
        assert abs(w.mean().item()) < 5 * std / math.sqrt(n), lname
        checked += 1
    assert checked >= 2


def test_he_normal_leaves_batchnorm_at_its_defaults():
    model = _build("resnet20", CIFAR)
    initialise(model, "he-normal")
    norms = [m for m in model.modules() if isinstance(m, nn.BatchNorm2d)]
    assert len(norms) == 19   # one after the stem conv, two per block
    for bn in norms:
        assert torch.equal(bn.weight, torch.ones_like(bn.weight))
        assert torch.equal(bn.bias, torch.zeros_like(bn.bias))
        assert torch.equal(bn.running_mean, torch.zeros_like(bn.running_mean))
        assert torch.equal(bn.running_var, torch.ones_like(bn.running_var))
    assert torch.equal(model.fc.bias, torch.zeros_like(model.fc.bias))


@pytest.mark.parametrize("scheme", ["glorot-uniform", "he-normal"])
def test_norm_layers_are_left_alone_not_reset(scheme):
    model = nn.Sequential(nn.Linear(4, 4), nn.BatchNorm1d(4), nn.LayerNorm(4), nn.GroupNorm(2, 4))
    with torch.no_grad():
        for m in list(model)[1:]:
            m.weight.fill_(0.5)
            m.bias.fill_(0.25)
    assert initialise(model, scheme) == []
    for m in list(model)[1:]:
        assert (m.weight == 0.5).all() and (m.bias == 0.25).all()


# --- torch, determinism ------------------------------------------------------

@pytest.mark.parametrize("name,shape", [("agn-mlp", MNIST), ("cnn", CIFAR), ("resnet20", CIFAR)])
def test_torch_scheme_leaves_the_module_bit_identical(name, shape):
    model = _build(name, shape, seed=3)
    assert initialise(model, "torch") == []
    after = torch.rand(5)   # and it drew nothing from the global RNG
    fresh = _build(name, shape, seed=3)
    for a, b in zip(_weights(model), _weights(fresh), strict=True):
        assert torch.equal(a, b)
    assert torch.equal(after, torch.rand(5))


@pytest.mark.parametrize("scheme", ["glorot-uniform", "he-normal"])
def test_same_seed_same_weights_other_seed_other_weights(scheme):
    def run(seed):
        model = _build("cnn", CIFAR, seed=0)   # same build; only the init seed varies
        torch.manual_seed(seed)
        initialise(model, scheme)
        return _weights(model)

    first, again, other = run(7), run(7), run(8)
    assert all(torch.equal(a, b) for a, b in zip(first, again, strict=True))
    weights = [i for i, p in enumerate(first) if p.dim() > 1]
    assert weights and all(not torch.equal(first[i], other[i]) for i in weights)


# --- what is not touched -----------------------------------------------------

class _Gain(nn.Module):
    def __init__(self):
        super().__init__()
        self.gain = nn.Parameter(torch.full((8,), 3.0))

    def forward(self, x):
        return x * self.gain


class _User(nn.Module):
    def __init__(self):
        super().__init__()
        self.temperature = nn.Parameter(torch.tensor(2.0))   # directly on the root
        self.embed = nn.Embedding(10, 4)
        self.body = nn.Sequential(nn.Linear(4, 8), _Gain(), nn.LayerNorm(8), nn.ReLU())
        self.head = nn.Linear(8, 2, bias=False)


@pytest.mark.parametrize("scheme", ["glorot-uniform", "he-normal"])
def test_user_module_reinitialises_linears_and_names_the_rest(scheme):
    torch.manual_seed(0)
    model = _User()
    embed, gain = model.embed.weight.detach().clone(), model.body[1].gain.detach().clone()
    _poison(model)
    untouched = initialise(model, scheme)
    assert untouched == ["(root)", "embed", "body.1"]
    for layer in (model.body[0], model.head):
        w = layer.weight
        fan_in, fan_out = w.shape[1], w.shape[0]
        bound = math.sqrt(6 / (fan_in + fan_out)) if scheme == "glorot-uniform" else 6 * math.sqrt(2 / fan_in)
        assert torch.isfinite(w).all() and w.abs().max() <= bound
    assert torch.equal(model.body[0].bias, torch.zeros(8))
    assert model.temperature.item() == 2.0
    assert torch.equal(model.embed.weight, embed) and torch.equal(model.body[1].gain, gain)


def test_other_parameterised_layers_are_reported_by_name():
    class LinearWithScale(nn.Linear):
        def __init__(self):
            super().__init__(3, 3)
            self.scale = nn.Parameter(torch.ones(3))

    model = nn.Sequential(
        nn.Conv1d(2, 4, 3), nn.Conv3d(2, 4, 3),          # 0, 1: redrawn
        nn.ConvTranspose2d(2, 4, 3), nn.GRU(3, 3),       # 2, 3: reported
        nn.PReLU(), LinearWithScale(),                   # 4, 5: reported; 5's weight redrawn
        nn.utils.parametrizations.spectral_norm(nn.Linear(3, 3)),   # 6: reported once
        nn.LazyLinear(3),                                # 7: not materialised yet
    )
    _poison(model)
    assert initialise(model, "glorot-uniform") == ["2", "3", "4", "5", "6", "7"]
    for i in (0, 1):
        assert torch.isfinite(model[i].weight).all() and _biases_zero(model[i])
    assert torch.isfinite(model[5].weight).all() and _biases_zero(model[5])
    assert torch.isnan(model[5].scale).all()   # its extra parameter: left as it was


@pytest.mark.filterwarnings("ignore:Initializing zero-element tensors")   # torch's, building Linear(0, 3)
def test_shared_layer_is_drawn_once_and_zero_width_layer_is_skipped():
    shared = nn.Linear(4, 4)
    model = nn.Sequential(shared, nn.ReLU(), shared, nn.Linear(0, 3))
    torch.manual_seed(0)
    assert initialise(model, "he-normal") == []
    torch.manual_seed(0)
    expected = torch.empty(4, 4).normal_(0.0, math.sqrt(2 / 4))
    assert torch.equal(shared.weight, expected)


# --- errors, imports ---------------------------------------------------------

@pytest.mark.parametrize("bad", ["glorot", "He-Normal", "", None, 3])
def test_unknown_scheme_raises_config_error_naming_init(bad):
    model = nn.Linear(3, 3)
    before = model.weight.detach().clone()
    with pytest.raises(ConfigError) as info:
        initialise(model, bad)
    assert info.value.param == "init"
    assert str(info.value) == f"init must be one of torch, glorot-uniform, he-normal, got {bad!r}"
    assert torch.equal(model.weight, before)


def test_inits_lists_the_schemes_and_import_needs_no_torch():
    assert INITS == ("torch", "glorot-uniform", "he-normal")
    code = ("import sys, stalegrad.models.init as m; assert m.INITS[0] == 'torch'; "
            "assert 'torch' not in sys.modules, 'torch was imported'")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
