"""Loss and metrics for extreme-weather segmentation (labels 0 background, 1 tropical cyclone,
2 atmospheric river).

::

    weights = class_weights(class_frequencies(label_counts(labels)), exponent=0.5)   # SC18
    loss = weighted_cross_entropy(logits, labels, weights)                     # mean over pixels
    cm = ConfusionMatrix(3)
    cm.update(logits.argmax(1), labels)
    cm.all_reduce()                  # sums the matrices of every rank (torch.distributed)
    cm.iou(), cm.mean_iou()

**Class weights.** ``weights = freq ** -exponent``: exponent 0.5 is SC18's inverse square root,
0.125 DeepCAM's. ``normalize``:

- ``None`` (default): the raw values. This is what DeepCAM uses: with its frequencies
  0.9863 / 0.000458 / 0.0133 and exponent 0.125 the weights are 1.002, 2.614, 1.717.
- ``"min"``: divided by the smallest weight, so the most frequent class (background) weighs 1.
- ``"mean"``: divided by their mean over the classes, so they average to 1.
- ``"pixels"``: divided by ``sum_c freq_c * w_c``, so the frequency-weighted mean weight is 1 and
  the weighted loss of a uniform predictor equals the unweighted one (the loss scale, hence the
  useful learning rate, does not depend on the exponent).

A class with frequency 0 would get an infinite weight; frequencies are clamped to ``min_freq``
(default 1e-6) first.

**Loss.** :func:`weighted_cross_entropy` is ``mean over pixels of w[y] * -log softmax(logits)[y]``
(DeepCAM's: ``CrossEntropyLoss(weight=w, reduction="none")(...).mean()``). Note that this is *not*
PyTorch's ``reduction="mean"`` with weights, which divides by ``sum w[y]`` instead of the pixel
count. Computed in float32 whatever the logits' dtype (mixed precision).

**IoU.** :class:`ConfusionMatrix` accumulates an int64 ``[classes, classes]`` matrix (rows: label,
columns: prediction) over batches; summing the matrices of all ranks (``all_reduce``) gives the
global matrix, so IoU over a sharded validation set is exact. IoU per class is
``TP / (TP + FP + FN)``; a class absent from both labels and predictions has no IoU (NaN, or
``absent`` if given) and :meth:`ConfusionMatrix.mean_iou` averages the classes that have one.
:func:`per_sample_iou` is DeepCAM's metric instead: per sample, the mean over the classes with
absent classes counting 1, then averaged over samples.
"""

from __future__ import annotations

from typing import Sequence

import torch
import torch.nn.functional as F

__all__ = ["label_counts", "class_frequencies", "class_weights", "weighted_cross_entropy", "ConfusionMatrix",
           "per_sample_iou", "DEEPCAM_FREQUENCIES", "SC18_EXPONENT", "DEEPCAM_EXPONENT"]

DEEPCAM_FREQUENCIES = (0.9863, 0.000458, 0.0133)
SC18_EXPONENT = 0.5
DEEPCAM_EXPONENT = 0.125


def label_counts(labels: torch.Tensor, classes: int = 3) -> torch.Tensor:
    """Pixels per class (int64 [classes]) of an integer label tensor of any shape; labels outside
    0..classes-1 are not counted. Sum it over batches and ranks (all-reduce) before
    :func:`class_frequencies`."""
    t = torch.as_tensor(labels).flatten().long()
    t = t[(t >= 0) & (t < classes)]
    return torch.bincount(t, minlength=classes)


def class_frequencies(counts: Sequence[float] | torch.Tensor) -> torch.Tensor:
    """Class frequencies (float64, summing to 1) from per-class pixel counts."""
    counts = torch.as_tensor(counts).to(torch.float64).flatten()
    total = counts.sum()
    if total <= 0:
        raise ValueError("class frequencies: no pixels counted")
    return counts / total


def class_weights(freq: Sequence[float] | torch.Tensor, exponent: float = SC18_EXPONENT,
                  normalize: str | None = None, min_freq: float = 1e-6) -> torch.Tensor:
    """``freq ** -exponent`` as float32, normalized as the module docstring says."""
    f = torch.as_tensor(freq, dtype=torch.float64).clamp_min(min_freq)
    w = f.pow(-float(exponent))
    if normalize is None or normalize == "none":
        pass
    elif normalize == "min":
        w = w / w.min()
    elif normalize == "mean":
        w = w / w.mean()
    elif normalize == "pixels":
        w = w / (f / f.sum() * w).sum()
    else:
        raise ValueError(f"class weights: normalize must be None, 'min', 'mean' or 'pixels', got {normalize!r}")
    return w.to(torch.float32)


def weighted_cross_entropy(logits: torch.Tensor, labels: torch.Tensor, weights: torch.Tensor | None = None,
                           ignore_index: int = -100) -> torch.Tensor:
    """Mean over pixels of ``weights[label] * cross entropy``; logits [N, C, H, W], labels [N, H, W].
    Pixels labelled ``ignore_index`` contribute 0 but still count in the mean (as DeepCAM)."""
    if weights is not None:
        weights = weights.to(device=logits.device, dtype=torch.float32)
    losses = F.cross_entropy(logits.float(), labels.long(), weight=weights, reduction="none",
                             ignore_index=ignore_index)
    return losses.mean()


class ConfusionMatrix:
    """An int64 ``[classes, classes]`` confusion matrix (rows label, columns prediction) on
    ``device``; ``matrix`` is a plain tensor, so it can be all-reduced, saved and summed."""

    def __init__(self, classes: int = 3, device: torch.device | str | None = None):
        self.classes = int(classes)
        self.matrix = torch.zeros(self.classes, self.classes, dtype=torch.int64, device=device)

    def reset(self) -> None:
        self.matrix.zero_()

    @torch.no_grad()
    def update(self, predictions: torch.Tensor, labels: torch.Tensor) -> None:
        """``predictions``: class indices [N, H, W], or logits [N, C, H, W] (argmax over C)."""
        if predictions.dim() == labels.dim() + 1:
            predictions = predictions.argmax(dim=1)
        labels = labels.to(self.matrix.device).long().flatten()
        predictions = predictions.to(self.matrix.device).long().flatten()
        valid = (labels >= 0) & (labels < self.classes)
        index = labels[valid] * self.classes + predictions[valid]
        self.matrix += torch.bincount(index, minlength=self.classes ** 2).view(self.classes, self.classes)

    def all_reduce(self, group=None) -> "ConfusionMatrix":
        """Sum the matrices of every rank in place (no-op without an initialized process group)."""
        import torch.distributed as dist
        if dist.is_available() and dist.is_initialized():
            dist.all_reduce(self.matrix, op=dist.ReduceOp.SUM, group=group)
        return self

    def iou(self, absent: float = float("nan")) -> torch.Tensor:
        """IoU per class (float64): TP / (TP + FP + FN); ``absent`` where the class is in neither
        labels nor predictions."""
        m = self.matrix.to(torch.float64)
        tp = m.diagonal()
        union = m.sum(0) + m.sum(1) - tp
        return torch.where(union > 0, tp / union.clamp_min(1), torch.full_like(tp, absent))

    def mean_iou(self) -> float:
        """Mean of the per-class IoUs over the classes that have one."""
        iou = self.iou()
        present = ~torch.isnan(iou)
        return float(iou[present].mean()) if present.any() else float("nan")

    def accuracy(self) -> float:
        m = self.matrix.to(torch.float64)
        return float(m.diagonal().sum() / m.sum().clamp_min(1))

    def state_dict(self) -> dict:
        return {"classes": self.classes, "matrix": self.matrix.clone()}

    def load_state_dict(self, state: dict) -> None:
        self.matrix.copy_(state["matrix"])


@torch.no_grad()
def per_sample_iou(predictions: torch.Tensor, labels: torch.Tensor, classes: int = 3) -> torch.Tensor:
    """DeepCAM's IoU: per sample, the mean over classes of TP / (TP + FP + FN), a class absent from
    both counting 1; returns the per-sample values [N] (average them, or all-reduce sum and count)."""
    if predictions.dim() == labels.dim() + 1:
        predictions = predictions.argmax(dim=1)
    n = labels.shape[0]
    p = predictions.reshape(n, -1).long()
    y = labels.reshape(n, -1).long()
    out = torch.zeros(n, dtype=torch.float64, device=labels.device)
    for c in range(classes):
        pc, yc = p == c, y == c
        tp = (pc & yc).sum(1).double()
        union = (pc | yc).sum(1).double()
        out += torch.where(union > 0, tp / union.clamp_min(1), torch.ones_like(tp))
    return out / classes
