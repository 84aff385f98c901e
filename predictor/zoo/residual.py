"""Deep CNN families: ResNet, VGG, GoogLeNet, DenseNet, DPN, ResNeXt, PyramidNet."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from predictor.zoo._layers import Classifier, ConvBNAct


class BasicBlock(nn.Module):
    """Two 3x3 convolutions with an identity (or 1x1 projection) shortcut."""

    expansion = 1

    def __init__(self, cin: int, planes: int, stride: int = 1, groups: int = 1, base: int = 64):
        super().__init__()
        self.body = nn.Sequential(
            ConvBNAct(cin, planes, 3, stride), ConvBNAct(planes, planes, 3, act=None)
        )
        self.shortcut = _projection(cin, planes, stride)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.relu(self.body(x) + self.shortcut(x))


class Bottleneck(nn.Module):
    """1x1 reduce, 3x3 (grouped for ResNeXt), 1x1 expand by 4, with shortcut."""

    expansion = 4

    def __init__(self, cin: int, planes: int, stride: int = 1, groups: int = 1, base: int = 64):
        super().__init__()
        mid = int(planes * base / 64) * groups
        cout = planes * self.expansion
        self.body = nn.Sequential(
            ConvBNAct(cin, mid, 1),
            ConvBNAct(mid, mid, 3, stride, groups=groups),
            ConvBNAct(mid, cout, 1, act=None),
        )
        self.shortcut = _projection(cin, cout, stride)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.relu(self.body(x) + self.shortcut(x))


def _projection(cin: int, cout: int, stride: int) -> nn.Module:
    if stride == 1 and cin == cout:
        return nn.Identity()
    return ConvBNAct(cin, cout, 1, stride, act=None)


class ResNet(nn.Module):
    """He et al. 2016 ImageNet ResNet; ``bottleneck`` picks the block, ``width`` the base."""

    def __init__(
        self,
        layers: tuple[int, ...] = (3, 4, 6, 3),
        bottleneck: bool = True,
        width: float = 1.0,
        groups: int = 1,
        base_width: int = 64,
        num_classes: int = 1000,
    ):
        super().__init__()
        block = Bottleneck if bottleneck else BasicBlock
        base = max(8, int(64 * width))
        stem: list[nn.Module] = [ConvBNAct(3, base, 7, 2), nn.MaxPool2d(3, 2, 1)]
        cin = base
        stages: list[nn.Module] = []
        for i, n in enumerate(layers):
            planes = base * 2**i
            for j in range(n):
                stride = 2 if i > 0 and j == 0 else 1
                stages.append(block(cin, planes, stride, groups, base_width))
                cin = planes * block.expansion
        self.features = nn.Sequential(*stem, *stages)
        self.classifier = Classifier(cin, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.classifier(self.features(x))


class ResNeXtCifar(nn.Module):
    """ResNeXt for 32x32 inputs (Xie et al. 2017): depth 9n+2, cardinality x width."""

    def __init__(
        self, depth: int = 29, cardinality: int = 2, width: int = 64, num_classes: int = 10
    ):
        super().__init__()
        if (depth - 2) % 9:
            raise ValueError("resnext depth must be 9n+2 (11, 29, ...)")
        n = (depth - 2) // 9
        layers: list[nn.Module] = [ConvBNAct(3, 64, 3)]
        cin = 64
        for i in range(3):
            planes = 64 * 2**i
            for j in range(n):
                stride = 2 if i > 0 and j == 0 else 1
                layers.append(Bottleneck(cin, planes, stride, cardinality, width * 64 // planes))
                cin = planes * Bottleneck.expansion
        self.features = nn.Sequential(*layers)
        self.classifier = Classifier(cin, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.classifier(self.features(x))


class PyramidBlock(nn.Module):
    """PyramidNet basic block: BN-conv-BN-ReLU-conv-BN, zero-padded channel shortcut."""

    def __init__(self, cin: int, cout: int, stride: int):
        super().__init__()
        self.body = nn.Sequential(
            nn.BatchNorm2d(cin),
            nn.Conv2d(cin, cout, 3, stride, 1, bias=False),
            nn.BatchNorm2d(cout),
            nn.ReLU(),
            nn.Conv2d(cout, cout, 3, 1, 1, bias=False),
            nn.BatchNorm2d(cout),
        )
        self.pool = nn.AvgPool2d(2, ceil_mode=True) if stride > 1 else nn.Identity()
        self.pad = cout - cin

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        shortcut = self.pool(x)
        if self.pad:
            shortcut = F.pad(shortcut, (0, 0, 0, 0, 0, self.pad))
        return self.body(x) + shortcut


class PyramidNetCifar(nn.Module):
    """Han et al. 2017: widths grow by ``alpha`` over all 3n blocks (depth 6n+2)."""

    def __init__(self, depth: int = 110, alpha: int = 48, num_classes: int = 10):
        super().__init__()
        if (depth - 2) % 6:
            raise ValueError("pyramidnet depth must be 6n+2")
        n = (depth - 2) // 6
        layers: list[nn.Module] = [nn.Conv2d(3, 16, 3, 1, 1, bias=False), nn.BatchNorm2d(16)]
        width, cin = 16.0, 16
        for i in range(3 * n):
            width += alpha / (3 * n)
            stride = 2 if i in (n, 2 * n) else 1
            layers.append(PyramidBlock(cin, int(round(width)), stride))
            cin = int(round(width))
        layers += [nn.BatchNorm2d(cin), nn.ReLU()]
        self.features = nn.Sequential(*layers)
        self.classifier = Classifier(cin, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.classifier(self.features(x))


class VGG(nn.Module):
    """Simonyan & Zisserman 2015 with batch norm; the classifier follows ``resolution``."""

    _CFGS = {
        11: (64, "M", 128, "M", 256, 256, "M", 512, 512, "M", 512, 512, "M"),
        19: (
            64,
            64,
            "M",
            128,
            128,
            "M",
            256,
            256,
            256,
            256,
            "M",
            512,
            512,
            512,
            512,
            "M",
            512,
            512,
            512,
            512,
            "M",
        ),
    }

    def __init__(
        self, depth: int = 11, width: float = 1.0, resolution: int = 224, num_classes: int = 1000
    ):
        super().__init__()
        layers: list[nn.Module] = []
        cin = 3
        for item in self._CFGS[depth]:
            if item == "M":
                layers.append(nn.MaxPool2d(2, 2))
                continue
            cout = max(8, int(item * width))
            layers.append(ConvBNAct(cin, cout, 3))
            cin = cout
        self.features = nn.Sequential(*layers)
        spatial = max(1, resolution // 32)
        hidden = max(64, int(4096 * width))
        self.classifier = nn.Sequential(
            nn.Flatten(),
            nn.Linear(cin * spatial * spatial, hidden),
            nn.ReLU(),
            nn.Dropout(0.5),
            nn.Linear(hidden, hidden),
            nn.ReLU(),
            nn.Dropout(0.5),
            nn.Linear(hidden, num_classes),
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.classifier(self.features(x))


class Inception(nn.Module):
    """GoogLeNet inception module: 1x1, 1x1->3x3, 1x1->3x3 (as torchvision), pool->1x1."""

    def __init__(self, cin: int, c1: int, c3r: int, c3: int, c5r: int, c5: int, pp: int):
        super().__init__()
        self.b1 = ConvBNAct(cin, c1, 1)
        self.b2 = nn.Sequential(ConvBNAct(cin, c3r, 1), ConvBNAct(c3r, c3, 3))
        self.b3 = nn.Sequential(ConvBNAct(cin, c5r, 1), ConvBNAct(c5r, c5, 3))
        self.b4 = nn.Sequential(nn.MaxPool2d(3, 1, 1), ConvBNAct(cin, pp, 1))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.cat((self.b1(x), self.b2(x), self.b3(x), self.b4(x)), dim=1)


class GoogLeNet(nn.Module):
    """Szegedy et al. 2015 (batch-norm variant, no auxiliary heads)."""

    _BLOCKS = (
        (192, 64, 96, 128, 16, 32, 32),
        (256, 128, 128, 192, 32, 96, 64),
        "M",
        (480, 192, 96, 208, 16, 48, 64),
        (512, 160, 112, 224, 24, 64, 64),
        (512, 128, 128, 256, 24, 64, 64),
        (512, 112, 144, 288, 32, 64, 64),
        (528, 256, 160, 320, 32, 128, 128),
        "M",
        (832, 256, 160, 320, 32, 128, 128),
        (832, 384, 192, 384, 48, 128, 128),
    )

    def __init__(self, num_classes: int = 1000):
        super().__init__()
        layers: list[nn.Module] = [
            ConvBNAct(3, 64, 7, 2),
            nn.MaxPool2d(3, 2, 1),
            ConvBNAct(64, 64, 1),
            ConvBNAct(64, 192, 3),
            nn.MaxPool2d(3, 2, 1),
        ]
        for block in self._BLOCKS:
            layers.append(nn.MaxPool2d(3, 2, 1) if block == "M" else Inception(*block))
        self.features = nn.Sequential(*layers)
        self.classifier = Classifier(1024, num_classes, dropout=0.2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.classifier(self.features(x))


class DenseLayer(nn.Module):
    """BN-ReLU-1x1 (4k) then BN-ReLU-3x3 (k), concatenated onto the input."""

    def __init__(self, cin: int, growth: int):
        super().__init__()
        self.body = nn.Sequential(
            nn.BatchNorm2d(cin),
            nn.ReLU(),
            nn.Conv2d(cin, 4 * growth, 1, bias=False),
            nn.BatchNorm2d(4 * growth),
            nn.ReLU(),
            nn.Conv2d(4 * growth, growth, 3, 1, 1, bias=False),
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.cat((x, self.body(x)), dim=1)


class DenseNet(nn.Module):
    """Huang et al. 2017; 121/161/169 set growth rate, block sizes and stem width."""

    _CFGS = {
        121: (32, (6, 12, 24, 16), 64),
        161: (48, (6, 12, 36, 24), 96),
        169: (32, (6, 12, 32, 32), 64),
    }

    def __init__(self, depth: int = 121, num_classes: int = 1000):
        super().__init__()
        growth, blocks, cin = self._CFGS[depth]
        layers: list[nn.Module] = [ConvBNAct(3, cin, 7, 2), nn.MaxPool2d(3, 2, 1)]
        for i, n in enumerate(blocks):
            for _ in range(n):
                layers.append(DenseLayer(cin, growth))
                cin += growth
            if i < len(blocks) - 1:
                layers += [
                    nn.BatchNorm2d(cin),
                    nn.ReLU(),
                    nn.Conv2d(cin, cin // 2, 1, bias=False),
                    nn.AvgPool2d(2, 2),
                ]
                cin //= 2
        layers += [nn.BatchNorm2d(cin), nn.ReLU()]
        self.features = nn.Sequential(*layers)
        self.classifier = Classifier(cin, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.classifier(self.features(x))


class DualPathBlock(nn.Module):
    """DPN block: a grouped bottleneck whose output splits into residual and dense paths."""

    def __init__(self, cin: int, mid: int, out: int, dense: int, stride: int, first: bool):
        super().__init__()
        self.out = out
        self.body = nn.Sequential(
            ConvBNAct(cin, mid, 1),
            ConvBNAct(mid, mid, 3, stride, groups=32),
            ConvBNAct(mid, out + dense, 1, act=None),
        )
        self.shortcut = ConvBNAct(cin, out + dense, 1, stride, act=None) if first else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.body(x)
        s = self.shortcut(x) if self.shortcut is not None else x
        d = self.out
        return F.relu(torch.cat((s[:, :d] + y[:, :d], s[:, d:], y[:, d:]), dim=1))


class DPNCifar(nn.Module):
    """Dual Path Network (Chen et al. 2017) for 32x32 inputs; 26 and 92 block layouts."""

    _CFGS = {26: (2, 2, 2, 2), 92: (3, 4, 20, 3)}

    def __init__(self, depth: int = 26, num_classes: int = 10):
        super().__init__()
        mids, outs, dense_depth = (96, 192, 384, 768), (256, 512, 1024, 2048), (16, 32, 24, 128)
        layers: list[nn.Module] = [ConvBNAct(3, 64, 3)]
        cin = 64
        for i, n in enumerate(self._CFGS[depth]):
            for j in range(n):
                stride = 2 if i > 0 and j == 0 else 1
                layers.append(DualPathBlock(cin, mids[i], outs[i], dense_depth[i], stride, j == 0))
                cin = outs[i] + (j + 2) * dense_depth[i]
        self.features = nn.Sequential(*layers)
        self.classifier = Classifier(cin, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.classifier(self.features(x))
