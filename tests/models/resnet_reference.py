# The built-in `resnet` written with PyTorch's stock layers, exported as TorchScript for
# tests/models/model_test.cc (same module names, so the parameter sets line up).
# Usage: /usr/bin/python3 resnet_reference.py OUT.pt IN_CHANNELS CLASSES
import sys

import torch
import torch.nn as nn


class BasicBlock(nn.Module):
    def __init__(self, cin, cout, stride):
        super().__init__()
        self.conv1 = nn.Conv2d(cin, cout, 3, stride=stride, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(cout)
        self.conv2 = nn.Conv2d(cout, cout, 3, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(cout)
        self.shortcut = nn.Sequential()
        if stride != 1 or cin != cout:
            self.shortcut = nn.Sequential(nn.Conv2d(cin, cout, 1, stride=stride, bias=False),
                                          nn.BatchNorm2d(cout))

    def forward(self, x):
        y = self.bn2(self.conv2(torch.relu(self.bn1(self.conv1(x)))))
        return torch.relu(y + self.shortcut(x))


def resnet(channels, classes):
    return nn.Sequential(
        nn.Sequential(nn.Conv2d(channels, 16, 3, padding=1, bias=False), nn.BatchNorm2d(16),
                      nn.ReLU()),
        nn.Sequential(BasicBlock(16, 16, 1)),
        nn.Sequential(BasicBlock(16, 32, 2)),
        nn.Sequential(BasicBlock(32, 64, 2)),
        nn.Sequential(nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(64, classes)))


if __name__ == "__main__":
    torch.manual_seed(0)
    torch.jit.script(resnet(int(sys.argv[2]), int(sys.argv[3]))).save(sys.argv[1])
