"""``zfeed train segment``: extreme-weather segmentation (SC18 "Exascale Deep Learning for Climate
Analytics" and its successor MLPerf HPC DeepCAM) on CAM5-like data (``zfeed synth cam5``).

A DeepLabv3+ (segmentation-models-pytorch, ResNet encoder, ``encoder_weights=None``) or a Tiramisu
(FC-DenseNet, growth rate configurable) from :mod:`zfeed.recipes.segment_models` maps the 16 CAM5
channels at time t (normalized with each array's ``zfeed_stats``, or statistics over the training
times) to per-pixel logits of the classes in the integer ``labels`` array (0 background, 1
tropical cyclone, 2 atmospheric river). zfeed.Loader reads them with ``lead=0``; an integer target
comes out as int64 ``[batch, lat, lon]`` labels, never normalized.

Loss: the frequency-weighted cross entropy of :mod:`zfeed.recipes.segment_losses`, weights
``freq ** -exponent`` (``--weights-exponent 0.5``: SC18's inverse square root; DeepCAM's is 0.125)
from the class frequencies of the *training* times' labels, normalized per ``--weights-normalize``.
Optimizer Adam (L2 ``--weight-decay``), wrapped in LARC (``--larc``, trust ratio ``eta * ||w|| /
||g||`` clipped at 1) if asked; ``--gradient-lag`` applies at step k the gradients all-reduced at
step k - 1 (:class:`zfeed.recipes.segment_optim.GradientLag`, which does its own asynchronous
all-reduce: DistributedDataParallel's is switched off with ``no_sync`` for every forward, as the
module documents). The pending gradients belong to the optimizer's ``state_dict``, so checkpoints
resume exactly; the last step's gradients are left unapplied at the end of a run. Mixed precision
``--amp bf16|fp16`` (fp16 with loss scaling), ``--channels-last`` (parameters and inputs NHWC).

Train/validation split by time, as the forecast recipe: the last ``--val-fraction`` of the times is
held out; the training Loader reads only the times before the split (``time_range=(None, split)``).
Validation reads the held-out times from the arrays (decoded as the Loader decodes them: CF
packing, a missing label ignored), shards them by rank, accumulates a confusion matrix, all-reduces
it and reports the IoU per class and the mean IoU, next to those of a predictor of background
everywhere (IoU 0 for cyclones and rivers); for both, a class in neither the labels nor the
predictions has no IoU and is left out of the mean. Every label must be a class of ``--classes``.

Distributed setup, checkpoints and resume, the throughput modes (``--mode real,load-only,synthetic``)
and the JSON and chart are :mod:`zfeed.recipes.common`'s. ``--source baseline`` (the hackathon's
xarray DataLoader, whose targets are its inputs a lead later) has no labels and is refused.
"""

from __future__ import annotations

import argparse
import math
import sys
from typing import Any, Sequence

import numpy as np
import torch
from torch import nn

from . import common
from .common import Dist, Task, log, zfeed_device
from .forecast import resolve_statistics
from .segment_losses import ConfusionMatrix, class_frequencies, class_weights, label_counts, weighted_cross_entropy
from .segment_models import build_model
from .segment_optim import LARC, GradientLag, OptimizerWrapper

CHANNELS = ["TMQ", "U850", "V850", "UBOT", "VBOT", "QREFHT", "PS", "PSL", "T200", "T500", "PRECT", "TS",
            "TREFHT", "Z1000", "Z200", "ZBOT"]
CLASS_NAMES = ("background", "cyclone", "river")


def class_names(classes: int) -> list[str]:
    return [CLASS_NAMES[c] if c < len(CLASS_NAMES) else f"class{c}" for c in range(classes)]


def _none_if_nan(value: float) -> float | None:
    return None if value is None or not math.isfinite(float(value)) else float(value)


def check_model_arguments(args: argparse.Namespace) -> list[int] | None:
    """The model options refused before anything is read; returns --tiramisu-layers as integers
    (None for DeepLabv3+)."""
    for name in ("growth_rate", "bottleneck_layers", "first_channels", "decoder_channels"):
        if getattr(args, name) < 1:
            raise SystemExit(f"segment: --{name.replace('_', '-')} must be at least 1, got {getattr(args, name)}")
    if not 0 <= args.dropout < 1:
        raise SystemExit(f"segment: --dropout must be in [0, 1), got {args.dropout}")
    if args.model != "tiramisu":
        return None
    return common.parse_int_list(args.tiramisu_layers, "segment: --tiramisu-layers", minimum=1)


# -------------------------------------------------------------------------------------------
# Gradient lag as an optimizer, for common.train's loop


class LaggedOptimizer(OptimizerWrapper):
    """``optimizer`` (Adam, or LARC around it) behind :class:`GradientLag`: ``step`` launches the
    all-reduce of this step's gradients and applies the previous step's. Looks like an optimizer
    (``param_groups``, ``state``, ``zero_grad``, ``state_dict`` with the pending gradients), so
    :func:`zfeed.recipes.common.train` drives it as any other (``GradScaler.step`` included: with
    fp16 it unscales first, and an overflowing step is skipped, its gradients dropped)."""

    def __init__(self, params: Sequence[nn.Parameter], optimizer, lag: int = 1):
        super().__init__(optimizer)
        self.lag = GradientLag(params, optimizer, lag=lag)

    def step(self, closure=None):
        if closure is not None:
            raise ValueError("gradient lag: step takes no closure")
        self.lag.step(step_fn=self.optim.step)
        return None

    def state_dict(self) -> dict:
        return {"optimizer": self.optim.state_dict(), "gradient_lag": self.lag.state_dict()}

    def load_state_dict(self, state: dict) -> None:
        self.optim.load_state_dict(state["optimizer"])
        self.lag.load_state_dict(state["gradient_lag"])

    def __repr__(self) -> str:
        return f"LaggedOptimizer(lag={self.lag.lag}, {self.optim!r})"


# -------------------------------------------------------------------------------------------
# The task


class SegmentTask(Task):
    name = "segment"

    def __init__(self, args: argparse.Namespace, dist: Dist):
        import zfeed

        self.args = args
        self.dist = dist
        self.store = args.store
        self.inputs = [v.strip() for v in args.inputs.split(",") if v.strip()]
        self.labels = args.labels
        self.classes = int(args.classes)
        if self.classes < 2:
            raise SystemExit(f"segment: --classes must be at least 2 (background and one more), got {self.classes}")
        self.class_names = class_names(self.classes)
        self.tiramisu_layers = check_model_arguments(args)
        self.group = zfeed.open(self.store)
        shapes = {}
        for name in dict.fromkeys(self.inputs + [self.labels]):
            if name not in self.group:
                raise SystemExit(f"segment: {self.store} has no array {name!r} (it has {', '.join(self.group.keys())})")
            arr = self.group[name]
            if arr.ndim != 3:
                raise SystemExit(f"segment: {name} has shape {arr.shape}; give (time, lat, lon) arrays")
            shapes[name] = arr.shape
        if len(set(shapes.values())) != 1:
            raise SystemExit(f"segment: the arrays' shapes differ: {shapes}")
        if not np.issubdtype(np.dtype(self.group[self.labels].dtype), np.integer):
            raise SystemExit(f"segment: {self.labels} has dtype {self.group[self.labels].dtype}; labels must be integers")
        self.times, self.height, self.width = next(iter(shapes.values()))
        # A label's size in the store (the Loader widens labels to int64 for the loss): what the
        # throughput counts per label read.
        self.label_itemsize = np.dtype(self.group[self.labels].dtype).itemsize
        frac = float(args.val_fraction)
        if not 0 <= frac < 1:
            raise SystemExit(f"segment: --val-fraction must be in [0, 1), got {frac}")
        n_val = int(math.ceil(frac * self.times)) if frac > 0 else 0
        self.split = self.times - n_val
        if self.split < 1:
            raise SystemExit(f"segment: {self.times} times leave no training sample with --val-fraction {frac}")
        self.val_times = list(range(self.split, self.times))
        self.stats, self.stats_source = resolve_statistics(self.store, self.group, self.inputs, self.split, args.stats,
                                                           recipe="segment")
        # Validation reads the arrays directly: decoded (CF packing, missing values) as the Loader does.
        self.encodings = {name: common.cf_encoding(self.group[name], f"segment: {name}")
                          for name in dict.fromkeys(self.inputs + [self.labels])}
        self.label_counts = self._count_labels()
        self.frequencies = class_frequencies(self.label_counts)
        normalize = None if args.weights_normalize == "none" else args.weights_normalize
        self.weights = class_weights(self.frequencies, exponent=args.weights_exponent, normalize=normalize)
        self._device_weights: torch.Tensor | None = None
        # DeepLabv3+'s ASPP pools the image to 1 x 1 before a BatchNorm, which needs 2 samples in
        # training (the Loader's batches are full: drop_last, and the time range holds no held-out time)
        if args.model == "deeplabv3plus" and args.batch_size < 2:
            raise SystemExit("segment: deeplabv3plus needs --batch-size 2 or more (its ASPP image pooling "
                             "has a BatchNorm over the batch)")
        self.lag: LaggedOptimizer | None = None
        if dist.main:
            freq = ", ".join(f"{n} {float(f):.5f}" for n, f in zip(self.class_names, self.frequencies))
            weights = ", ".join(f"{float(w):.3f}" for w in self.weights)
            log(f"segment: {self.store}: {self.times} times of {self.height} x {self.width}, {len(self.inputs)} "
                f"channels; training on times 0..{self.split - 1}, validating on {len(self.val_times)} from time "
                f"{self.split}; statistics: {self.stats_source}; class frequencies ({freq}), weights ({weights}) "
                f"with exponent {args.weights_exponent}")

    def _count_labels(self) -> torch.Tensor:
        """Pixels per class over the training times (for the class weights), after checking that
        every label, held-out times included, is a class of --classes (or missing: ignored)."""
        counts = torch.zeros(self.classes, dtype=torch.int64)
        labels = self.group[self.labels]
        encoding = self.encodings[self.labels]
        step = max(1, int(2 ** 24 // max(self.height * self.width, 1)))  # ~16 M labels per read
        for start in range(0, self.times, step):
            stop = min(start + step, self.times)
            block = common.read_labels(labels, start, stop, encoding)
            valid = block[block != common.IGNORE_LABEL]
            if valid.size and (valid.max() >= self.classes or valid.min() < 0):
                bad = int(valid.max()) if valid.max() >= self.classes else int(valid.min())
                hint = (f"give --classes {bad + 1}" if bad >= self.classes else
                        "declare it missing with a _FillValue or missing_value attribute")
                raise SystemExit(f"segment: {self.labels} holds the label {bad} (times {start}..{stop - 1}), not a "
                                 f"class of --classes {self.classes} (0..{self.classes - 1}): {hint}")
            if start < self.split:
                training = block[:self.split - start]
                counts += label_counts(torch.from_numpy(training), self.classes)
        return counts

    # -- model
    def build_model(self) -> nn.Module:
        a = self.args
        if a.model == "tiramisu":
            options = {"growth_rate": a.growth_rate, "layers": self.tiramisu_layers,
                       "bottleneck_layers": a.bottleneck_layers, "first_channels": a.first_channels,
                       "dropout": a.dropout}
        else:
            options = {"encoder": a.encoder, "decoder_channels": a.decoder_channels}
        return build_model(a.model, in_channels=len(self.inputs), classes=self.classes,
                           channels_last=a.channels_last, **options)

    def checkpoint_settings(self) -> dict:
        a = self.args
        settings = {"--inputs": ",".join(self.inputs), "--labels": self.labels, "--classes": self.classes,
                    "--model": a.model, "--weights-exponent": a.weights_exponent,
                    "--weights-normalize": a.weights_normalize, "--larc": bool(a.larc),
                    "--gradient-lag": bool(a.gradient_lag), "--lr": a.lr, "--weight-decay": a.weight_decay,
                    "--batch-size": a.batch_size, "--val-fraction": a.val_fraction,
                    "--stats": common.statistics_setting(self.stats),
                    # NHWC kernels sum in another order: the same run in NCHW is not bit-identical
                    "--channels-last": bool(a.channels_last)}
        if a.model == "tiramisu":
            settings.update({"--growth-rate": a.growth_rate,
                             "--tiramisu-layers": ",".join(map(str, self.tiramisu_layers)),
                             "--bottleneck-layers": a.bottleneck_layers, "--first-channels": a.first_channels,
                             "--dropout": a.dropout})
        else:
            settings.update({"--encoder": a.encoder, "--decoder-channels": a.decoder_channels})
        if a.larc:
            settings.update({"--larc-eta": a.larc_eta, "--larc-mode": a.larc_mode})
        return settings

    def build_optimizer(self, model: nn.Module):
        a = self.args
        optimizer = torch.optim.Adam(model.parameters(), lr=a.lr, weight_decay=a.weight_decay)
        if a.larc:
            optimizer = LARC(optimizer, eta=a.larc_eta, mode=a.larc_mode)
        if a.gradient_lag:
            if self.dist.distributed and a.amp == "fp16":
                raise SystemExit("segment: --gradient-lag with --amp fp16 runs on one process only (GradScaler's "
                                 "per-rank overflow check would skip the lagged all-reduce on some ranks); use bf16")
            self.lag = LaggedOptimizer([p for p in model.parameters() if p.requires_grad], optimizer, lag=1)
            return self.lag
        return optimizer

    # -- data
    def make_source(self, source: str, dist: Dist, epoch: int) -> Any:
        a = self.args
        if source != "zfeed":
            raise SystemExit("segment: --source baseline is not available (the hackathon's xarray DataLoader "
                             "yields the inputs a lead later as targets, no labels)")
        import zfeed

        return zfeed.Loader(self.store, inputs=self.inputs, targets=[self.labels], lead=0, batch_size=a.batch_size,
                            seed=a.seed, normalize=self.stats, drop_last=True, epoch=epoch, device=zfeed_device(dist),
                            time_range=(None, self.split), **common.loader_placement(a))

    def prepare(self, raw: Any, device: torch.device) -> dict:
        from ..torch import to_torch

        tensors = to_torch(raw)
        x, y, times = tensors["inputs"], tensors["targets"], np.asarray(raw["times"])
        full = len(times) == self.args.batch_size
        # Throughput counts the data read from the store: the decoded inputs as delivered
        # (float32), the labels at their stored size, not the int64 they are widened to.
        delivered = int(x.nbytes) + int(y.numel()) * self.label_itemsize
        return {"inputs": self._to(x, device), "targets": y.to(device, non_blocking=device.type == "cuda"),
                "times": times, "samples": int(x.shape[0]), "bytes": delivered, "full": full}

    def _to(self, x: torch.Tensor, device: torch.device) -> torch.Tensor:
        x = x.to(device, non_blocking=device.type == "cuda")
        if self.args.channels_last:
            x = x.contiguous(memory_format=torch.channels_last)
        return x

    def _weights(self, device: torch.device) -> torch.Tensor:
        if self._device_weights is None or self._device_weights.device != device:
            self._device_weights = self.weights.to(device)
        return self._device_weights

    def loss(self, model: nn.Module, batch: dict) -> torch.Tensor:
        if self.lag is not None and isinstance(model, torch.nn.parallel.DistributedDataParallel):
            # gradient lag all-reduces itself: DDP must not (its choice is made at forward time)
            with model.no_sync():
                logits = model(batch["inputs"])
        else:
            logits = model(batch["inputs"])
        return weighted_cross_entropy(logits, batch["targets"], self._weights(logits.device))

    # -- validation
    def validate(self, model: nn.Module, dist: Dist) -> dict | None:
        if not self.val_times:
            return None
        inner = common.unwrap(model)
        inner.eval()
        device = dist.device
        cm = ConfusionMatrix(self.classes, device=device)
        background = ConfusionMatrix(self.classes, device=device)
        sums = torch.zeros(2, dtype=torch.float64, device=device)  # loss * n, n
        mine = self.val_times[dist.rank::dist.world_size]
        bs = max(int(self.args.batch_size), 1)
        means = np.array([self.stats[n][0] for n in self.inputs], dtype=np.float32).reshape(1, -1, 1, 1)
        stds = np.array([self.stats[n][1] for n in self.inputs], dtype=np.float32).reshape(1, -1, 1, 1)
        with torch.no_grad():
            for i in range(0, len(mine), bs):
                ts = mine[i:i + bs]
                start, stop = ts[0], ts[-1] + 1
                idx = np.asarray(ts) - start
                # decoded as the Loader decodes (CF packing; a missing label is -100, ignored)
                x = np.stack([common.read_decoded(self.group[n], start, stop, self.encodings[n])[idx]
                              for n in self.inputs], axis=1)
                x = torch.from_numpy((x - means) / stds)
                labels = common.read_labels(self.group[self.labels], start, stop, self.encodings[self.labels])
                y = torch.from_numpy(labels[idx]).to(device)
                logits = inner(self._to(x, device)).float()
                cm.update(logits, y)
                background.update(torch.zeros_like(y), y)
                sums[0] += float(weighted_cross_entropy(logits, y, self._weights(device))) * len(ts)
                sums[1] += len(ts)
        if dist.distributed:
            cm.all_reduce()
            background.all_reduce()
            dist.all_reduce_sum(sums)
        n = float(sums[1])
        iou = cm.iou()
        # One rule for both predictors: a class in neither the labels nor the predictions has no
        # IoU (None) and is left out of the mean.
        bg_iou = background.iou()
        out = {
            "samples": int(n), "times": [self.split, self.times], "loss": float(sums[0]) / max(n, 1),
            "iou": {name: _none_if_nan(v) for name, v in zip(self.class_names, iou.tolist())},
            "mean_iou": _none_if_nan(cm.mean_iou()), "accuracy": cm.accuracy(),
            "background_only_iou": {name: _none_if_nan(v) for name, v in zip(self.class_names, bg_iou.tolist())},
            "background_only_mean_iou": _none_if_nan(background.mean_iou()),
            "confusion_matrix": cm.matrix.cpu().tolist(),
        }
        for name in self.class_names:
            out[f"iou_{name}"] = out["iou"][name]
        return out


def validation_table(validation: dict) -> str:
    lines = [f"validation on {validation['samples']} held-out samples (times {validation['times'][0]}.."
             f"{validation['times'][1] - 1}), IoU from the confusion matrix:",
             f"  {'class':<12} {'model':>8} {'background only':>16}"]

    def cell(value: float | None) -> str:
        return f"{value:.4f}" if value is not None else "-"

    for name, v in validation["iou"].items():
        lines.append(f"  {name:<12} {cell(v):>8} {cell(validation['background_only_iou'][name]):>16}")
    lines.append(f"  {'mean':<12} {cell(validation['mean_iou']):>8} {cell(validation['background_only_mean_iou']):>16}")
    if None in (*validation["iou"].values(), *validation["background_only_iou"].values()):
        lines.append("  (-: a class in neither the labels nor the predictions, left out of the mean)")
    lines.append(f"  pixel accuracy {validation['accuracy']:.4f}, weighted loss {validation['loss']:.4f}")
    return "\n".join(lines)


# -------------------------------------------------------------------------------------------
# Command line


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="zfeed train segment",
        description="Train a DeepLabv3+ or Tiramisu to segment tropical cyclones and atmospheric rivers (SC18 / "
                    "MLPerf HPC DeepCAM) on CAM5-like data, report IoU per class on held-out times against a "
                    "background-only predictor, and account for throughput.")
    p.add_argument("--store", required=True, help="Zarr store with (time, lat, lon) arrays (zfeed synth cam5)")
    p.add_argument("--inputs", default=",".join(CHANNELS), help="input channels, comma-separated (default: the 16 "
                                                                  "CAM5 channels)")
    p.add_argument("--labels", default="labels", help="integer label array (default labels)")
    p.add_argument("--classes", type=int, default=3, help="classes (default 3: background, cyclone, river)")
    p.add_argument("--val-fraction", type=float, default=0.1, help="held-out last fraction of the times (default 0.1)")
    p.add_argument("--stats", choices=("store", "train"), default="store",
                   help="input normalization: the arrays' zfeed_stats (computed over the training times where "
                        "missing) or always the training times' (default store)")
    m = p.add_argument_group("model")
    m.add_argument("--model", choices=("tiramisu", "deeplabv3plus"), default="deeplabv3plus",
                   help="deeplabv3plus (default) or tiramisu")
    m.add_argument("--encoder", default="resnet50", help="DeepLabv3+ encoder (default resnet50, as SC18)")
    m.add_argument("--decoder-channels", type=int, default=256, help="DeepLabv3+ decoder channels (default 256)")
    m.add_argument("--growth-rate", type=int, default=12, help="Tiramisu growth rate (default 12; SC18 used 32)")
    m.add_argument("--tiramisu-layers", default="4,5,7,10,12",
                   help="Tiramisu dense layers per down level (default 4,5,7,10,12: FC-DenseNet103)")
    m.add_argument("--bottleneck-layers", type=int, default=15, help="Tiramisu bottleneck layers (default 15)")
    m.add_argument("--first-channels", type=int, default=48, help="Tiramisu first convolution's features (default 48)")
    m.add_argument("--dropout", type=float, default=0.2, help="Tiramisu dropout (default 0.2)")
    m.add_argument("--channels-last", action="store_true", help="NHWC parameters and inputs")
    o = p.add_argument_group("loss and optimizer")
    o.add_argument("--weights-exponent", type=float, default=0.5,
                   help="class weights freq ** -exponent (default 0.5, SC18's inverse square root; DeepCAM 0.125)")
    o.add_argument("--weights-normalize", choices=("none", "min", "mean", "pixels"), default="pixels",
                   help="class weight normalization (default pixels: frequency-weighted mean weight 1)")
    o.add_argument("--larc", action="store_true", help="wrap Adam in LARC")
    o.add_argument("--larc-eta", type=float, default=0.002, help="LARC trust coefficient (default 0.002)")
    o.add_argument("--larc-mode", choices=("clip", "clip_lr", "scale"), default="clip",
                   help="LARC factor: min(trust, 1) (clip, default), min(trust / lr, 1), or trust")
    o.add_argument("--gradient-lag", action="store_true",
                   help="gradient lag 1: step k applies the gradients all-reduced at step k - 1")
    o.add_argument("--no-val", action="store_true", help="skip validation")
    common.add_common_arguments(p)
    return p


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    sources = common.parse_list(args.source, common.SOURCES, "--source")
    if "baseline" in sources:
        raise SystemExit("segment: --source baseline is not available (the hackathon's xarray DataLoader has no labels)")

    def before_run(task: SegmentTask) -> None:
        task.lag = None

    def after_run(task: SegmentTask, summary: dict) -> None:
        if task.lag is not None:
            summary["gradient_lag_updates"] = task.lag.lag.updates

    what = f"Tiramisu (growth {args.growth_rate})" if args.model == "tiramisu" else f"DeepLabv3+ ({args.encoder})"
    return common.run_recipe(
        args, "segment", SegmentTask, sources, validation_table=validation_table,
        before_run=before_run, after_run=after_run,
        describe=lambda task: {
            "inputs": task.inputs, "labels": task.labels, "classes": task.class_names, "model": args.model,
            "grid": [task.height, task.width], "times": task.times, "split": task.split,
            "label_counts": task.label_counts.tolist(), "class_frequencies": task.frequencies.tolist(),
            "class_weights": task.weights.tolist(), "weights_exponent": args.weights_exponent,
            "weights_normalize": args.weights_normalize, "larc": args.larc, "gradient_lag": args.gradient_lag,
            "amp": args.amp, "channels_last": args.channels_last},
        plot_title=lambda task: f"segment {what}, batch {args.batch_size}, {task.height}x{task.width}x{len(task.inputs)}")


if __name__ == "__main__":
    sys.exit(main())
