"""Mobile CNN families: MobileNet v1/v2/v3, ShuffleNetV2, MNASNet, SqueezeNet."""

from __future__ import annotations

import torch
from torch import nn

from predictor.zoo._layers import Classifier, ConvBNAct, SqueezeExcite, divisible


class MobileNetV1(nn.Module):
    """Depthwise-separable stack of Howard et al. 2017; ``width`` is the alpha multiplier."""

    _CFG = (
        ((64, 1), (128, 2), (128, 1), (256, 2), (256, 1), (512, 2))
        + ((512, 1),) * 5
        + (
            (1024, 2),
            (1024, 1),
        )
    )

    def __init__(self, width: float = 1.0, num_classes: int = 1000):
        super().__init__()
        cin = divisible(32 * width)
        layers: list[nn.Module] = [ConvBNAct(3, cin, 3, 2)]
        for cout, stride in self._CFG:
            cout = divisible(cout * width)
            layers += [ConvBNAct(cin, cin, 3, stride, groups=cin), ConvBNAct(cin, cout, 1)]
            cin = cout
        self.features = nn.Sequential(*layers)
        self.classifier = Classifier(cin, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.classifier(self.features(x))


class InvertedResidual(nn.Module):
    """MobileNetV2/V3 and MNASNet block: expand 1x1, depthwise kxk, (SE), project 1x1."""

    def __init__(
        self,
        cin: int,
        cout: int,
        stride: int,
        expand: float,
        kernel: int = 3,
        se: bool = False,
        act: type[nn.Module] = nn.ReLU6,
    ):
        super().__init__()
        hidden = int(round(cin * expand))
        layers: list[nn.Module] = []
        if hidden != cin:
            layers.append(ConvBNAct(cin, hidden, 1, act=act))
        layers.append(ConvBNAct(hidden, hidden, kernel, stride, groups=hidden, act=act))
        if se:
            layers.append(SqueezeExcite(hidden, divisible(hidden / 4)))
        layers.append(ConvBNAct(hidden, cout, 1, act=None))
        self.block = nn.Sequential(*layers)
        self.residual = stride == 1 and cin == cout

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = self.block(x)
        return x + out if self.residual else out


class MobileNetV2(nn.Module):
    """Sandler et al. 2018 (t, c, n, s settings); ``width`` scales every channel count."""

    _SETTINGS = (
        (1, 16, 1, 1),
        (6, 24, 2, 2),
        (6, 32, 3, 2),
        (6, 64, 4, 2),
        (6, 96, 3, 1),
        (6, 160, 3, 2),
        (6, 320, 1, 1),
    )

    def __init__(self, width: float = 1.0, num_classes: int = 1000):
        super().__init__()
        cin = divisible(32 * width)
        last = divisible(1280 * max(1.0, width))
        layers: list[nn.Module] = [ConvBNAct(3, cin, 3, 2, act=nn.ReLU6)]
        for t, c, n, s in self._SETTINGS:
            cout = divisible(c * width)
            for i in range(n):
                layers.append(InvertedResidual(cin, cout, s if i == 0 else 1, t))
                cin = cout
        layers.append(ConvBNAct(cin, last, 1, act=nn.ReLU6))
        self.features = nn.Sequential(*layers)
        self.classifier = Classifier(last, num_classes, dropout=0.2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.classifier(self.features(x))


class MobileNetV3(nn.Module):
    """MobileNetV3-Large (Howard et al. 2019): hard-swish, SE blocks; ``width`` = 0.75/1.0."""

    # kernel, expanded, out, se, hard-swish, stride
    _CFG = (
        (3, 16, 16, False, False, 1),
        (3, 64, 24, False, False, 2),
        (3, 72, 24, False, False, 1),
        (5, 72, 40, True, False, 2),
        (5, 120, 40, True, False, 1),
        (5, 120, 40, True, False, 1),
        (3, 240, 80, False, True, 2),
        (3, 200, 80, False, True, 1),
        (3, 184, 80, False, True, 1),
        (3, 184, 80, False, True, 1),
        (3, 480, 112, True, True, 1),
        (3, 672, 112, True, True, 1),
        (5, 672, 160, True, True, 2),
        (5, 960, 160, True, True, 1),
        (5, 960, 160, True, True, 1),
    )

    def __init__(self, width: float = 1.0, num_classes: int = 1000):
        super().__init__()
        cin = divisible(16 * width)
        layers: list[nn.Module] = [ConvBNAct(3, cin, 3, 2, act=nn.Hardswish)]
        for k, exp, out, se, hs, s in self._CFG:
            cout, hidden = divisible(out * width), divisible(exp * width)
            act = nn.Hardswish if hs else nn.ReLU
            layers.append(InvertedResidual(cin, cout, s, hidden / cin, k, se, act))
            cin = cout
        last = 6 * cin
        layers.append(ConvBNAct(cin, last, 1, act=nn.Hardswish))
        self.features = nn.Sequential(*layers)
        self.head = nn.Sequential(
            nn.AdaptiveAvgPool2d(1),
            nn.Flatten(),
            nn.Linear(last, 1280),
            nn.Hardswish(),
            nn.Dropout(0.2),
            nn.Linear(1280, num_classes),
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.features(x))


class MNASNet(nn.Module):
    """MNASNet-B1 (Tan et al. 2019); ``width`` is the depth multiplier alpha (0.5/1.0/1.3)."""

    # expansion, out, repeats, stride, kernel
    _STACKS = (
        (3, 24, 3, 2, 3),
        (3, 40, 3, 2, 5),
        (6, 80, 3, 2, 5),
        (6, 96, 2, 1, 3),
        (6, 192, 4, 2, 5),
        (6, 320, 1, 1, 3),
    )

    def __init__(self, width: float = 1.0, num_classes: int = 1000):
        super().__init__()
        c32, c16 = divisible(32 * width), divisible(16 * width)
        layers: list[nn.Module] = [
            ConvBNAct(3, c32, 3, 2),
            ConvBNAct(c32, c32, 3, 1, groups=c32),
            ConvBNAct(c32, c16, 1, act=None),
        ]
        cin = c16
        for t, c, n, s, k in self._STACKS:
            cout = divisible(c * width)
            for i in range(n):
                layers.append(InvertedResidual(cin, cout, s if i == 0 else 1, t, k, act=nn.ReLU))
                cin = cout
        layers.append(ConvBNAct(cin, 1280, 1))
        self.features = nn.Sequential(*layers)
        self.classifier = Classifier(1280, num_classes, dropout=0.2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.classifier(self.features(x))


class ShuffleBlock(nn.Module):
    """ShuffleNetV2 unit: channel split (stride 1) or two branches (stride 2), then shuffle."""

    def __init__(self, cin: int, cout: int, stride: int):
        super().__init__()
        self.stride = stride
        branch = cout // 2
        if stride > 1:
            self.left = nn.Sequential(
                ConvBNAct(cin, cin, 3, stride, groups=cin, act=None), ConvBNAct(cin, branch, 1)
            )
        right_in = cin if stride > 1 else branch
        self.right = nn.Sequential(
            ConvBNAct(right_in, branch, 1),
            ConvBNAct(branch, branch, 3, stride, groups=branch, act=None),
            ConvBNAct(branch, branch, 1),
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.stride == 1:
            left, right = x.chunk(2, dim=1)
            out = torch.cat((left, self.right(right)), dim=1)
        else:
            out = torch.cat((self.left(x), self.right(x)), dim=1)
        n, c, h, w = out.shape
        return out.view(n, 2, c // 2, h, w).transpose(1, 2).reshape(n, c, h, w)


class ShuffleNetV2(nn.Module):
    """Ma et al. 2018; ``width`` one of 0.5, 1.0, 1.5, 2.0 (the paper's channel tables)."""

    _CHANNELS = {
        0.5: (24, 48, 96, 192, 1024),
        1.0: (24, 116, 232, 464, 1024),
        1.5: (24, 176, 352, 704, 1024),
        2.0: (24, 244, 488, 976, 2048),
    }

    def __init__(self, width: float = 1.0, num_classes: int = 1000):
        super().__init__()
        if width not in self._CHANNELS:
            raise ValueError(f"shufflenet_v2 width must be one of {sorted(self._CHANNELS)}")
        chans = self._CHANNELS[width]
        layers: list[nn.Module] = [ConvBNAct(3, chans[0], 3, 2), nn.MaxPool2d(3, 2, 1)]
        cin = chans[0]
        for repeats, cout in zip((4, 8, 4), chans[1:4], strict=True):
            layers.append(ShuffleBlock(cin, cout, 2))
            layers += [ShuffleBlock(cout, cout, 1) for _ in range(repeats - 1)]
            cin = cout
        layers.append(ConvBNAct(cin, chans[4], 1))
        self.features = nn.Sequential(*layers)
        self.classifier = Classifier(chans[4], num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.classifier(self.features(x))


class Fire(nn.Module):
    """SqueezeNet fire module: squeeze 1x1, then parallel 1x1 and 3x3 expands."""

    def __init__(self, cin: int, squeeze: int, expand: int):
        super().__init__()
        self.squeeze = nn.Sequential(nn.Conv2d(cin, squeeze, 1), nn.ReLU())
        self.e1 = nn.Sequential(nn.Conv2d(squeeze, expand, 1), nn.ReLU())
        self.e3 = nn.Sequential(nn.Conv2d(squeeze, expand, 3, padding=1), nn.ReLU())

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        s = self.squeeze(x)
        return torch.cat((self.e1(s), self.e3(s)), dim=1)


class SqueezeNet(nn.Module):
    """SqueezeNet 1.0 (Iandola et al. 2016); ``width`` scales squeeze/expand channels."""

    _FIRES = (
        (16, 64),
        (16, 64),
        (32, 128),
        "pool",
        (32, 128),
        (48, 192),
        (48, 192),
        (64, 256),
        "pool",
        (64, 256),
    )

    def __init__(self, width: float = 1.0, num_classes: int = 1000):
        super().__init__()
        cin = divisible(96 * width)
        layers: list[nn.Module] = [
            nn.Conv2d(3, cin, 7, 2),
            nn.ReLU(),
            nn.MaxPool2d(3, 2, ceil_mode=True),
        ]
        for fire in self._FIRES:
            if fire == "pool":
                layers.append(nn.MaxPool2d(3, 2, ceil_mode=True))
                continue
            squeeze, expand = divisible(fire[0] * width), divisible(fire[1] * width)
            layers.append(Fire(cin, squeeze, expand))
            cin = 2 * expand
        self.features = nn.Sequential(*layers)
        self.classifier = nn.Sequential(
            nn.Dropout(0.5),
            nn.Conv2d(cin, num_classes, 1),
            nn.ReLU(),
            nn.AdaptiveAvgPool2d(1),
            nn.Flatten(),
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.classifier(self.features(x))
