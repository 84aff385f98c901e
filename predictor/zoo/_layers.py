"""Building blocks shared by the zoo's families (plain torch, no torchvision)."""

from __future__ import annotations

import torch
from torch import nn


def divisible(channels: float, divisor: int = 8) -> int:
    """Round a width-scaled channel count to a multiple of ``divisor`` (>= divisor)."""
    value = max(divisor, int(channels + divisor / 2) // divisor * divisor)
    if value < 0.9 * channels:  # never shrink by more than 10%, as MobileNet's rule says
        value += divisor
    return value


class ConvBNAct(nn.Sequential):
    """Conv2d (no bias) + BatchNorm + activation, padding keeping the size at stride 1."""

    def __init__(
        self,
        cin: int,
        cout: int,
        kernel: int = 3,
        stride: int = 1,
        groups: int = 1,
        act: type[nn.Module] | None = nn.ReLU,
    ):
        layers: list[nn.Module] = [
            nn.Conv2d(cin, cout, kernel, stride, (kernel - 1) // 2, groups=groups, bias=False),
            nn.BatchNorm2d(cout),
        ]
        if act is not None:
            layers.append(act())
        super().__init__(*layers)


class SqueezeExcite(nn.Module):
    """Squeeze-and-excitation gate (MobileNetV3, MNASNet-A variants)."""

    def __init__(self, channels: int, squeeze: int):
        super().__init__()
        self.pool = nn.AdaptiveAvgPool2d(1)
        self.fc1 = nn.Conv2d(channels, squeeze, 1)
        self.fc2 = nn.Conv2d(squeeze, channels, 1)
        self.act = nn.ReLU()
        self.gate = nn.Hardsigmoid()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * self.gate(self.fc2(self.act(self.fc1(self.pool(x)))))


class Classifier(nn.Sequential):
    """Global average pool, flatten and a linear layer (optionally with dropout)."""

    def __init__(self, cin: int, num_classes: int, dropout: float = 0.0):
        layers: list[nn.Module] = [nn.AdaptiveAvgPool2d(1), nn.Flatten()]
        if dropout > 0:
            layers.append(nn.Dropout(dropout))
        layers.append(nn.Linear(cin, num_classes))
        super().__init__(*layers)


def image_input(batch_size: int, resolution: int = 224, channels: int = 3) -> torch.Tensor:
    """A deterministic image batch of shape (batch, channels, resolution, resolution)."""
    generator = torch.Generator().manual_seed(0)
    return torch.randn(batch_size, channels, resolution, resolution, generator=generator)


def token_input(batch_size: int, seq_len: int = 200, vocab: int = 10000) -> torch.Tensor:
    """A deterministic int64 token batch of shape (batch, seq_len)."""
    generator = torch.Generator().manual_seed(0)
    return torch.randint(0, vocab, (batch_size, seq_len), generator=generator)
