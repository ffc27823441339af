"""``zfeed train forecast``: next-step forecasting, the GPU-native Zarr hackathon's benchmark.

A U-Net (segmentation-models-pytorch, ResNet encoder, ``encoder_weights=None`` so nothing is
downloaded, ``decoder_attention_type="scse"`` as the hackathon) maps the input fields at time t to
the target fields at t + lead (normalized with each array's ``zfeed_stats``); loss MSE or the
hackathon's RMSE + 0.1 * |std(pred) - std(target)|; AdamW.

Train/validation split by time: the last ``--val-fraction`` of the time axis is held out. The
training Loader reads only the times before the split (``time_range=(None, split)``: every sample's
inputs and targets, ``t - history + 1 .. t + lead``, lie before it), so its batches are full and no
held-out time is read for training. Validation reads the held-out times straight
from the arrays (``zfeed.open``), decodes them as the Loader does (CF ``scale_factor``,
``add_offset``, missing values: :func:`zfeed.recipes.common.read_decoded`), normalizes them the
same way, and reports per variable, in
physical units, the RMSE of the model and of persistence (x_t predicting x_{t+lead}) and their
ratio (below 1: the model beats persistence).

Forecaster's context: ``--history N`` feeds the inputs at t-N+1..t (zfeed.Loader's ``history``,
oldest first, as channels; the residual base stays x_t, the last step), so the net sees the
tendency; ``--time-features`` adds four constant channels, sin/cos of the hour of day and of the
day of year of time t, from the store's time coordinate (CF units, "<unit> since <date>").

The grid need not divide by the U-Net's downsampling: inputs are padded (circularly along a global
longitude, by replication otherwise) up to a multiple of 2**encoder_depth and the output cropped.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import shutil
import subprocess
import sys
from typing import Any, Sequence

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from . import common
from .common import Dist, Task, log, zfeed_device


# -------------------------------------------------------------------------------------------
# Loss and model


def hackathon_loss(pred: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    """RMSE + 0.1 * |std(pred) - std(target)| over the whole batch (``torch.std``: the unbiased,
    n - 1 estimate), as the hackathon's ``train_unet.py``."""
    rmse = torch.sqrt(F.mse_loss(pred, target))
    return rmse + 0.1 * torch.abs(pred.std() - target.std())


def mse_loss(pred: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    return F.mse_loss(pred, target)


LOSSES = {"mse": mse_loss, "hackathon": hackathon_loss}


class PaddedUnet(nn.Module):
    """smp.Unet on any grid: pad to a multiple of 2**depth, run, crop. ``residual``: the output is
    added to the inputs' channels ``residual_index`` (predict the change)."""

    def __init__(self, in_channels: int, out_channels: int, encoder: str = "resnet18", encoder_depth: int = 5,
                 decoder_channels: Sequence[int] | None = None, periodic_lon: bool = False,
                 residual_index: Sequence[int] | None = None):
        super().__init__()
        import segmentation_models_pytorch as smp

        if decoder_channels is None:
            decoder_channels = (256, 128, 64, 32, 16)[:encoder_depth]
        self.net = smp.Unet(encoder_name=encoder, encoder_weights=None, encoder_depth=encoder_depth,
                            decoder_channels=list(decoder_channels), decoder_attention_type="scse",
                            in_channels=in_channels, classes=out_channels)
        self.multiple = 2 ** encoder_depth
        self.periodic_lon = periodic_lon
        self.residual_index = list(residual_index) if residual_index is not None else None
        self._freeze_unused(in_channels)

    def _freeze_unused(self, in_channels: int) -> None:
        """smp builds some parameters its forward never uses (the attention before the skip-less
        last decoder block; the encoder stages past ``encoder_depth``). They would never get a
        gradient (so AdamW never touches them), but DistributedDataParallel waits for every
        parameter's gradient: mark them frozen. One backward in eval mode (no BatchNorm update)
        on zeros finds them."""
        was_training = self.training
        self.eval()
        with torch.enable_grad():
            self.net(torch.zeros(1, in_channels, self.multiple, self.multiple)).sum().backward()
        for p in self.parameters():
            if p.grad is None:
                p.requires_grad_(False)
            p.grad = None
        self.train(was_training)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h, w = x.shape[-2:]
        ph, pw = (-h) % self.multiple, (-w) % self.multiple
        y = x
        if pw:
            if self.periodic_lon and pw <= w:
                y = F.pad(y, (pw // 2, pw - pw // 2, 0, 0), mode="circular")
            else:
                y = F.pad(y, (pw // 2, pw - pw // 2, 0, 0), mode="replicate")
        if ph:
            y = F.pad(y, (0, 0, ph // 2, ph - ph // 2), mode="replicate")
        out = self.net(y)[..., ph // 2: ph // 2 + h, pw // 2: pw // 2 + w]
        if self.residual_index is not None:
            out = out + x[:, self.residual_index]
        return out


# -------------------------------------------------------------------------------------------
# Statistics


def _zfeed_command() -> str | None:
    beside = os.path.join(os.path.dirname(sys.executable), "zfeed")
    if os.path.isfile(beside) and os.access(beside, os.X_OK):
        return beside
    return shutil.which("zfeed")


def resolve_statistics(store: str, group, names: Sequence[str], split: int, stats: str,
                       recipe: str = "forecast") -> tuple[dict, str]:
    """``{name: (mean, std)}`` and where they came from. ``stats``: "store" (each array's
    ``zfeed_stats``, else computed over the training times), "train" (always computed over the
    training times 0:split with ``zfeed stats --no-write``, leaving the store as it is).
    ``recipe`` prefixes the error messages."""
    found: dict = {}
    missing = []
    for name in names:
        attrs = group[name].attrs.get("zfeed_stats") if stats == "store" else None
        if isinstance(attrs, dict) and "mean" in attrs and "std" in attrs:
            if isinstance(attrs["mean"], list):
                raise SystemExit(f"{recipe}: {name} has per-level statistics; give 2-D (time, lat, lon) variables")
            found[name] = (float(attrs["mean"]), float(attrs["std"]))
        else:
            missing.append(name)
    source = "zfeed_stats attributes"
    if missing:
        command = _zfeed_command()
        hint = (f"run `zfeed stats {store} --time 0:{split}` (the training times) to write them, "
                f"or install the zfeed command beside this Python")
        if command is None:
            raise SystemExit(f"{recipe}: no statistics for {', '.join(missing)} and no zfeed command to compute "
                             f"them; {hint}")
        run = subprocess.run([command, "stats", store, "--variables", ",".join(missing), "--time", f"0:{split}",
                              "--json", "--no-write"], capture_output=True, text=True)
        if run.returncode != 0:
            raise SystemExit(f"{recipe}: computing statistics failed ({run.stderr.strip()}); {hint}")
        computed = json.loads(run.stdout)
        for name in missing:
            found[name] = (float(computed[name]["mean"]), float(computed[name]["std"]))
        source = (f"computed over the training times 0:{split}" if len(missing) == len(names)
                  else f"zfeed_stats attributes; {', '.join(missing)} computed over the training times 0:{split}")
    for name, (_, std) in found.items():
        if not std > 0:
            raise SystemExit(f"{recipe}: {name} has standard deviation {std}: cannot normalize")
    return found, source


def _is_global_longitude(group, size: int) -> bool:
    for name in ("longitude", "lon"):
        if name in group:
            try:
                lon = np.asarray(group[name][...], dtype=np.float64)
            except Exception:
                return False
            if lon.size == size and size > 1:
                step = abs(float(lon[1] - lon[0]))
                return abs(step * size - 360.0) < 1e-3 * 360.0
    return False


_UNIT_SECONDS = {"seconds": 1.0, "second": 1.0, "s": 1.0, "minutes": 60.0, "minute": 60.0, "min": 60.0,
                 "hours": 3600.0, "hour": 3600.0, "h": 3600.0, "days": 86400.0, "day": 86400.0, "d": 86400.0}


def time_coordinate_seconds(group, size: int) -> np.ndarray:
    """The time coordinate (``time``, ``valid_time`` or ``t``) as float64 seconds since
    1970-01-01 UTC, from its CF ``units`` ("<unit> since <date>")."""
    for name in ("time", "valid_time", "t"):
        if name in group and group[name].ndim == 1 and group[name].shape[0] == size:
            arr = group[name]
            values = np.asarray(arr[...])
            if np.issubdtype(values.dtype, np.datetime64):
                return values.astype("datetime64[ns]").astype(np.int64).astype(np.float64) / 1e9
            units = str(arr.attrs.get("units", ""))
            unit, sep, origin = units.partition(" since ")
            if not sep or unit.strip().lower() not in _UNIT_SECONDS:
                raise SystemExit(f"forecast: --time-features: {name} has units {units!r}; need '<unit> since <date>'")
            origin = origin.strip().replace(" ", "T", 1).rstrip("Z")
            try:
                epoch = np.datetime64(origin, "s").astype(np.int64)
            except ValueError:
                raise SystemExit(f"forecast: --time-features: cannot read the origin of {name}'s units {units!r}")
            return values.astype(np.float64) * _UNIT_SECONDS[unit.strip().lower()] + float(epoch)
    raise SystemExit(f"forecast: --time-features needs a time coordinate (time, valid_time or t) of {size} values")


def time_features(seconds: np.ndarray) -> np.ndarray:
    """[n, 4] float32: sin/cos of the hour of day (UTC) and of the day of year (a 365.2425-day
    year) of each time."""
    days = np.asarray(seconds, dtype=np.float64) / 86400.0
    day_phase = 2 * np.pi * (days % 1.0)
    year_phase = 2 * np.pi * ((days % 365.2425) / 365.2425)
    return np.stack([np.sin(day_phase), np.cos(day_phase), np.sin(year_phase), np.cos(year_phase)],
                    axis=1).astype(np.float32)


# -------------------------------------------------------------------------------------------
# The task


class ForecastTask(Task):
    name = "forecast"

    def __init__(self, args: argparse.Namespace, dist: Dist):
        import zfeed

        self.args = args
        self.store = args.store
        self.inputs = [v.strip() for v in args.inputs.split(",") if v.strip()]
        self.targets = [v.strip() for v in args.targets.split(",") if v.strip()] if args.targets else list(self.inputs)
        self.lead = int(args.lead)
        if self.lead < 1:
            raise SystemExit(f"forecast: --lead must be at least 1 (the target is the time step t + lead), "
                             f"got {self.lead}")
        self.history = int(getattr(args, "history", 1))
        if self.history < 1:
            raise SystemExit(f"forecast: --history must be at least 1, got {self.history}")
        if not 1 <= args.encoder_depth <= 5:
            raise SystemExit(f"forecast: --encoder-depth must be 1 to 5, got {args.encoder_depth}")
        # The decoder's scSE attention squeezes each stage's channels by 16: fewer than 16 leave it none.
        self.decoder_channels = (common.parse_int_list(args.decoder_channels, "forecast: --decoder-channels",
                                                       minimum=16) if args.decoder_channels else None)
        if self.decoder_channels is not None and len(self.decoder_channels) != args.encoder_depth:
            raise SystemExit(f"forecast: --decoder-channels needs {args.encoder_depth} numbers (one per "
                             f"--encoder-depth stage), got {args.decoder_channels!r}")
        self.group = zfeed.open(self.store)
        shapes = {}
        for name in dict.fromkeys(self.inputs + self.targets):
            if name not in self.group:
                raise SystemExit(f"forecast: {self.store} has no array {name!r} (it has {', '.join(self.group.keys())})")
            arr = self.group[name]
            if arr.ndim != 3:
                raise SystemExit(f"forecast: {name} has shape {arr.shape}; give (time, lat, lon) variables")
            shapes[name] = arr.shape
        if len(set(shapes.values())) != 1:
            raise SystemExit(f"forecast: the variables' shapes differ: {shapes}")
        self.times, self.height, self.width = next(iter(shapes.values()))
        frac = float(args.val_fraction)
        if not 0 <= frac < 1:
            raise SystemExit(f"forecast: --val-fraction must be in [0, 1), got {frac}")
        n_val = int(math.ceil(frac * self.times)) if frac > 0 else 0
        if n_val:
            n_val = max(n_val, self.lead + 1)
        self.split = self.times - n_val
        if self.split <= self.lead:
            raise SystemExit(f"forecast: {self.times} times leave no training sample with lead {self.lead} "
                             f"and --val-fraction {frac}")
        if self.split <= self.lead + self.history - 1:
            raise SystemExit(f"forecast: {self.times} times leave no training sample with lead {self.lead}, "
                             f"history {self.history} and --val-fraction {frac}")
        self.val_times = list(range(self.split, self.times - self.lead)) if n_val else []
        self.stats, self.stats_source = resolve_statistics(self.store, self.group, list(dict.fromkeys(self.inputs + self.targets)),
                                                           self.split, args.stats)
        # Validation reads the arrays directly: decoded (CF packing, missing values) as the Loader does.
        self.encodings = {name: common.cf_encoding(self.group[name], f"forecast: {name}")
                          for name in dict.fromkeys(self.inputs + self.targets)}
        self.periodic_lon = _is_global_longitude(self.group, self.width)
        self.loss_fn = LOSSES[args.loss]
        self.residual_index = None
        if args.residual:
            missing = [t for t in self.targets if t not in self.inputs]
            if missing:
                raise SystemExit(f"forecast: --residual needs every target among the inputs ({', '.join(missing)} is not)")
            last = (self.history - 1) * len(self.inputs)  # x_t: the last history step's channels
            self.residual_index = [last + self.inputs.index(t) for t in self.targets]
        self.time_seconds = time_coordinate_seconds(self.group, self.times) if args.time_features else None
        self.in_channels = self.history * len(self.inputs) + (4 if self.time_seconds is not None else 0)
        if dist.main:
            log(f"forecast: {self.store}: {self.times} times of {self.height} x {self.width}; training on times "
                f"0..{self.split - 1} (samples t + {self.lead} < {self.split}), validating on {len(self.val_times)} "
                f"samples from time {self.split}; statistics: {self.stats_source}; {self.in_channels} input channels "
                f"(history {self.history}{', time features' if self.time_seconds is not None else ''})")

    # -- model
    def build_model(self) -> nn.Module:
        a = self.args
        return PaddedUnet(self.in_channels, len(self.targets), encoder=a.encoder, encoder_depth=a.encoder_depth,
                          decoder_channels=self.decoder_channels, periodic_lon=self.periodic_lon,
                          residual_index=self.residual_index)

    def checkpoint_settings(self) -> dict:
        a = self.args
        decoder = ",".join(map(str, self.decoder_channels)) if self.decoder_channels else "default"
        return {"--inputs": ",".join(self.inputs), "--targets": ",".join(self.targets), "--lead": self.lead,
                "--history": self.history, "--time-features": self.time_seconds is not None,
                "--residual": bool(a.residual), "--loss": a.loss, "--encoder": a.encoder,
                "--encoder-depth": a.encoder_depth, "--decoder-channels": decoder, "--lr": a.lr,
                "--weight-decay": a.weight_decay}

    def build_optimizer(self, model: nn.Module) -> torch.optim.Optimizer:
        return torch.optim.AdamW(model.parameters(), lr=self.args.lr, weight_decay=self.args.weight_decay)

    # -- data
    def make_source(self, source: str, dist: Dist, epoch: int) -> Any:
        a = self.args
        if source == "zfeed":
            import zfeed

            return zfeed.Loader(self.store, inputs=self.inputs, targets=self.targets, lead=self.lead,
                                history=self.history, batch_size=a.batch_size, seed=a.seed, normalize=self.stats, drop_last=True,
                                epoch=epoch, device=zfeed_device(dist), time_range=(None, self.split),
                                **common.loader_placement(a))
        from ..baseline import make_baseline_loader

        if self.targets != self.inputs:
            raise SystemExit("forecast: --source baseline needs the targets to be the inputs (the hackathon's task)")
        if dist.distributed:
            raise SystemExit("forecast: --source baseline runs on one process (it has no rank sharding)")
        if self.history != 1 or self.time_seconds is not None:
            raise SystemExit("forecast: --source baseline takes neither --history nor --time-features")
        return make_baseline_loader(self.store, self.inputs, batch_size=a.batch_size,
                                    num_workers=a.baseline_workers, seed=a.seed, lead=self.lead,
                                    normalize=self.stats, indices=range(0, self.split - self.lead))

    def prepare(self, raw: Any, device: torch.device) -> dict:
        if isinstance(raw, dict):  # zfeed
            from ..torch import to_torch

            tensors = to_torch(raw)
            x, y, times = tensors["inputs"], tensors["targets"], np.asarray(raw["times"])
            full = len(times) == self.args.batch_size
        else:  # baseline (x, y)
            x, y = raw
            times = None
            full = int(x.shape[0]) == self.args.batch_size
        if self.time_seconds is not None and times is not None:
            x = self._with_time_features(x, times)
        non_blocking = device.type == "cuda"
        return {"inputs": x.to(device, non_blocking=non_blocking), "targets": y.to(device, non_blocking=non_blocking),
                "times": times, "samples": int(x.shape[0]), "bytes": int(x.nbytes + y.nbytes), "full": full}

    def _with_time_features(self, x: torch.Tensor, times: np.ndarray) -> torch.Tensor:
        """``x`` with the four time-of-day / day-of-year channels of each sample's time t appended
        (constant over the grid)."""
        feats = torch.from_numpy(time_features(self.time_seconds[np.asarray(times, dtype=np.int64)]))
        feats = feats.to(device=x.device, dtype=x.dtype).view(x.shape[0], 4, 1, 1).expand(-1, -1, *x.shape[-2:])
        return torch.cat([x, feats], dim=1)

    def loss(self, model: nn.Module, batch: dict) -> torch.Tensor:
        pred = model(batch["inputs"])
        return self.loss_fn(pred.float(), batch["targets"].float())

    # -- validation
    def _read(self, name: str, start: int, stop: int) -> np.ndarray:
        """Times start..stop-1 of ``name`` as the Loader delivers them: decoded, normalized."""
        mean, std = self.stats[name]
        values = common.read_decoded(self.group[name], start, stop, self.encodings[name])
        return (values - np.float32(mean)) / np.float32(std)

    def validate(self, model: nn.Module, dist: Dist) -> dict | None:
        if not self.val_times:
            return None
        inner = common.unwrap(model)
        inner.eval()
        mine = self.val_times[dist.rank::dist.world_size]
        c = len(self.targets)
        sums = torch.zeros(3 * c + 2, dtype=torch.float64)  # model sq err, persistence sq err, loss; n, batches
        bs = max(int(self.args.batch_size), 1)
        device = dist.device
        with torch.no_grad():
            for i in range(0, len(mine), bs):
                ts = mine[i:i + bs]
                # ts are a rank's stride apart; read from the oldest history step to the last target
                start, stop = ts[0] - (self.history - 1), ts[-1] + self.lead + 1
                idx = np.asarray(ts) - start
                data = {name: self._read(name, start, stop) for name in dict.fromkeys(self.inputs + self.targets)}
                # channels as the Loader's: history steps oldest first, the variables within each
                x = torch.from_numpy(np.stack([data[n][idx - (self.history - 1) + k]
                                               for k in range(self.history) for n in self.inputs], axis=1)).to(device)
                if self.time_seconds is not None:
                    x = self._with_time_features(x, np.asarray(ts))
                y = torch.from_numpy(np.stack([data[n][idx + self.lead] for n in self.targets], axis=1)).to(device)
                pred = inner(x).float()
                loss = self.loss_fn(pred, y)
                std = torch.tensor([self.stats[n][1] for n in self.targets], dtype=torch.float64, device=device)
                err = ((pred.double() - y.double()) * std.view(1, -1, 1, 1)) ** 2
                sums[:c] += err.sum(dim=(0, 2, 3)).cpu()
                persist = torch.from_numpy(np.stack([data[n][idx] for n in self.targets], axis=1)).to(device)
                perr = ((persist.double() - y.double()) * std.view(1, -1, 1, 1)) ** 2
                sums[c:2 * c] += perr.sum(dim=(0, 2, 3)).cpu()
                sums[2 * c] += float(loss) * len(ts)
                sums[3 * c] += len(ts)
        if dist.distributed:
            reduced = sums.to(device) if device.type == "cuda" else sums
            dist.all_reduce_sum(reduced)
            sums = reduced.cpu()
        n = float(sums[3 * c])
        points = n * self.height * self.width
        out: dict = {"samples": int(n), "times": [self.split, self.times], "loss": float(sums[2 * c]) / max(n, 1),
                     "variables": {}}
        for k, name in enumerate(self.targets):
            rmse = math.sqrt(float(sums[k]) / points)
            persistence = math.sqrt(float(sums[c + k]) / points)
            out["variables"][name] = {"rmse": rmse, "persistence_rmse": persistence,
                                      "ratio": rmse / persistence if persistence > 0 else None}
        ratios = [v["ratio"] for v in out["variables"].values() if v["ratio"] is not None]
        out["mean_ratio"] = float(np.mean(ratios)) if ratios else None
        return out


def validation_table(validation: dict) -> str:
    lines = [f"validation on {validation['samples']} held-out samples (times {validation['times'][0]}.."
             f"{validation['times'][1] - 1}), RMSE in physical units:",
             f"  {'variable':<10} {'model':>12} {'persistence':>12} {'ratio':>7}"]
    for name, v in validation["variables"].items():
        ratio = f"{v['ratio']:.3f}" if v["ratio"] is not None else "-"
        lines.append(f"  {name:<10} {v['rmse']:>12.5g} {v['persistence_rmse']:>12.5g} {ratio:>7}")
    if validation.get("mean_ratio") is not None:
        verdict = "beats" if validation["mean_ratio"] < 1 else "does not beat"
        lines.append(f"  mean ratio {validation['mean_ratio']:.3f}: the model {verdict} persistence "
                     f"(ratio = model RMSE / persistence RMSE)")
    return "\n".join(lines)


# -------------------------------------------------------------------------------------------
# Command line


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="zfeed train forecast",
        description="Train a U-Net to map the fields at t to t + lead (the GPU-native Zarr hackathon's "
                    "benchmark), validate against persistence on held-out times, and account for throughput.")
    p.add_argument("--store", required=True, help="Zarr store with (time, lat, lon) arrays")
    p.add_argument("--inputs", default="t2m,u500,v500,t500,z500,q500", help="input variables, comma-separated")
    p.add_argument("--targets", help="target variables (default: the inputs)")
    p.add_argument("--lead", type=int, default=1, help="time steps ahead (default 1)")
    p.add_argument("--history", type=int, default=1,
                   help="input time steps t-N+1..t stacked as channels, oldest first (default 1)")
    p.add_argument("--time-features", action="store_true",
                   help="add sin/cos of the hour of day and the day of year of t as four constant input channels "
                        "(from the store's time coordinate)")
    p.add_argument("--val-fraction", type=float, default=0.1, help="held-out last fraction of the times (default 0.1)")
    p.add_argument("--loss", choices=sorted(LOSSES), default="mse", help="mse or hackathon (RMSE + 0.1 |std diff|)")
    p.add_argument("--encoder", default="resnet18", help="segmentation-models-pytorch encoder (default resnet18)")
    p.add_argument("--encoder-depth", type=int, default=5, help="encoder stages (default 5)")
    p.add_argument("--decoder-channels", help="decoder channels per stage, comma-separated (default smp's)")
    p.add_argument("--residual", action="store_true", help="predict the change: output = x_t + U-Net(x_t)")
    p.add_argument("--stats", choices=("store", "train"), default="store",
                   help="normalization: the arrays' zfeed_stats (computed over the training times where "
                        "missing) or always the training times' (default store)")
    p.add_argument("--no-val", action="store_true", help="skip validation")
    common.add_common_arguments(p)
    return p


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    sources = common.parse_list(args.source, common.SOURCES, "--source")
    return common.run_recipe(
        args, "forecast", ForecastTask, sources, validation_table=validation_table,
        describe=lambda task: {
            "inputs": task.inputs, "targets": task.targets, "lead": task.lead, "history": task.history,
            "time_features": task.time_seconds is not None, "input_channels": task.in_channels,
            "grid": [task.height, task.width], "times": task.times, "split": task.split},
        plot_title=lambda task: f"forecast U-Net ({args.encoder}), batch {args.batch_size}, "
                                f"{task.height}x{task.width}x{len(task.inputs)}")


if __name__ == "__main__":
    sys.exit(main())
