"""The networks of the model zoo (see ``stalegrad.models`` for names and checks)."""
from __future__ import annotations

from typing import Sequence

import torch
import torch.nn.functional as F
from torch import Tensor, nn


def mlp(in_features: int, hidden: Sequence[int], num_classes: int) -> nn.Sequential:
    layers: list[nn.Module] = [nn.Flatten()]
    width = in_features
    for size in hidden:
        layers += [nn.Linear(width, size), nn.ReLU()]
        width = size
    layers.append(nn.Linear(width, num_classes))
    return nn.Sequential(*layers)


# --- small convnet -----------------------------------------------------------

def cnn(channels: int, height: int, width: int, num_classes: int) -> nn.Sequential:
    # Padded 3x3 convs keep the size and each 2x2 max-pool floors it by half,
    # so after two stages an HxW image is (H//4)x(W//4), odd sizes included.
    flat = 64 * (height // 4) * (width // 4)
    return nn.Sequential(
        nn.Conv2d(channels, 32, kernel_size=3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
        nn.Conv2d(32, 64, kernel_size=3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
        nn.Flatten(),
        nn.Linear(flat, 128), nn.ReLU(),
        nn.Linear(128, num_classes),
    )


# --- ResNet-20 ---------------------------------------------------------------

class _BasicBlock(nn.Module):
    """Two 3x3 conv-BN layers plus a parameter-free shortcut ("option A").

    Option A keeps the shortcut free of weights, which is what gives the
    paper's 0.27M parameters: when a block halves the resolution and widens
    the channels, the shortcut subsamples every other pixel and pads the new
    channels with zeros instead of using a 1x1 projection conv.
    """

    def __init__(self, in_channels: int, out_channels: int, stride: int) -> None:
        super().__init__()
        # No conv bias: BatchNorm's beta right after makes it redundant.
        self.conv1 = nn.Conv2d(in_channels, out_channels, 3, stride=stride,
                               padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(out_channels)
        self.conv2 = nn.Conv2d(out_channels, out_channels, 3, stride=1,
                               padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(out_channels)
        self.stride = stride
        self.extra_channels = out_channels - in_channels

    def _shortcut(self, x: Tensor) -> Tensor:
        if self.stride != 1:
            # Picks the same pixels as a stride-2, padding-1 3x3 conv centres
            # on, so the size is ceil(H/2) on both branches even for odd H.
            x = x[:, :, ::self.stride, ::self.stride]
        if self.extra_channels:
            # F.pad lists dimensions from the last one backwards: (W, H, C).
            x = F.pad(x, (0, 0, 0, 0, 0, self.extra_channels))
        return x

    def forward(self, x: Tensor) -> Tensor:
        out = F.relu(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        return F.relu(out + self._shortcut(x))


class ResNet20(nn.Module):
    """CIFAR ResNet-20: a 3x3 conv, then three stages of three basic blocks
    with 16, 32 and 64 channels (stride 2 entering stages 2 and 3), global
    average pooling and a linear classifier. 6n+2 layers with n=3."""

    STAGE_CHANNELS = (16, 32, 64)
    BLOCKS_PER_STAGE = 3

    def __init__(self, in_channels: int, num_classes: int) -> None:
        super().__init__()
        first = self.STAGE_CHANNELS[0]
        self.conv = nn.Conv2d(in_channels, first, 3, stride=1, padding=1, bias=False)
        self.bn = nn.BatchNorm2d(first)
        blocks: list[nn.Module] = []
        width = first
        for stage, channels in enumerate(self.STAGE_CHANNELS):
            for i in range(self.BLOCKS_PER_STAGE):
                stride = 2 if stage > 0 and i == 0 else 1
                blocks.append(_BasicBlock(width, channels, stride))
                width = channels
        self.blocks = nn.Sequential(*blocks)
        self.fc = nn.Linear(width, num_classes)
        # He et al. initialise convs as in their 2015 "delving deep" paper;
        # PyTorch's default (Kaiming-uniform with a=sqrt(5)) is much narrower
        # and trains this depth noticeably slower.
        for module in self.modules():
            if isinstance(module, nn.Conv2d):
                nn.init.kaiming_normal_(module.weight, nonlinearity="relu")

    def forward(self, x: Tensor) -> Tensor:
        out = F.relu(self.bn(self.conv(x)))
        out = self.blocks(out)
        out = torch.flatten(F.adaptive_avg_pool2d(out, 1), 1)
        return self.fc(out)
