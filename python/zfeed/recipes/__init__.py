"""Training recipes, run as ``zfeed train RECIPE ...`` or ``python -m zfeed.recipes RECIPE ...``.

- ``forecast``: the GPU-native Zarr hackathon's benchmark, a U-Net (segmentation-models-pytorch,
  ResNet encoder, no pretrained weights) mapping the fields at t to t + 1, validated against
  persistence on held-out times (:mod:`zfeed.recipes.forecast`).
- ``segment``: extreme-weather segmentation (SC18 / MLPerf HPC DeepCAM), DeepLabv3+ or Tiramisu
  on CAM5-like data with frequency-weighted cross entropy, LARC, gradient lag and mixed precision,
  validated by IoU per class against a background-only predictor (:mod:`zfeed.recipes.segment`).

What every recipe shares (distributed setup, seeding, the training loop with atomic checkpoints and
bit-identical resume on CPU, the throughput modes and their table, JSON and chart) is in
:mod:`zfeed.recipes.common`.
"""

RECIPES = {
    "forecast": "zfeed.recipes.forecast",
    "segment": "zfeed.recipes.segment",
}

__all__ = ["RECIPES"]
