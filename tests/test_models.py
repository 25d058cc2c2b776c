import math

import pytest
import torch
import torch.nn.functional as F

from stalegrad.models import MODELS, ModelError, build_model, count_parameters

DIGITS = (1, 8, 8)
MNIST = (1, 28, 28)
CIFAR = (3, 32, 32)
FLAT = (32,)

IMAGE_CASES = [(name, shape) for name in MODELS for shape in (DIGITS, MNIST, CIFAR)]
FLAT_CASES = [(name, FLAT) for name in ("logreg", "mlp", "agn-mlp")]


def _flat_params(model):
    return torch.cat([p.detach().reshape(-1) for p in model.parameters()])


# --- shapes ------------------------------------------------------------------

@pytest.mark.parametrize("name,shape", IMAGE_CASES + FLAT_CASES)
def test_output_is_logits_per_sample(name, shape):
    torch.manual_seed(0)
    model = build_model(name, shape, 10)
    out = model(torch.randn(4, *shape))
    assert out.shape == (4, 10)
    assert torch.isfinite(out).all()


@pytest.mark.parametrize("name", ["cnn", "resnet20"])
@pytest.mark.parametrize("shape", [(3, 9, 11), (2, 8, 15)])
def test_conv_nets_accept_odd_and_non_square_images(name, shape):
    model = build_model(name, shape, 7)
    assert model(torch.randn(2, *shape)).shape == (2, 7)


def test_models_accept_list_shapes():
    assert build_model("logreg", [1, 8, 8], 3)(torch.randn(2, 1, 8, 8)).shape == (2, 3)


# --- parameter counts ----------------------------------------------------------

def _linear(i, o):
    return i * o + o


def test_logreg_count_on_digits():
    assert count_parameters(build_model("logreg", DIGITS, 10)) == 64 * 10 + 10


def test_mlp_default_count_on_digits():
    expected = _linear(64, 256) + _linear(256, 128) + _linear(128, 10)
    assert count_parameters(build_model("mlp", DIGITS, 10)) == expected


def test_mlp_custom_hidden_count():
    model = build_model("mlp", FLAT, 4, hidden=(5, 6, 7))
    expected = _linear(32, 5) + _linear(5, 6) + _linear(6, 7) + _linear(7, 4)
    assert count_parameters(model) == expected
    assert model(torch.randn(3, 32)).shape == (3, 4)


def test_agn_mlp_count_on_mnist_matches_paper():
    model = build_model("agn-mlp", MNIST, 10)
    assert count_parameters(model) == 4_798_010
    assert (_linear(784, 1000) + _linear(1000, 2000) + _linear(2000, 1000)
            + _linear(1000, 10)) == 4_798_010


def test_cnn_count_follows_image_size():
    # conv3x3(C,32) + conv3x3(32,64) + Linear(64*(H//4)*(W//4),128) + Linear(128,k)
    def expected(c, h, w, k):
        return (9 * c * 32 + 32) + (9 * 32 * 64 + 64) + _linear(64 * (h // 4) * (w // 4), 128) + _linear(128, k)

    assert count_parameters(build_model("cnn", CIFAR, 10)) == expected(3, 32, 32, 10)
    assert count_parameters(build_model("cnn", (1, 9, 13), 5)) == expected(1, 9, 13, 5)


def _resnet20_count(in_channels, num_classes):
    conv3 = lambda i, o: 9 * i * o  # noqa: E731 - bias-free 3x3 conv
    bn = lambda c: 2 * c  # noqa: E731 - gamma and beta
    stem = conv3(in_channels, 16) + bn(16)
    stage1 = 3 * (2 * conv3(16, 16) + 2 * bn(16))
    # First block of stages 2 and 3 widens; option-A shortcuts add nothing.
    stage2 = conv3(16, 32) + 5 * conv3(32, 32) + 6 * bn(32)
    stage3 = conv3(32, 64) + 5 * conv3(64, 64) + 6 * bn(64)
    fc = 64 * num_classes + num_classes
    return stem + stage1 + stage2 + stage3 + fc


def test_resnet20_count_on_cifar10():
    n = count_parameters(build_model("resnet20", CIFAR, 10))
    assert n == _resnet20_count(3, 10) == 269_722
    assert round(n / 1e6, 2) == 0.27


def test_resnet20_count_on_mnist_differs_only_in_stem():
    n = count_parameters(build_model("resnet20", MNIST, 10))
    assert n == _resnet20_count(1, 10) == 269_722 - 9 * 2 * 16


def test_resnet20_counts_buffers_separately():
    # BatchNorm running stats are buffers, not parameters.
    model = build_model("resnet20", CIFAR, 10)
    assert sum(b.numel() for b in model.buffers() if b.is_floating_point()) == 2 * (16 + 6 * 16 + 6 * 32 + 6 * 64)


# --- errors --------------------------------------------------------------------

@pytest.mark.parametrize("name", ["cnn", "resnet20"])
def test_conv_nets_reject_flat_input(name):
    with pytest.raises(ModelError) as exc:
        build_model(name, FLAT, 10)
    msg = str(exc.value)
    assert f"model '{name}'" in msg
    assert "(C,H,W)" in msg and "(32,)" in msg
    assert "use mlp or logreg" in msg
    assert "\n" not in msg


def test_cnn_flat_message_exact():
    with pytest.raises(ModelError) as exc:
        build_model("cnn", FLAT, 10)
    assert str(exc.value) == (
        "model 'cnn' needs image input (C,H,W); dataset has flat input of shape (32,); "
        "use mlp or logreg")


@pytest.mark.parametrize("name", ["cnn", "resnet20"])
@pytest.mark.parametrize("shape", [(1, 7, 8), (3, 32, 4), (28, 28)])
def test_conv_nets_reject_small_or_2d_images(name, shape):
    with pytest.raises(ModelError) as exc:
        build_model(name, shape, 10)
    msg = str(exc.value)
    assert f"model '{name}'" in msg and "use mlp or logreg" in msg


def test_unknown_model():
    with pytest.raises(ModelError) as exc:
        build_model("vgg16", CIFAR, 10)
    assert str(exc.value) == (
        "unknown model 'vgg16'; choose one of logreg, mlp, agn-mlp, cnn, resnet20")


def test_model_error_is_value_error():
    assert issubclass(ModelError, ValueError)


@pytest.mark.parametrize("hidden", [(0,), (128, -1), (64.0,), (True,), (), 256, "256"])
def test_mlp_rejects_bad_hidden(hidden):
    with pytest.raises(ModelError) as exc:
        build_model("mlp", DIGITS, 10, hidden=hidden)
    assert "model 'mlp'" in str(exc.value)


def test_mlp_empty_hidden_points_to_logreg():
    with pytest.raises(ModelError, match="use logreg"):
        build_model("mlp", DIGITS, 10, hidden=())


def test_mlp_accepts_hidden_list():
    model = build_model("mlp", DIGITS, 10, hidden=[16])
    assert count_parameters(model) == _linear(64, 16) + _linear(16, 10)


@pytest.mark.parametrize("name", ["agn-mlp", "logreg", "cnn", "resnet20"])
def test_hidden_rejected_for_fixed_models(name):
    with pytest.raises(ModelError) as exc:
        build_model(name, CIFAR, 10, hidden=(64,))
    msg = str(exc.value)
    assert f"model '{name}'" in msg and "hidden" in msg and "use mlp" in msg


@pytest.mark.parametrize("shape", [(), (0, 8, 8), (-1,), (3.0, 32, 32), 32])
def test_bad_input_shape(shape):
    with pytest.raises(ModelError, match="input_shape"):
        build_model("mlp", shape, 10)


@pytest.mark.parametrize("k", [0, 1, 2.0, True])
def test_bad_num_classes(k):
    with pytest.raises(ModelError, match="num_classes"):
        build_model("logreg", DIGITS, k)


# --- initialisation and gradients -------------------------------------------------

@pytest.mark.parametrize("name", MODELS)
def test_same_seed_same_init(name):
    shape = CIFAR if name == "agn-mlp" else DIGITS  # any valid shape will do
    torch.manual_seed(123)
    a = _flat_params(build_model(name, shape, 10))
    torch.manual_seed(123)
    b = _flat_params(build_model(name, shape, 10))
    torch.manual_seed(124)
    c = _flat_params(build_model(name, shape, 10))
    assert torch.equal(a, b)
    assert not torch.equal(a, c)


def test_build_model_does_not_reseed():
    torch.manual_seed(5)
    a = _flat_params(build_model("mlp", DIGITS, 10))
    b = _flat_params(build_model("mlp", DIGITS, 10))
    assert not torch.equal(a, b)


def test_resnet20_convs_are_kaiming_normal():
    torch.manual_seed(0)
    model = build_model("resnet20", CIFAR, 10)
    convs = [m for m in model.modules() if isinstance(m, torch.nn.Conv2d)]
    assert len(convs) == 19  # 1 stem + 9 blocks * 2; plus the fc makes 20 layers
    # The widest convs have 36,864 weights: std within a few percent of He's.
    w = convs[-1].weight.detach()
    fan_in = w.shape[1] * 9
    assert w.std().item() == pytest.approx(math.sqrt(2 / fan_in), rel=0.05)
    # PyTorch's default init would be ~sqrt(1/(3*fan_in)), far below that.
    assert w.std().item() > 2 * math.sqrt(1 / (3 * fan_in))


@pytest.mark.parametrize("name,shape", [("logreg", DIGITS), ("mlp", DIGITS), ("cnn", DIGITS),
                                        ("cnn", CIFAR), ("resnet20", DIGITS)])
def test_gradients_reach_every_parameter(name, shape):
    torch.manual_seed(0)
    model = build_model(name, shape, 10)
    x = torch.randn(16, *shape)
    y = torch.randint(0, 10, (16,))
    F.cross_entropy(model(x), y).backward()
    for pname, p in model.named_parameters():
        assert p.grad is not None, pname
        assert p.grad.abs().sum() > 0, pname
