"""Bundled models: small networks of the kind a wearable runs."""

from __future__ import annotations

import torch
from torch import nn


def _conv_bn_relu(cin: int, cout: int, k: int, stride: int = 1, groups: int = 1) -> nn.Sequential:
    return nn.Sequential(nn.Conv2d(cin, cout, k, stride, k // 2, groups=groups, bias=False),
                         nn.BatchNorm2d(cout), nn.ReLU())


class HandKeypointNet(nn.Module):
    """21 hand keypoints (x, y) from a 96x96 RGB crop, MobileNet-style: strided convs,
    depthwise-separable blocks, pooling and a small linear head (about 50k parameters)."""

    def __init__(self, keypoints: int = 21):
        super().__init__()
        self.features = nn.Sequential(
            _conv_bn_relu(3, 16, 3, stride=2),             # 48x48
            _conv_bn_relu(16, 16, 3, groups=16),           # depthwise
            _conv_bn_relu(16, 32, 1),                      # pointwise
            nn.MaxPool2d(2),                               # 24x24
            _conv_bn_relu(32, 64, 3, stride=2),            # 12x12
            _conv_bn_relu(64, 64, 3, groups=64),
            _conv_bn_relu(64, 96, 1),
            nn.AdaptiveAvgPool2d(1),
        )
        self.head = nn.Sequential(nn.Flatten(), nn.Linear(96, 64), nn.ReLU(), nn.Linear(64, 2 * keypoints))

    def forward(self, image: torch.Tensor) -> torch.Tensor:
        return self.head(self.features(image))


def hand_keypoint_net(seed: int = 0) -> tuple[nn.Module, tuple[torch.Tensor]]:
    """The demo model in inference mode, with random weights and batch-norm statistics, and an input."""
    torch.manual_seed(seed)
    model = HandKeypointNet()
    for m in model.modules():
        if isinstance(m, nn.BatchNorm2d):   # trained-looking statistics, so batch norm is not the identity
            m.running_mean.uniform_(-0.5, 0.5)
            m.running_var.uniform_(0.5, 2.0)
            m.weight.data.uniform_(0.5, 1.5)
            m.bias.data.uniform_(-0.2, 0.2)
    return model.eval(), (torch.randn(1, 3, 96, 96),)
