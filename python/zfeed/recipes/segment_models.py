"""Segmentation models for extreme-weather detection (SC18 "Exascale Deep Learning for Climate
Analytics" and MLPerf HPC DeepCAM): DeepLabv3+ and Tiramisu (FC-DenseNet).

::

    model = build_model("deeplabv3plus", in_channels=16, classes=3, encoder="resnet50")
    model = build_model("tiramisu", growth_rate=32, layers=(2, 2, 2, 2, 2), bottleneck_layers=2)
    logits = model(x)          # x [N, 16, H, W] -> logits [N, 3, H, W], any H and W

Both models pad their input up to the multiple of their total downsampling that they need
(circularly along longitude, the last axis; by replication along latitude) and crop the logits
back, so any grid works (768 x 1152, CAM5's, needs no padding). ``channels_last=True`` converts
the parameters to ``torch.channels_last``; feed channels-last inputs too
(``x.contiguous(memory_format=torch.channels_last)``) to get the NHWC kernels.

- **DeepLabv3+** is segmentation-models-pytorch's ``DeepLabV3Plus`` with ``encoder_weights=None``
  (nothing is downloaded). Defaults follow SC18: a ResNet-50 encoder, output stride 16, ASPP rates
  6/12/18. ``encoder="resnet18"`` makes a small one for CPU tests. Other options pass through to
  ``DeepLabV3Plus`` (``decoder_channels``, ``encoder_depth``, ``decoder_aspp_separable``, ...).
- **Tiramisu** (Jegou et al. 2017, "The One Hundred Layers Tiramisu") is written here: a 3x3
  convolution to ``first_channels`` features, then per level a dense block (each layer BN-ReLU-
  3x3 conv producing ``growth_rate`` features, concatenated to its input) and a transition down
  (BN-ReLU-1x1 conv-dropout-2x2 max pool); a bottleneck dense block; per level a transition up
  (3x3 transposed convolution, stride 2, of the previous block's *new* features only), the skip
  connection concatenated, and a dense block; a final 1x1 convolution to the classes. FC-DenseNet103
  is ``growth_rate=16, layers=(4, 5, 7, 10, 12), bottleneck_layers=15``; SC18 used growth rate 32.
"""

from __future__ import annotations

from typing import Sequence

import torch
import torch.nn.functional as F
from torch import nn

__all__ = ["build_model", "DeepLabV3Plus", "Tiramisu", "MODELS"]


def _pad_to_multiple(x: torch.Tensor, multiple: int) -> tuple[torch.Tensor, int, int]:
    """Pad [N, C, H, W] so H and W divide by ``multiple``: longitude (W) circularly, latitude (H)
    by replicating the edge rows. Returns the padded tensor and the original H, W."""
    h, w = x.shape[-2:]
    ph, pw = (-h) % multiple, (-w) % multiple
    if pw:
        if pw <= w:
            x = torch.cat([x, x[..., :pw]], dim=-1)  # wraps around the globe
        else:
            x = F.pad(x, (0, pw), mode="replicate")
    if ph:
        x = F.pad(x, (0, 0, ph // 2, ph - ph // 2), mode="replicate")
    return x, h, w


def _crop(y: torch.Tensor, h: int, w: int) -> torch.Tensor:
    ph = y.shape[-2] - h
    return y[..., ph // 2: ph // 2 + h, :w]


class DeepLabV3Plus(nn.Module):
    """segmentation-models-pytorch's DeepLabV3Plus (random initialization), padded to any grid."""

    def __init__(self, in_channels: int = 16, classes: int = 3, encoder: str = "resnet50",
                 output_stride: int = 16, atrous_rates: Sequence[int] = (6, 12, 18), **options):
        super().__init__()
        import segmentation_models_pytorch as smp
        options.setdefault("encoder_depth", 5)
        self.net = smp.DeepLabV3Plus(encoder_name=encoder, encoder_weights=None, in_channels=in_channels,
                                     classes=classes, encoder_output_stride=output_stride,
                                     decoder_atrous_rates=tuple(atrous_rates), **options)
        # smp checks that H and W divide by the encoder's output stride
        self.multiple = int(output_stride)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x, h, w = _pad_to_multiple(x, self.multiple)
        return _crop(self.net(x), h, w)


class _DenseLayer(nn.Sequential):
    def __init__(self, channels: int, growth_rate: int, dropout: float):
        super().__init__(nn.BatchNorm2d(channels), nn.ReLU(inplace=True),
                         nn.Conv2d(channels, growth_rate, 3, padding=1, bias=True))
        if dropout > 0:
            self.append(nn.Dropout2d(dropout))


class _DenseBlock(nn.Module):
    """``layers`` dense layers; returns the input concatenated with every new feature map, or only
    the new ones (``new_only``, the up path's blocks feeding the next transition up)."""

    def __init__(self, channels: int, growth_rate: int, layers: int, dropout: float):
        super().__init__()
        self.layers = nn.ModuleList(_DenseLayer(channels + i * growth_rate, growth_rate, dropout)
                                    for i in range(layers))

    def forward(self, x: torch.Tensor, new_only: bool = False) -> torch.Tensor:
        new = []
        for layer in self.layers:
            out = layer(x)
            x = torch.cat([x, out], dim=1)
            new.append(out)
        return torch.cat(new, dim=1) if new_only else x


class _TransitionDown(nn.Sequential):
    def __init__(self, channels: int, dropout: float):
        super().__init__(nn.BatchNorm2d(channels), nn.ReLU(inplace=True), nn.Conv2d(channels, channels, 1))
        if dropout > 0:
            self.append(nn.Dropout2d(dropout))
        self.append(nn.MaxPool2d(2))


class Tiramisu(nn.Module):
    """FC-DenseNet (see the module docstring). ``layers``: dense layers per down level (the up path
    mirrors it); ``up_layers`` overrides the up path's (deepest first)."""

    def __init__(self, in_channels: int = 16, classes: int = 3, growth_rate: int = 32,
                 layers: Sequence[int] = (4, 5, 7, 10, 12), bottleneck_layers: int = 15,
                 first_channels: int = 48, dropout: float = 0.2, up_layers: Sequence[int] | None = None):
        super().__init__()
        layers = [int(n) for n in layers]
        up_layers = [int(n) for n in (up_layers if up_layers is not None else reversed(layers))]
        if len(up_layers) != len(layers):
            raise ValueError("tiramisu: up_layers must have one entry per down level")
        self.multiple = 2 ** len(layers)
        self.first = nn.Conv2d(in_channels, first_channels, 3, padding=1)
        channels = first_channels
        self.down_blocks, self.down_transitions, skips = nn.ModuleList(), nn.ModuleList(), []
        for n in layers:
            self.down_blocks.append(_DenseBlock(channels, growth_rate, n, dropout))
            channels += n * growth_rate
            skips.append(channels)
            self.down_transitions.append(_TransitionDown(channels, dropout))
        self.bottleneck = _DenseBlock(channels, growth_rate, bottleneck_layers, dropout)
        new = bottleneck_layers * growth_rate
        self.up_transitions, self.up_blocks = nn.ModuleList(), nn.ModuleList()
        for n, skip in zip(up_layers, reversed(skips)):
            self.up_transitions.append(nn.ConvTranspose2d(new, new, 3, stride=2, padding=1, output_padding=1))
            channels = new + skip
            self.up_blocks.append(_DenseBlock(channels, growth_rate, n, dropout))
            new = n * growth_rate
        self.final = nn.Conv2d(channels + new, classes, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x, h, w = _pad_to_multiple(x, self.multiple)
        x = self.first(x)
        skips = []
        for block, down in zip(self.down_blocks, self.down_transitions):
            x = block(x)
            skips.append(x)
            x = down(x)
        x = self.bottleneck(x, new_only=True)
        last = len(self.up_blocks) - 1
        for i, (up, block, skip) in enumerate(zip(self.up_transitions, self.up_blocks, reversed(skips))):
            x = torch.cat([up(x), skip], dim=1)
            x = block(x, new_only=i != last)  # the last block keeps everything for the classifier
        return _crop(self.final(x), h, w)


MODELS = {"deeplabv3plus": DeepLabV3Plus, "deeplab": DeepLabV3Plus, "tiramisu": Tiramisu}


def build_model(name: str, in_channels: int = 16, classes: int = 3, channels_last: bool = False,
                **options) -> nn.Module:
    """``name``: "deeplabv3plus" (alias "deeplab") or "tiramisu"; ``options`` go to the model's
    constructor. ``channels_last`` converts the parameters to torch.channels_last."""
    key = name.lower().replace("-", "").replace("_", "")
    if key not in MODELS:
        raise ValueError(f"unknown segmentation model {name!r}; choose deeplabv3plus or tiramisu")
    model = MODELS[key](in_channels=in_channels, classes=classes, **options)
    if channels_last:
        model = model.to(memory_format=torch.channels_last)
    return model
