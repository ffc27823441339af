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
day of year of time t, from the store's time coordinate (CF units, "<unit> since <date>", and CF
calendar: a noleap year, CAM5's, has 365 days, a 360_day year 360; an unknown calendar is refused).

The grid need not divide by the U-Net's downsampling: inputs are padded (circularly along a global
longitude, by replication otherwise) up to a multiple of 2**encoder_depth and the output cropped.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import re
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

# CF calendars (the time variable's ``calendar`` attribute, case-insensitive; "standard" where it
# has none), by their canonical names. "standard" is the mixed one: Julian up to 1582-10-04,
# Gregorian from 1582-10-15.
CALENDARS = {"standard": "standard", "gregorian": "standard", "proleptic_gregorian": "proleptic_gregorian",
             "julian": "julian", "noleap": "noleap", "365_day": "noleap", "all_leap": "all_leap",
             "366_day": "all_leap", "360_day": "360_day"}
# Month lengths of the calendars whose every year is alike (climate models' calendars; CAM5's
# output is noleap).
_FIXED_MONTHS = {"noleap": (31, 28, 31, 30, 31, 30, 31, 31, 30, 31, 30, 31),
                 "all_leap": (31, 29, 31, 30, 31, 30, 31, 31, 30, 31, 30, 31),
                 "360_day": (30,) * 12}
_GREGORIAN_START = (1582, 10, 15)  # the standard calendar's first Gregorian day

# "<date>[( |T)<h>:<m>[:<s>]][ Z| UTC| +hh[:mm]]" as CF units write the reference time; years,
# months and days may have one digit ("1-1-1").
_REFERENCE_TIME = re.compile(
    r"^\s*(?P<year>[+-]?\d+)-(?P<month>\d{1,2})-(?P<day>\d{1,2})"
    r"(?:(?:T|\s+)(?P<hour>\d{1,2}):(?P<minute>\d{1,2})(?::(?P<second>\d{1,2}(?:\.\d*)?))?)?"
    r"\s*(?:Z|UTC|GMT|(?P<zsign>[+-])(?P<zhour>\d{1,2})(?::?(?P<zminute>\d{2}))?)?\s*$", re.IGNORECASE)


def _day_number(year, month, day, julian):
    """Days from a fixed epoch (the Julian Day Number) of a date of the Julian or the proleptic
    Gregorian calendar (years from -4700 on); integers or int64 arrays."""
    a = (14 - month) // 12
    y = year + 4800 - a
    m = month + 12 * a - 3
    days = day + (153 * m + 2) // 5 + 365 * y + y // 4
    return days - 32083 if julian else days - y // 100 + y // 400 - 32045


def _year_of_day_number(day_number: np.ndarray, julian: bool) -> np.ndarray:
    """The year (Julian or proleptic Gregorian calendar) of each Julian Day Number (Richards'
    algorithm)."""
    f = day_number + 1401
    if not julian:
        f = f + (((4 * day_number + 274277) // 146097) * 3) // 4 - 38
    e = 4 * f + 3
    h = 5 * ((e % 1461) // 4) + 2
    month = (h // 153 + 2) % 12 + 1
    return e // 1461 - 4716 + (14 - month) // 12


def _month_lengths(calendar: str, year: int, before_gregorian: bool) -> tuple:
    if calendar in _FIXED_MONTHS:
        return _FIXED_MONTHS[calendar]
    julian = calendar == "julian" or (calendar == "standard" and before_gregorian)
    leap = year % 4 == 0 if julian else (year % 4 == 0 and (year % 100 != 0 or year % 400 == 0))
    return (31, 29 if leap else 28, 31, 30, 31, 30, 31, 31, 30, 31, 30, 31)


def calendar_phases(values: np.ndarray, units: str, calendar: str, what: str = "time") -> tuple[np.ndarray, np.ndarray]:
    """Where in its day and in its year each time falls: ``(day_fraction, year_fraction)``, float64
    arrays in [0, 1). ``values`` in CF ``units`` ("<unit> since <date>") of the CF ``calendar``:
    the day of year and the year's length are the calendar's (365 days every year in noleap, 360 in
    360_day, 366 in all_leap; leap years by the Julian rule in julian, by the Gregorian rule in
    proleptic_gregorian, and by the rule in force at the date in standard). ``what`` (the
    variable's name) is in the error messages: SystemExit for units or a calendar it cannot read."""
    name = CALENDARS.get(str(calendar).strip().lower())
    if name is None:
        raise SystemExit(f"forecast: --time-features: {what} has calendar {calendar!r}, not a CF calendar this "
                         f"recipe knows ({', '.join(CALENDARS)})")
    unit, sep, reference = str(units).partition(" since ")
    unit = unit.strip().lower()
    if not sep or unit not in _UNIT_SECONDS:
        raise SystemExit(f"forecast: --time-features: {what} has units {units!r}; need '<unit> since <date>' with a "
                         "unit of days, hours, minutes or seconds")
    match = _REFERENCE_TIME.match(reference)
    if not match:
        raise SystemExit(f"forecast: --time-features: cannot read the reference time of {what}'s units {units!r}")
    year, month, day = (int(match[k]) for k in ("year", "month", "day"))
    before_gregorian = (year, month, day) < _GREGORIAN_START
    months = _month_lengths(name, year, before_gregorian)
    if not (1 <= month <= 12 and 1 <= day <= months[month - 1]) or (
            name == "standard" and (1582, 10, 5) <= (year, month, day) < _GREGORIAN_START):
        raise SystemExit(f"forecast: --time-features: {what}'s units {units!r} name a date the {calendar} calendar "
                         "does not have")
    reference_seconds = (int(match["hour"] or 0) * 3600 + int(match["minute"] or 0) * 60
                         + float(match["second"] or 0))
    if match["zsign"]:  # a reference time in local time: UTC = local - offset
        zone = int(match["zhour"]) * 3600 + int(match["zminute"] or 0) * 60
        reference_seconds -= zone if match["zsign"] == "+" else -zone

    # Seconds since the reference day's midnight, split into whole days and the rest, so that the
    # day count stays an exact integer.
    seconds = np.asarray(values, dtype=np.float64) * _UNIT_SECONDS[unit] + reference_seconds
    if not np.isfinite(seconds).all():
        raise SystemExit(f"forecast: --time-features: {what} has values that are not finite numbers")
    whole_days = np.floor(seconds / 86400.0)
    day_fraction = np.clip((seconds - whole_days * 86400.0) / 86400.0, 0.0, np.nextafter(1.0, 0.0))
    whole_days = whole_days.astype(np.int64)

    if name in _FIXED_MONTHS:
        year_length = sum(months)
        day_of_year = (sum(months[:month - 1]) + day - 1 + whole_days) % year_length
        return day_fraction, (day_of_year + day_fraction) / year_length

    julian_reference = name == "julian" or (name == "standard" and before_gregorian)
    day_number = _day_number(year, month, day, julian_reference) + whole_days
    if name == "standard":
        julian = day_number < _day_number(*_GREGORIAN_START, julian=False)
    else:
        julian = np.full(day_number.shape, name == "julian")
    day_of_year = np.empty(day_number.shape, dtype=np.int64)
    year_length = np.empty(day_number.shape, dtype=np.int64)
    for rule in (True, False):
        days = day_number[julian == rule]
        if days.size:
            years = _year_of_day_number(days, julian=rule)
            first = _day_number(years, 1, 1, julian=rule)
            day_of_year[julian == rule] = days - first
            year_length[julian == rule] = _day_number(years + 1, 1, 1, julian=rule) - first
    return day_fraction, (day_of_year + day_fraction) / year_length


def time_coordinate_phases(group, size: int) -> tuple[np.ndarray, np.ndarray]:
    """:func:`calendar_phases` of the store's time coordinate (``time``, ``valid_time`` or ``t``,
    of ``size`` values), from its CF ``units`` and ``calendar``; a datetime64 coordinate is
    numpy's proleptic Gregorian calendar."""
    for name in ("time", "valid_time", "t"):
        if name in group and group[name].ndim == 1 and group[name].shape[0] == size:
            arr = group[name]
            values = np.asarray(arr[...])
            if np.issubdtype(values.dtype, np.datetime64):
                nanoseconds = values.astype("datetime64[ns]").astype(np.int64)
                return calendar_phases(nanoseconds.astype(np.float64) / 1e9, "seconds since 1970-01-01",
                                       "proleptic_gregorian", name)
            return calendar_phases(values, str(arr.attrs.get("units", "")), arr.attrs.get("calendar", "standard"),
                                   name)
    raise SystemExit(f"forecast: --time-features needs a time coordinate (time, valid_time or t) of {size} values")


def time_features(day_fraction: np.ndarray, year_fraction: np.ndarray) -> np.ndarray:
    """[n, 4] float32: sin/cos of the time of day (UTC) and of the time of year, from
    :func:`calendar_phases`."""
    day_phase = 2 * np.pi * np.asarray(day_fraction, dtype=np.float64)
    year_phase = 2 * np.pi * np.asarray(year_fraction, dtype=np.float64)
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
        # [times, 4]: each time's sin/cos of the time of day and of the time of year (its calendar's)
        self.time_table = time_features(*time_coordinate_phases(self.group, self.times)) if args.time_features else None
        self.in_channels = self.history * len(self.inputs) + (4 if self.time_table is not None else 0)
        if dist.main:
            log(f"forecast: {self.store}: {self.times} times of {self.height} x {self.width}; training on times "
                f"0..{self.split - 1} (samples t + {self.lead} < {self.split}), validating on {len(self.val_times)} "
                f"samples from time {self.split}; statistics: {self.stats_source}; {self.in_channels} input channels "
                f"(history {self.history}{', time features' if self.time_table is not None else ''})")

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
                "--history": self.history, "--time-features": self.time_table is not None,
                "--residual": bool(a.residual), "--loss": a.loss, "--encoder": a.encoder,
                "--encoder-depth": a.encoder_depth, "--decoder-channels": decoder, "--lr": a.lr,
                "--weight-decay": a.weight_decay, "--batch-size": a.batch_size, "--val-fraction": a.val_fraction,
                "--stats": common.statistics_setting(self.stats)}

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
        if self.history != 1 or self.time_table is not None:
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
        # Throughput counts the data read from the store: the decoded input and target values as
        # delivered (float32), before the time features, which are computed, not read.
        delivered = int(x.nbytes + y.nbytes)
        if self.time_table is not None and times is not None:
            x = self._with_time_features(x, times)
        non_blocking = device.type == "cuda"
        return {"inputs": x.to(device, non_blocking=non_blocking), "targets": y.to(device, non_blocking=non_blocking),
                "times": times, "samples": int(x.shape[0]), "bytes": delivered, "full": full}

    def _with_time_features(self, x: torch.Tensor, times: np.ndarray) -> torch.Tensor:
        """``x`` with the four time-of-day / day-of-year channels of each sample's time t appended
        (constant over the grid)."""
        feats = torch.from_numpy(self.time_table[np.asarray(times, dtype=np.int64)])
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
                if self.time_table is not None:
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
                        "(from the store's time coordinate, in its CF calendar)")
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
            "time_features": task.time_table is not None, "input_channels": task.in_channels,
            "grid": [task.height, task.width], "times": task.times, "split": task.split},
        plot_title=lambda task: f"forecast U-Net ({args.encoder}), batch {args.batch_size}, "
                                f"{task.height}x{task.width}x{len(task.inputs)}")


if __name__ == "__main__":
    sys.exit(main())
