"""Real torch networks with the arrays of the shape files (benchmarks/workloads/shapes/<model>.json), for the
GPU benchmark (benchmarks/suites/gpu_bench.py): the same parameters, shapes and forward order the MXNet workers
push, so a run on a real accelerator trains what the emulated cluster emulates. torchvision is not used: its wheel
does not import beside this machine's torch, and its ResNet-50 differs from gluoncv's resnet50_v1 (no biases).

    net = torch_models.build("resnet50_v1")     # or "vgg19"; random init from torch's default generator

- ``resnet50_v1`` is gluoncv's: bottlenecks that stride in their first 1x1 convolution, 1x1 convolutions with a
  bias, the 3x3 and the downsampling convolution without; 193 arrays, 25,575,912 parameters.
- ``vgg19`` is configuration E without BatchNorm: 16 convolutions and 3 dense layers, all with biases; 38 arrays,
  143,667,240 parameters. Its pooling before the dense layers is adaptive (7x7, as torchvision's), so small images
  (the dry run's) give the same arrays.

Parameters are registered in the order the forward pass reads them, so `net.parameters()` lists the shape file's
arrays in its order (tests/test_torch_models.py checks every shape).
"""

from __future__ import annotations

import torch
from torch import nn

MODELS = ("resnet50_v1", "vgg19")
CLASSES = 1000


class Bottleneck(nn.Module):
    """gluoncv's BottleneckV1: 1x1 (stride, bias), 3x3, 1x1 (bias), each followed by BatchNorm; the shortcut a
    strided 1x1 convolution without bias and a BatchNorm where the shape changes."""

    def __init__(self, inputs: int, channels: int, stride: int, downsample: bool):
        super().__init__()
        width = channels // 4
        self.conv0 = nn.Conv2d(inputs, width, 1, stride=stride, bias=True)
        self.bn0 = nn.BatchNorm2d(width)
        self.conv1 = nn.Conv2d(width, width, 3, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(width)
        self.conv2 = nn.Conv2d(width, channels, 1, bias=True)
        self.bn2 = nn.BatchNorm2d(channels)
        # gluoncv reads the shortcut's arrays after the body's: registered last.
        self.downsample = (nn.Sequential(nn.Conv2d(inputs, channels, 1, stride=stride, bias=False),
                                         nn.BatchNorm2d(channels)) if downsample else None)

    def forward(self, x):
        y = torch.relu(self.bn0(self.conv0(x)))
        y = torch.relu(self.bn1(self.conv1(y)))
        y = self.bn2(self.conv2(y))
        return torch.relu(y + (self.downsample(x) if self.downsample is not None else x))


class ResNet50V1(nn.Module):
    def __init__(self, classes: int = CLASSES):
        super().__init__()
        self.conv0 = nn.Conv2d(3, 64, 7, stride=2, padding=3, bias=False)
        self.bn0 = nn.BatchNorm2d(64)
        blocks, inputs = [], 64
        for stage, (count, channels) in enumerate(((3, 256), (4, 512), (6, 1024), (3, 2048))):
            for i in range(count):
                stride = 2 if i == 0 and stage > 0 else 1
                blocks.append(Bottleneck(inputs, channels, stride, downsample=i == 0))
                inputs = channels
        self.blocks = nn.Sequential(*blocks)
        self.fc = nn.Linear(2048, classes)

    def forward(self, x):
        x = torch.relu(self.bn0(self.conv0(x)))
        x = nn.functional.max_pool2d(x, 3, stride=2, padding=1)
        x = self.blocks(x)
        return self.fc(torch.flatten(nn.functional.adaptive_avg_pool2d(x, 1), 1))


class Vgg19(nn.Module):
    CONV = (64, 64, "M", 128, 128, "M", 256, 256, 256, 256, "M", 512, 512, 512, 512, "M", 512, 512, 512, 512, "M")

    def __init__(self, classes: int = CLASSES):
        super().__init__()
        layers, inputs = [], 3
        for c in self.CONV:
            if c == "M":
                layers.append(nn.MaxPool2d(2))
            else:
                layers += [nn.Conv2d(inputs, c, 3, padding=1), nn.ReLU()]
                inputs = c
        self.features = nn.Sequential(*layers)
        self.classifier = nn.Sequential(nn.Linear(512 * 7 * 7, 4096), nn.ReLU(), nn.Dropout(),
                                        nn.Linear(4096, 4096), nn.ReLU(), nn.Dropout(), nn.Linear(4096, classes))

    def forward(self, x):
        x = nn.functional.adaptive_avg_pool2d(self.features(x), 7)
        return self.classifier(torch.flatten(x, 1))


def build(name: str, device: torch.device | str = "cpu") -> nn.Module:
    """The network `name` (one of MODELS) on `device` (``"meta"`` builds the arrays without memory)."""
    if name == "resnet50_v1":
        return ResNet50V1().to(device)
    if name == "vgg19":
        return Vgg19().to(device)
    raise ValueError(f"no torch network {name!r}: the GPU benchmark has {', '.join(MODELS)}")
