"""A short CPU training run that shows the segmentation pieces learn: ``python -m
zfeed.recipes.segment_smoke``.

It writes CAM5-like data with ``zfeed synth cam5`` (a small grid), computes the training store's
input statistics with ``zfeed stats`` (inputs only: the labels stay integers), reads batches with
:class:`zfeed.Loader` (labels int64 ``[batch, lat, lon]``), trains a small model with the
frequency-weighted cross entropy, and reports the IoU per class on held-out data (another seed)
next to that of a model predicting background everywhere (IoU 0 for cyclones and rivers). The
held-out data are normalized with the training store's statistics, as the model was trained
(never with statistics of their own). Exit status 1 when cyclone or river IoU is not above
``--min-iou``.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time

import torch

from .segment_losses import ConfusionMatrix, class_frequencies, class_weights, label_counts, weighted_cross_entropy
from .segment_models import build_model
from .segment_optim import LARC, GradientLag, MixedPrecision

CHANNELS = ["TMQ", "U850", "V850", "UBOT", "VBOT", "QREFHT", "PS", "PSL", "T200", "T500", "PRECT", "TS",
            "TREFHT", "Z1000", "Z200", "ZBOT"]
CLASSES = ("background", "cyclone", "river")


def _zfeed_command() -> list[str]:
    exe = shutil.which("zfeed") or os.path.join(os.path.dirname(sys.executable), "zfeed")
    return [exe]


def make_data(path: str, lat: int, lon: int, times: int, seed: int = 0, stats: bool = True) -> None:
    """``zfeed synth cam5`` then (``stats``: a training store) ``zfeed stats`` on the 16 input
    channels."""
    zfeed = _zfeed_command()
    subprocess.run(zfeed + ["synth", "cam5", path, "--lat", str(lat), "--lon", str(lon), "--times", str(times),
                            "--seed", str(seed), "--overwrite", "-q"], check=True)
    if stats:
        subprocess.run(zfeed + ["stats", path, "--variables", ",".join(CHANNELS)], check=True,
                       stdout=subprocess.DEVNULL)


def training_statistics(train_path: str) -> dict:
    """``{channel: (mean, std)}`` of the training store: its ``zfeed_stats``, else computed over
    all its times (``zfeed stats --no-write``)."""
    import zfeed

    from .forecast import resolve_statistics

    group = zfeed.open(train_path)
    stats, _ = resolve_statistics(train_path, group, CHANNELS, group[CHANNELS[0]].shape[0], "store",
                                  recipe="segment_smoke")
    return stats


def run(train_path: str, val_path: str, model_name: str = "deeplabv3plus", steps: int = 100, batch_size: int = 4,
        lr: float = 1e-3, exponent: float = 0.5, larc: bool = False, lag: int = 0, precision: str = "fp32",
        channels_last: bool = True, seed: int = 0, model_options: dict | None = None, log=print) -> dict:
    """Train ``steps`` steps on ``train_path`` and return the metrics on ``val_path``, both
    normalized with the training store's statistics (:func:`training_statistics`)."""
    import zfeed
    from zfeed.torch import to_torch
    torch.manual_seed(seed)
    stats = training_statistics(train_path)
    loader = zfeed.Loader(train_path, inputs=CHANNELS, targets=["labels"], lead=0, batch_size=batch_size,
                          seed=seed, rank=0, world_size=1, normalize=stats)
    options = dict(model_options or {})
    if model_name.startswith("deeplab"):
        options.setdefault("encoder", "resnet18")
        options.setdefault("decoder_channels", 64)
    else:
        options.setdefault("growth_rate", 12)
        options.setdefault("layers", (3, 3, 3))
        options.setdefault("bottleneck_layers", 3)
        options.setdefault("first_channels", 32)
        options.setdefault("dropout", 0.0)
    model = build_model(model_name, channels_last=channels_last, **options)
    base = torch.optim.Adam(model.parameters(), lr=lr)
    optimizer = LARC(base) if larc else base
    amp = MixedPrecision(precision, device_type="cpu")
    lagger = GradientLag(model.parameters(), optimizer, lag=lag) if lag else None

    counts = torch.zeros(3, dtype=torch.int64)
    for batch in loader:   # class weights from the training labels (one pass over the epoch)
        counts += label_counts(to_torch(batch)["targets"])
    freq = class_frequencies(counts)
    weights = class_weights(freq, exponent=exponent, normalize="pixels")
    log(f"class frequencies {[round(float(f), 5) for f in freq]}, weights {[round(float(w), 3) for w in weights]}")

    def batches():
        epoch = 0
        while True:
            loader.set_epoch(epoch)
            for batch in loader:
                b = to_torch(batch)
                yield b["inputs"], b["targets"]
            epoch += 1

    model.train()
    start = time.perf_counter()
    losses = []
    it = batches()
    for step in range(steps):
        x, y = next(it)
        if channels_last:
            x = x.contiguous(memory_format=torch.channels_last)
        optimizer.zero_grad(set_to_none=True)
        with amp.autocast():
            logits = model(x)
        loss = weighted_cross_entropy(logits, y, weights)
        amp.backward(loss)
        if lagger is not None:
            lagger.step(scaler=amp.scaler)
        else:
            amp.step(optimizer)
        losses.append(float(loss.detach()))
        if step % 20 == 0 or step == steps - 1:
            log(f"step {step:4d} loss {losses[-1]:.4f} ({time.perf_counter() - start:.1f} s)")
    train_s = time.perf_counter() - start

    model.eval()
    cm, background = ConfusionMatrix(3), ConfusionMatrix(3)
    # The model learned on inputs normalized with the training statistics: the held-out inputs get
    # the same, whatever statistics the held-out store carries.
    val = zfeed.Loader(val_path, inputs=CHANNELS, targets=["labels"], lead=0, batch_size=batch_size, shuffle=False,
                       drop_last=False, rank=0, world_size=1, normalize=stats)
    with torch.no_grad():
        for batch in val:
            b = to_torch(batch)
            x, y = b["inputs"], b["targets"]
            if channels_last:
                x = x.contiguous(memory_format=torch.channels_last)
            with amp.autocast():
                logits = model(x)
            cm.update(logits.float(), y)
            background.update(torch.zeros_like(y), y)
    return {"model": model_name, "steps": steps, "batch_size": batch_size, "train_seconds": round(train_s, 1),
            "first_loss": losses[0], "last_loss_mean10": sum(losses[-10:]) / len(losses[-10:]),
            "iou": dict(zip(CLASSES, cm.iou().tolist())), "mean_iou": cm.mean_iou(),
            # the model's rule: a class in neither labels nor predictions has no IoU (NaN) and is
            # left out of the mean
            "background_only_iou": dict(zip(CLASSES, background.iou().tolist())),
            "background_only_mean_iou": background.mean_iou(),
            "larc": larc, "lag": lag, "precision": precision}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m zfeed.recipes.segment_smoke", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="tiramisu", help="tiramisu (default) or deeplabv3plus")
    parser.add_argument("--train", help="an existing cam5 store (its zfeed_stats normalize training and "
                                        "validation; computed where missing; default: synthesize one)")
    parser.add_argument("--val", help="an existing held-out cam5 store (default: synthesize one, another seed)")
    parser.add_argument("--lat", type=int, default=48)
    parser.add_argument("--lon", type=int, default=72)
    parser.add_argument("--times", type=int, default=96)
    parser.add_argument("--val-times", type=int, default=16)
    parser.add_argument("--steps", type=int, default=100)
    parser.add_argument("--batch-size", type=int, default=4)
    parser.add_argument("--lr", type=float, default=1e-3)
    parser.add_argument("--exponent", type=float, default=0.5)
    parser.add_argument("--larc", action="store_true")
    parser.add_argument("--lag", type=int, default=0)
    parser.add_argument("--precision", default="fp32")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--min-iou", type=float, default=0.1)
    parser.add_argument("--json", help="write the result here")
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    with tempfile.TemporaryDirectory() as tmp:
        train, val = args.train, args.val
        if train is None:
            train = os.path.join(tmp, "train.zarr")
            make_data(train, args.lat, args.lon, args.times, seed=args.seed)
        if val is None:
            val = os.path.join(tmp, "val.zarr")
            make_data(val, args.lat, args.lon, args.val_times, seed=args.seed + 1000, stats=False)
        result = run(train, val, args.model, steps=args.steps, batch_size=args.batch_size, lr=args.lr,
                     exponent=args.exponent, larc=args.larc, lag=args.lag, precision=args.precision,
                     seed=args.seed)
    print(json.dumps(result, indent=2))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(result, f, indent=2)
    ok = result["iou"]["cyclone"] > args.min_iou and result["iou"]["river"] > args.min_iou
    print("OK: cyclone and river IoU above the background-only predictor's 0" if ok else
          f"FAIL: cyclone or river IoU not above {args.min_iou}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
