# The built-in `resnet` written with PyTorch's stock layers, exported as TorchScript for
# tests/models/model_test.cc (same module names, so the parameter sets line up).
# Usage: /usr/bin/python3 resnet_reference.py OUT.pt IN_CHANNELS CLASSES [WIDTH STATIC]
# WIDTH < 1: HeteroFL's width-scaled submodel (ceil(WIDTH n) of each layer's n channels,
# each block convolution's output divided by WIDTH in training, as the paper's Scaler);
# STATIC = 1: static batch normalization (no running statistics).
import math
import sys

import torch
import torch.nn as nn


class Scaler(nn.Module):
    def __init__(self, rate):
        super().__init__()
        self.rate = rate

    def forward(self, x):
        return x / self.rate if self.training else x


class BasicBlock(nn.Module):
    def __init__(self, cin, cout, stride, rate, norm):
        super().__init__()
        self.conv1 = nn.Conv2d(cin, cout, 3, stride=stride, padding=1, bias=False)
        self.bn1 = norm(cout)
        self.conv2 = nn.Conv2d(cout, cout, 3, padding=1, bias=False)
        self.bn2 = norm(cout)
        self.scale = Scaler(rate) if rate < 1 else nn.Identity()
        self.shortcut = nn.Sequential()
        if stride != 1 or cin != cout:
            self.shortcut = nn.Sequential(nn.Conv2d(cin, cout, 1, stride=stride, bias=False),
                                          norm(cout))

    def forward(self, x):
        y = self.bn2(self.scale(self.conv2(torch.relu(self.bn1(self.scale(self.conv1(x)))))))
        skip = x
        for i, layer in enumerate(self.shortcut):  # conv, scaler, normalization
            skip = layer(skip)
            if i == 0:
                skip = self.scale(skip)
        return torch.relu(y + skip)


def resnet(channels, classes, rate=1.0, static=False):
    def norm(n):
        return nn.BatchNorm2d(n, track_running_stats=not static)

    c1, c2, c3 = (max(1, math.ceil(rate * n - 1e-9)) for n in (16, 32, 64))
    return nn.Sequential(
        nn.Sequential(nn.Conv2d(channels, c1, 3, padding=1, bias=False), norm(c1), nn.ReLU()),
        nn.Sequential(BasicBlock(c1, c1, 1, rate, norm)),
        nn.Sequential(BasicBlock(c1, c2, 2, rate, norm)),
        nn.Sequential(BasicBlock(c2, c3, 2, rate, norm)),
        nn.Sequential(nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(c3, classes)))


if __name__ == "__main__":
    torch.manual_seed(0)
    rate = float(sys.argv[4]) if len(sys.argv) > 4 else 1.0
    static = len(sys.argv) > 5 and sys.argv[5] == "1"
    torch.jit.script(resnet(int(sys.argv[2]), int(sys.argv[3]), rate, static)).save(sys.argv[1])
