"""The baseline reader: the GPU-native Zarr hackathon's data loading, reproduced.

pangeo-data/ncar-hackathon-xarray-on-gpus, ``zarr_ML_optimization/train_unet.py`` with its
``era5_dataloader.py`` (``ERA5Dataset`` + ``PyTorchERA5Dataset``): xarray opens the Zarr store, and a
PyTorch ``Dataset`` returns per item the variables at time ``i`` stacked into channels,
``ds[variables].isel(time=i).to_array().values``, as input and the same at ``i + lead`` as target;
a ``torch.utils.data.DataLoader`` with worker processes batches them. What differs from the
published code, on purpose:

- each item reads x and y once (the published ``__getitem__`` read both twice);
- the loader shuffles (the published one did not), from a seeded generator;
- normalization ``(x - mean) / std`` with per-variable statistics is applied to the values read,
  in float32 numpy, where the published code made it a lazy xarray (dask) expression over the
  dataset: the same arithmetic, without the per-item task graph;
- the store is opened with ``xr.open_zarr(store, chunks=None)`` (lazily indexed arrays read by
  zarr-python, no dask) where the published code used ``xr.open_mfdataset(..., engine="zarr")`` over
  one store per year (dask arrays); for one store that is the same data path minus dask's overhead.

So this baseline is, if anything, faster than the published one. It is also the baseline data source
of the training recipes::

    loader = make_baseline_loader("era5.zarr", ["t2m", "u500", "v500", "t500", "z500", "q500"],
                                  batch_size=16, num_workers=2, seed=0)
    for x, y in loader:          # float32 tensors [16, 6, lat, lon]
        ...
"""

from __future__ import annotations

import os
from typing import Any, Mapping, Sequence

import numpy as np
import torch
from torch.utils.data import DataLoader, Dataset

DEFAULT_VARIABLES = ("t2m", "u500", "v500", "t500", "z500", "q500")


def _open_dataset(store: str, variables: Sequence[str]):
    import xarray as xr

    return xr.open_zarr(store, chunks=None)[list(variables)]


def _statistics(store: str, variables: Sequence[str], normalize: Any) -> tuple[np.ndarray, np.ndarray] | None:
    """(mean, std) as float32 [channels, 1, 1], or None for no normalization.

    ``normalize`` as zfeed.Loader takes it: a dict ``{name: (mean, std)}``, True (each array's
    ``zfeed_stats`` attribute where every variable has one, else none) or False."""
    if normalize is False or normalize is None:
        return None
    if isinstance(normalize, Mapping):
        missing = [v for v in variables if v not in normalize]
        if missing:
            raise ValueError(f"baseline: no (mean, std) given for {', '.join(missing)}")
        pairs = [normalize[v] for v in variables]
    else:
        import zarr

        group = zarr.open_group(store, mode="r")
        pairs = []
        for name in variables:
            stats = group[name].attrs.get("zfeed_stats")
            if not isinstance(stats, Mapping) or "mean" not in stats or "std" not in stats:
                return None
            pairs.append((stats["mean"], stats["std"]))
    mean = np.array([float(m) for m, _ in pairs], dtype=np.float32).reshape(-1, 1, 1)
    std = np.array([float(s) for _, s in pairs], dtype=np.float32).reshape(-1, 1, 1)
    return mean, std


class HackathonDataset(Dataset):
    """Item ``i``: (x, y), float32 tensors ``[channels, lat, lon]`` of the variables at times ``i``
    and ``i + lead``, each read once through xarray and normalized as ``(x - mean) / std``.

    The store is opened once per process (the DataLoader's workers open their own on first use),
    so the dataset is safe under fork and spawn alike."""

    def __init__(self, store: str | os.PathLike, variables: Sequence[str] = DEFAULT_VARIABLES, lead: int = 1,
                 normalize: Any = True):
        self.store = os.fspath(store)
        self.variables = list(variables)
        self.lead = int(lead)
        if self.lead < 0:
            raise ValueError(f"baseline: lead must not be negative, got {lead}")
        ds = _open_dataset(self.store, self.variables)
        times = ds.sizes["time"]
        if times <= self.lead:
            raise ValueError(f"baseline: {self.store} has {times} time steps, too few for lead {self.lead}")
        self.length = times - self.lead
        self.statistics = _statistics(self.store, self.variables, normalize)
        self._dataset = ds
        self._pid = os.getpid()

    def __len__(self) -> int:
        return self.length

    def _ds(self):
        if self._pid != os.getpid():
            self._dataset = _open_dataset(self.store, self.variables)
            self._pid = os.getpid()
        return self._dataset

    def __getstate__(self):
        state = dict(self.__dict__)
        state["_dataset"] = None
        state["_pid"] = None
        return state

    def _normalized(self, values: np.ndarray) -> np.ndarray:
        values = values.astype(np.float32, copy=False)
        if self.statistics is None:
            return values
        mean, std = self.statistics
        return (values - mean) / std

    def __getitem__(self, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        if not 0 <= index < self.length:
            raise IndexError(index)
        ds = self._ds()
        x = ds.isel(time=index).to_array().values
        y = ds.isel(time=index + self.lead).to_array().values
        return torch.from_numpy(self._normalized(x)), torch.from_numpy(self._normalized(y))


def make_baseline_loader(store: str | os.PathLike, variables: Sequence[str] = DEFAULT_VARIABLES, batch_size: int = 16,
                         num_workers: int = 2, seed: int = 0, lead: int = 1, normalize: Any = True,
                         shuffle: bool = True, drop_last: bool = True, pin_memory: bool | None = None,
                         indices: Sequence[int] | None = None) -> DataLoader:
    """The hackathon's DataLoader over :class:`HackathonDataset`: shuffled from ``seed``,
    ``persistent_workers=True`` (with workers), ``drop_last=True``, ``pin_memory`` where CUDA is
    available (default). Yields (x, y) float32 tensors ``[batch, channels, lat, lon]``.
    ``indices``: only these items (sample times), e.g. a training split; default all."""
    dataset = HackathonDataset(store, variables, lead=lead, normalize=normalize)
    if indices is not None:
        dataset = torch.utils.data.Subset(dataset, [int(i) for i in indices])
    generator = torch.Generator()
    generator.manual_seed(int(seed))
    if pin_memory is None:
        pin_memory = torch.cuda.is_available()
    return DataLoader(dataset, batch_size=int(batch_size), shuffle=shuffle, num_workers=int(num_workers),
                      pin_memory=pin_memory, persistent_workers=num_workers > 0, drop_last=drop_last,
                      generator=generator)
