"""zfeed.Loader's planner and options: chunk-aware order over multi-step chunks, the decoded-chunk
cache, float16/bfloat16 batches, label targets, the stacked layout, random crops, torch
integration, fork safety, errors without leaked threads, and the memory bound."""

from __future__ import annotations

import json
import multiprocessing
import os
import subprocess
import sys
import textwrap

import ml_dtypes
import numpy as np
import pytest

import zfeed

import zfeed_cli

T, LAT, LON = 60, 12, 20
NAMES = ["t2m", "u500", "z500"]


def make_store(path, time_chunk, seed=0):
    root = zfeed.create_group(path)
    rng = np.random.default_rng(seed)
    data = {}
    for k, name in enumerate(NAMES):
        values = (100.0 * k + rng.standard_normal((T, LAT, LON)) * (k + 1)).astype("float32")
        root.create_array(name, shape=values.shape, chunks=(time_chunk, LAT, LON), dtype="float32",
                          compressor="zstd:3", dimension_names=["time", "latitude", "longitude"], data=values,
                          attributes={"zfeed_stats": {"mean": 100.0 * k, "std": float(k + 1)}})
        data[name] = values
    labels = (rng.random((T, LAT, LON)) * 3).astype("uint8")
    root.create_array("labels", shape=labels.shape, chunks=(time_chunk, LAT, LON), dtype="uint8",
                      compressor="zstd:3", dimension_names=["time", "latitude", "longitude"], data=labels)
    data["labels"] = labels
    return data


@pytest.fixture(scope="module")
def stores(tmp_path_factory):
    base = tmp_path_factory.mktemp("features")
    one = make_store(base / "one.zarr", 1)
    ten = make_store(base / "ten.zarr", 10)
    for name in NAMES:
        np.testing.assert_array_equal(one[name], ten[name])
    return base / "one.zarr", base / "ten.zarr", one


def normalized(data, name, t, k):
    return (data[name][t] - np.float32(100.0 * k)) / np.float32(k + 1)


def check(batch, data, lead=1, crop=None):
    for i, t in enumerate(batch["times"]):
        t = int(t)
        window = (slice(None), slice(None)) if crop is None else (
            slice(crop[i][0], crop[i][0] + batch["inputs"].shape[2]),
            slice(crop[i][1], crop[i][1] + batch["inputs"].shape[3]))
        for k, name in enumerate(NAMES):
            np.testing.assert_array_equal(batch["inputs"][i, k], normalized(data, name, t, k)[window])
            np.testing.assert_array_equal(batch["targets"][i, k], normalized(data, name, t + lead, k)[window])


def test_chunk_aware_order_decodes_each_chunk_once_and_equals_the_one_step_store(stores):
    one, ten, data = stores
    loader = zfeed.Loader(ten, inputs=NAMES, targets=NAMES, batch_size=8, seed=4, drop_last=False)
    assert loader.order == "chunks"
    seen = []
    for batch in loader:
        check(batch, data)
        seen += [int(t) for t in batch["times"]]
    assert sorted(seen) == list(range(T - 1))
    stats = loader.stats()
    assert stats["chunks_decoded"] == 3 * (T // 10)  # every chunk of every variable, once
    assert stats["cache_hits"] > 0
    # A batch still mixes several chunks: the order is not time order.
    first = next(iter(zfeed.Loader(ten, inputs=NAMES, targets=NAMES, batch_size=8, seed=4)))
    assert len({int(t) // 10 for t in first["times"]}) >= 2
    # The one-step store in a plain random order gives the same samples' values.
    plain = zfeed.Loader(one, inputs=NAMES, targets=NAMES, batch_size=8, seed=4)
    assert plain.order == "random"
    check(next(iter(plain)), data)


@pytest.mark.parametrize("world_size", [1, 2, 3, 4])
@pytest.mark.parametrize("drop_last", [True, False])
def test_chunk_aware_ranks_cover_the_epoch_with_equal_counts(stores, world_size, drop_last):
    _, ten, _ = stores
    per_rank = []
    for rank in range(world_size):
        loader = zfeed.Loader(ten, inputs=["t2m"], targets=["t2m"], batch_size=4, seed=2, rank=rank,
                              world_size=world_size, drop_last=drop_last)
        per_rank.append([int(t) for b in loader for t in b["times"]])
    counts = {len(times) for times in per_rank}
    assert len(counts) == 1
    everything = [t for times in per_rank for t in times]
    n = T - 1
    if drop_last:
        assert len(set(everything)) == len(everything)
        assert len(everything) == (n // world_size) // 4 * 4 * world_size
    else:
        assert set(everything) == set(range(n))


def test_resume_in_the_chunk_aware_order_is_exact(stores):
    _, ten, _ = stores
    kwargs = dict(inputs=NAMES, targets=NAMES, batch_size=6, seed=8, epoch=1)
    full = [{k: v.copy() for k, v in b.items()} for b in zfeed.Loader(ten, **kwargs)]
    for k in (1, 3, len(full) - 1):
        first = zfeed.Loader(ten, **kwargs)
        it = iter(first)
        for _ in range(k):
            next(it)
        resumed = zfeed.Loader(ten, **kwargs)
        resumed.load_state_dict(json.loads(json.dumps(first.state_dict())))
        rest = list(resumed)
        assert len(rest) == len(full) - k
        for a, b in zip(rest, full[k:]):
            assert all(a[key].tobytes() == b[key].tobytes() for key in a)


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_half_precision_batches_equal_numpys_rounding(stores, dtype):
    _, ten, data = stores
    loader = zfeed.Loader(ten, inputs=NAMES, targets=NAMES, batch_size=4, dtype=dtype)
    numpy_type = np.float16 if dtype == "float16" else ml_dtypes.bfloat16
    assert loader.dtype == dtype
    batch = next(iter(loader))
    assert batch["inputs"].dtype == numpy_type and batch["targets"].dtype == numpy_type
    for i, t in enumerate(batch["times"]):
        for k, name in enumerate(NAMES):
            want = normalized(data, name, int(t), k).astype(numpy_type)
            assert batch["inputs"][i, k].tobytes() == want.tobytes()


def test_integer_targets_are_int64_labels(stores):
    _, ten, data = stores
    loader = zfeed.Loader(ten, inputs=NAMES, targets=["labels"], lead=0, batch_size=4)
    assert loader.target_dtype == "int64" and loader.target_shape == (4, LAT, LON)
    for batch in loader:
        assert batch["targets"].dtype == np.int64 and batch["targets"].shape == (4, LAT, LON)
        for i, t in enumerate(batch["times"]):
            np.testing.assert_array_equal(batch["targets"][i], data["labels"][int(t)])


def test_stacked_layout(tmp_path):
    rng = np.random.default_rng(1)
    values = rng.standard_normal((T, 4, LAT, LON)).astype("float32")
    root = zfeed.create_group(tmp_path / "stacked.zarr")
    root.create_array("data", shape=values.shape, chunks=(1, 4, LAT, LON), dtype="float32", compressor="zstd:3",
                      dimension_names=["time", "variable", "latitude", "longitude"], data=values,
                      attributes={"variables": ["t2m", "u500", "v500", "z500"],
                                  "zfeed_stats": {"mean": [1.0, 2.0, 3.0, 4.0], "std": [2.0, 3.0, 4.0, 5.0]}})
    loader = zfeed.Loader(tmp_path / "stacked.zarr", inputs=["z500", "t2m"], targets=["u500"], batch_size=4)
    assert [c["variable"] for c in loader.input_channels] == ["z500", "t2m"]
    batch = next(iter(loader))
    for i, t in enumerate(batch["times"]):
        t = int(t)
        np.testing.assert_array_equal(batch["inputs"][i, 0], (values[t, 3] - np.float32(4)) / np.float32(5))
        np.testing.assert_array_equal(batch["inputs"][i, 1], (values[t, 0] - np.float32(1)) / np.float32(2))
        np.testing.assert_array_equal(batch["targets"][i, 0], (values[t + 1, 1] - np.float32(2)) / np.float32(3))
    with pytest.raises(zfeed.ZarrError, match="'q500' not found.*stacked in 'data': t2m, u500, v500, z500"):
        zfeed.Loader(tmp_path / "stacked.zarr", inputs=["q500"])


def test_random_crops_are_per_sample_and_repeat_on_resume(stores):
    _, ten, data = stores
    kwargs = dict(inputs=NAMES, targets=NAMES, batch_size=4, random_crop=(5, 7), seed=3)
    loader = zfeed.Loader(ten, **kwargs)
    batches = [{k: v.copy() for k, v in b.items()} for b in loader]
    origins = set()
    for batch in batches:
        assert batch["inputs"].shape == (4, 3, 5, 7)
        check(batch, data, crop=batch["crops"])
        origins |= {tuple(c) for c in batch["crops"]}
    assert len(origins) > 3
    again = [b["crops"].copy() for b in zfeed.Loader(ten, **kwargs)]
    assert all(np.array_equal(a, b["crops"]) for a, b in zip(again, batches))


def test_torch_dataset_yields_tensors_and_workers_split_the_epoch(stores):
    torch = pytest.importorskip("torch")
    from zfeed.torch import ZarrIterableDataset
    _, ten, data = stores
    dataset = ZarrIterableDataset(ten, inputs=NAMES, targets=NAMES, batch_size=4, dtype="bfloat16", seed=1)
    seen = []
    for batch in torch.utils.data.DataLoader(dataset, batch_size=None):
        assert batch["inputs"].dtype == torch.bfloat16 and batch["inputs"].shape == (4, 3, LAT, LON)
        t = int(batch["times"][0])
        want = torch.from_numpy(normalized(data, "u500", t, 1)).to(torch.bfloat16)
        assert torch.equal(batch["inputs"][0, 1], want)
        seen += batch["times"].tolist()
    assert len(seen) == len(set(seen)) == len(dataset) * 4
    # Two DataLoader workers read disjoint halves of the epoch.
    dataset = ZarrIterableDataset(ten, inputs=["t2m"], targets=["t2m"], batch_size=2, seed=1, drop_last=False)
    times = [t for b in torch.utils.data.DataLoader(dataset, batch_size=None, num_workers=2,
                                                      multiprocessing_context="fork")
             for t in b["times"].tolist()]
    assert sorted(set(times)) == list(range(T - 1))


@pytest.mark.parametrize("fill", [0.0, -3.5])
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_fill_nan_replaces_missing_values_after_normalizing(tmp_path, fill, dtype):
    """Sea surface temperature over land is NaN: fill_nan makes it a number, in normalized units."""
    rng = np.random.default_rng(5)
    sst = (288.0 + 4.0 * rng.standard_normal((T, LAT, LON))).astype("float32")
    land = rng.random((LAT, LON)) < 0.3
    sst[:, land] = np.nan
    root = zfeed.create_group(tmp_path / "ocean.zarr")
    for name, chunks in (("sst", (1, LAT, LON)), ("sst10", (10, LAT, LON))):
        root.create_array(name, shape=sst.shape, chunks=chunks, dtype="float32", compressor="zstd:3", data=sst,
                          dimension_names=["time", "latitude", "longitude"],
                          attributes={"zfeed_stats": {"mean": 288.0, "std": 4.0}})
    want = np.where(np.isnan(sst), np.float32(fill), (sst - np.float32(288.0)) / np.float32(4.0))
    if dtype == "bfloat16":
        want = want.astype(ml_dtypes.bfloat16)
    for name in ("sst", "sst10"):
        loader = zfeed.Loader(tmp_path / "ocean.zarr", inputs=[name], targets=[name], batch_size=4, dtype=dtype,
                              fill_nan=fill)
        for batch in loader:
            assert not np.isnan(batch["inputs"].astype("float32")).any()
            for i, t in enumerate(batch["times"]):
                np.testing.assert_array_equal(batch["inputs"][i, 0], want[int(t)])
                np.testing.assert_array_equal(batch["targets"][i, 0], want[int(t) + 1])
    # Without it the NaNs stay.
    batch = next(iter(zfeed.Loader(tmp_path / "ocean.zarr", inputs=["sst"], batch_size=4)))
    assert np.isnan(batch["inputs"][:, 0, land]).all()
    for bad in (float("nan"), float("inf"), "zero", True):
        with pytest.raises(zfeed.ZarrError, match="fill_nan must be a finite number or None"):
            zfeed.Loader(tmp_path / "ocean.zarr", inputs=["sst"], fill_nan=bad)


def test_static_inputs_follow_the_history_and_are_cropped_with_the_sample(tmp_path):
    """A land-sea mask and the orography, dims (lat, lon): one channel each after the history's."""
    rng = np.random.default_rng(8)
    root = zfeed.create_group(tmp_path / "era5.zarr")
    t2m = (280.0 + rng.standard_normal((T, LAT, LON))).astype("float32")
    root.create_array("t2m", shape=t2m.shape, chunks=(1, LAT, LON), dtype="float32", compressor="zstd:3",
                      data=t2m, dimension_names=["time", "latitude", "longitude"],
                      attributes={"zfeed_stats": {"mean": 280.0, "std": 1.0}})
    lsm = (rng.random((LAT, LON)) < 0.4).astype("uint8")
    root.create_array("lsm", shape=lsm.shape, chunks=(5, 7), dtype="uint8", compressor="zstd:3", data=lsm,
                      dimension_names=["latitude", "longitude"])
    orog = (2000.0 * rng.random((LAT, LON))).astype("float32")
    root.create_array("orog", shape=orog.shape, chunks=(LAT, LON), dtype="float32", compressor="zstd:3", data=orog,
                      dimension_names=["latitude", "longitude"])
    # zfeed stats writes the static field's statistics like any other's.
    zfeed_cli.run("stats", tmp_path / "era5.zarr", "--variables", "orog")
    stats = zfeed.open(tmp_path / "era5.zarr")["orog"].attrs["zfeed_stats"]
    mean, std = np.float32(stats["mean"]), np.float32(stats["std"])
    loader = zfeed.Loader(tmp_path / "era5.zarr", inputs=["lsm", "t2m", "orog"], targets=["t2m"], history=2,
                          batch_size=4, random_crop=(6, 9))
    channels = loader.input_channels
    assert [(c["variable"], c["static"]) for c in channels] == [
        ("t2m", False), ("t2m", False), ("lsm", True), ("orog", True)]
    assert loader.input_shape == (4, 4, 6, 9)
    for batch in loader:
        for i, (y, x) in enumerate(batch["crops"]):
            window = (slice(y, y + 6), slice(x, x + 9))
            t = int(batch["times"][i])
            np.testing.assert_array_equal(batch["inputs"][i, 1], (t2m[t] - np.float32(280.0))[window])
            np.testing.assert_array_equal(batch["inputs"][i, 2], lsm[window].astype("float32"))
            np.testing.assert_array_equal(batch["inputs"][i, 3], ((orog - mean) / std)[window])
    with pytest.raises(zfeed.ZarrError, match="dims \\(lat, lon\\) without time: a static field can only be an input"):
        zfeed.Loader(tmp_path / "era5.zarr", inputs=["t2m"], targets=["orog"])


@pytest.mark.parametrize("store", [0, 1], ids=["one-step", "ten-step"])
def test_several_leads_give_a_rollouts_targets_lead_after_lead(stores, store):
    path, data = stores[store], stores[2]
    loader = zfeed.Loader(path, inputs=NAMES, targets=["t2m", "z500"], lead=[1, 2, 4], batch_size=4, seed=2)
    assert loader.target_shape == (4, 6, LAT, LON)
    assert [(c["variable"], c["time_offset"]) for c in loader.target_channels] == [
        ("t2m", 1), ("z500", 1), ("t2m", 2), ("z500", 2), ("t2m", 4), ("z500", 4)]
    assert len(loader) * 4 == (T - 4) // 4 * 4  # the furthest lead stays inside the time axis
    for batch in loader:
        for i, t in enumerate(batch["times"]):
            t = int(t)
            for j, lead in enumerate([1, 2, 4]):
                np.testing.assert_array_equal(batch["targets"][i, 2 * j], normalized(data, "t2m", t + lead, 0))
                np.testing.assert_array_equal(batch["targets"][i, 2 * j + 1], normalized(data, "z500", t + lead, 2))
    for bad in ([], [1, -1], "1", [1.5], True):
        with pytest.raises(zfeed.ZarrError, match="lead"):
            zfeed.Loader(path, inputs=NAMES, targets=NAMES, lead=bad)
    with pytest.raises(zfeed.ZarrError, match="lead 2 is given twice"):
        zfeed.Loader(path, inputs=NAMES, targets=NAMES, lead=[2, 2])


def test_history_step_spaces_the_inputs(stores):
    path, _, data = stores
    loader = zfeed.Loader(path, inputs=["t2m"], targets=["t2m"], history=3, history_step=6, lead=6,
                          batch_size=4, drop_last=False)
    assert [c["time_offset"] for c in loader.input_channels] == [-12, -6, 0]
    assert loader.num_samples == T - 12 - 6
    seen = []
    for batch in loader:
        for i, t in enumerate(batch["times"]):
            t = int(t)
            seen.append(t)
            for h, back in enumerate([12, 6, 0]):
                np.testing.assert_array_equal(batch["inputs"][i, h], normalized(data, "t2m", t - back, 0))
            np.testing.assert_array_equal(batch["targets"][i, 0], normalized(data, "t2m", t + 6, 0))
    assert sorted(seen) == list(range(12, T - 6))
    with pytest.raises(zfeed.ZarrError, match="history_step must be at least 1"):
        zfeed.Loader(path, inputs=["t2m"], history_step=0)


@pytest.mark.parametrize("zarr_format", [2, 3])
def test_cf_packed_variables_read_as_xarray_decodes_them(tmp_path, zarr_format):
    """ERA5 from netCDF is often packed (int16, scale_factor, add_offset, a fill value), and xarray
    keeps the packing when it writes Zarr: the loader unpacks as xarray does, then normalizes."""
    xr = pytest.importorskip("xarray")
    rng = np.random.default_rng(11)
    t2m = 280.0 + 10.0 * rng.standard_normal((T, LAT, LON))
    t2m[:, 2, 3] = np.nan  # stored as the fill value
    mask = (rng.random((T, LAT, LON)) * 3).astype("uint8")
    mask[:, 0, 0] = 255
    ds = xr.Dataset({"t2m": (("time", "latitude", "longitude"), t2m),
                     "mask": (("time", "latitude", "longitude"), mask)})
    encoding = {"t2m": {"dtype": "int16", "scale_factor": 0.002, "add_offset": 280.0, "_FillValue": -32767},
                "mask": {"_FillValue": 255}}
    path = tmp_path / "packed.zarr"
    ds.to_zarr(path, encoding=encoding, zarr_format=zarr_format, consolidated=zarr_format == 2)
    decoded = xr.open_zarr(path, consolidated=zarr_format == 2)
    assert np.isnan(decoded["t2m"].values[:, 2, 3]).all()
    want = decoded["t2m"].values.astype("float32")
    loader = zfeed.Loader(path, inputs=[{"name": "t2m", "mean": 280.0, "std": 10.0}], targets=["t2m"],
                          batch_size=4, normalize=True, drop_last=False)
    cf = loader.input_channels[0]["cf"]
    assert cf["scale_factor"] == 0.002 and cf["add_offset"] == 280.0 and -32767 in cf["missing"]
    for batch in loader:
        for i, t in enumerate(batch["times"]):
            np.testing.assert_array_equal(batch["inputs"][i, 0], (want[t] - np.float32(280.0)) / np.float32(10.0))
            np.testing.assert_array_equal(batch["targets"][i, 0], want[t + 1])  # no statistics: unpacked only
    # A label array whose _FillValue attribute (Zarr v3) marks missing pixels: those become -100
    # (ignore_index). A v2 array's fill_value counts only beside CF attributes (xarray takes it
    # always, which would turn the zeros of arrays zarr-python wrote with fill_value 0 into NaN).
    labels = zfeed.Loader(path, inputs=["t2m"], targets=["mask"], lead=0, batch_size=4, drop_last=False)
    assert labels.target_dtype == "int64"
    for batch in labels:
        raw = mask[batch["times"]].astype("int64")
        want_labels = np.where(raw == 255, -100, raw) if zarr_format == 3 else raw
        np.testing.assert_array_equal(batch["targets"], want_labels)


def test_the_loader_reads_the_packed_ecmwf_store_as_xarray_does(shared):
    xr = pytest.importorskip("xarray")
    path = shared / "data" / "ecmwf-t-z-2007-01-01.zarr"
    want = xr.open_zarr(path)
    loader = zfeed.Loader(path, inputs=[("t", [0, 1]), {"name": "z", "level_values": [850]}], targets=[], lead=0,
                          batch_size=1, shuffle=False, normalize=False)
    assert [c["level"] for c in loader.input_channels] == [0, 1, 1]  # the level coordinate is [500, 850]
    batch = next(iter(loader))
    np.testing.assert_array_equal(batch["inputs"][0, 0], want["t"].values[0, 0].astype("float32"))
    np.testing.assert_array_equal(batch["inputs"][0, 1], want["t"].values[0, 1].astype("float32"))
    np.testing.assert_array_equal(batch["inputs"][0, 2], want["z"].values[0, 1].astype("float32"))


def test_levels_are_selected_by_their_coordinate_values(tmp_path):
    rng = np.random.default_rng(12)
    root = zfeed.create_group(tmp_path / "levels.zarr")
    t = rng.standard_normal((T, 3, LAT, LON)).astype("float32")
    root.create_array("t", shape=t.shape, chunks=(1, 1, LAT, LON), dtype="float32", compressor="zstd:3", data=t,
                      dimension_names=["time", "level", "latitude", "longitude"])
    root.create_array("level", shape=(3,), chunks=(3,), dtype="int32", data=np.array([1000, 850, 500], "int32"),
                      dimension_names=["level"])
    loader = zfeed.Loader(tmp_path / "levels.zarr", inputs=[{"name": "t", "level_values": [500, 1000]}],
                          targets=[{"name": "t", "level_values": [850]}], batch_size=4, drop_last=False)
    assert [c["level"] for c in loader.input_channels] == [2, 0]
    for batch in loader:
        for i, time in enumerate(batch["times"]):
            np.testing.assert_array_equal(batch["inputs"][i], t[time, [2, 0]])
            np.testing.assert_array_equal(batch["targets"][i, 0], t[time + 1, 1])
    with pytest.raises(zfeed.ZarrError, match=r"level value 700 is not in the coordinate 'level' \(it holds 1000, 850, "
                                              r"500\)"):
        zfeed.Loader(tmp_path / "levels.zarr", inputs=[{"name": "t", "level_values": [700]}])
    with pytest.raises(zfeed.ZarrError, match="give levels \\(indices\\) or level_values, not both"):
        zfeed.Loader(tmp_path / "levels.zarr", inputs=[{"name": "t", "levels": [0], "level_values": [500]}])


def test_dims_in_another_order_are_refused_naming_them(tmp_path):
    root = zfeed.create_group(tmp_path / "order.zarr")
    root.create_array("t2m", shape=(LAT, LON, T), chunks=(LAT, LON, 1), dtype="float32",
                      dimension_names=["latitude", "longitude", "time"])
    with pytest.raises(zfeed.ZarrError, match=r"input variable 't2m' has dims \(latitude, longitude, time\): the "
                                              r"loader reads \(time, lat, lon\) or \(time, level, lat, lon\)"):
        zfeed.Loader(tmp_path / "order.zarr", inputs=["t2m"])


def test_arguments_that_would_be_ignored_or_truncated_are_refused(stores):
    """A typo in a variable's keys, a fraction in an integer argument, a string for a flag, and
    statistics for a variable the loader does not read were taken silently (the typo ignored,
    2.7 read as 2, "no" as True, the statistics unused); each is an error naming the argument."""
    one, _, data = stores
    base = dict(inputs=["t2m", "u500"], targets=["t2m"], batch_size=4)

    def refused(match, **changes):
        with pytest.raises(zfeed.ZarrError, match=match):
            zfeed.Loader(one, **{**base, **changes})

    refused(r"inputs variable 't2m': unknown key 'level_value' \(the keys are name, levels, level_values, mean, std\)",
            inputs=[{"name": "t2m", "level_value": [850]}])
    refused(r"targets variable 't2m': unknown key 'Mean'", targets=[{"name": "t2m", "Mean": 0, "std": 1}])
    for name, value in [("batch_size", 2.7), ("history", 1.9), ("history_step", 1.0), ("seed", 0.5), ("prefetch", "2"),
                        ("epoch", 1.5), ("window", 2.0), ("cache_bytes", 1e6 + 0.5), ("rank", 0.0), ("world_size", True)]:
        refused(f"{name} must be an integer", **{name: value})
    refused(r"each value of crop must be an integer, got 4.5", crop=(0, 4.5, 0, 8))
    refused(r"each value of random_crop must be an integer", random_crop=(4, 8.0))
    refused(r"a level of inputs variable 't2m' must be an integer, got 0.5", inputs=[("t2m", 0.5)])
    for name in ("shuffle", "drop_last", "stage_in_background", "stage_progress"):
        refused(f"{name} must be True or False, got 'no'", **{name: "no"})
    refused(r"normalize gives statistics for 'u', which is not among the inputs and targets \(t2m, u500\)",
            normalize={"t2m": (0.0, 1.0), "u": (0.0, 1.0)})
    refused(r"normalize gives statistics for 'u', 'v', which are not among", normalize={"u": (0, 1), "v": (0, 1)})
    refused(r"normalize\['t2m'\] must be \(mean, std\), got \(0,\)", normalize={"t2m": (0,)})
    refused(r"normalize\['t2m'\]'s std must be a number or a list of numbers, got None", normalize={"t2m": (0, None)})
    refused(r"normalize\['t2m'\]'s mean must be a number or a list of numbers, got '1'", normalize={"t2m": ("1", 2)})
    refused(r"normalize must be True, False or \{name: \(mean, std\)\}, got 'no'", normalize="no")
    refused(r"normalize must be True, False", normalize=None)
    with pytest.raises(zfeed.ZarrError, match="epoch must be an integer, got 1.5"):
        zfeed.Loader(one, **base).set_epoch(1.5)

    # NumPy's integers and bools are integers and bools; statistics may be NumPy numbers; a byte
    # budget may be written 2e6.
    loader = zfeed.Loader(one, inputs=["t2m", "u500"], targets=["t2m"], batch_size=np.int64(4), seed=np.uint32(3),
                          shuffle=np.True_, drop_last=np.False_, cache_bytes=2e6, lead=np.int64(1),
                          normalize={"t2m": (np.float32(2.0), np.float32(4.0)), "u500": np.array([100.0, 2.0])})
    assert loader.input_shape[0] == 4
    assert [(c["mean"], c["std"]) for c in loader.input_channels] == [(2.0, 4.0), (100.0, 2.0)]
    batch = next(iter(loader))
    t = int(batch["times"][0])
    np.testing.assert_allclose(batch["inputs"][0, 0], (data["t2m"][t] - 2.0) / 4.0, rtol=1e-6)
    assert zfeed.Loader(one, **base, normalize=np.False_).input_channels[0]["mean"] is None


def _child_batches(loader, queue):
    queue.put([b["times"].tolist() + b["inputs"].ravel()[:5].tolist() for b in loader])


def test_a_forked_child_reads_correctly(stores):
    _, ten, _ = stores
    kwargs = dict(inputs=NAMES, targets=NAMES, batch_size=4, seed=6)
    reference = [b["times"].tolist() + b["inputs"].ravel()[:5].tolist() for b in zfeed.Loader(ten, **kwargs)]
    loader = zfeed.Loader(ten, **kwargs)
    it = iter(loader)
    next(it)  # zfeed's threads are running in the parent
    context = multiprocessing.get_context("fork")
    queue = context.Queue()
    child = context.Process(target=_child_batches, args=(loader, queue))
    child.start()
    got = queue.get(timeout=60)
    child.join(timeout=60)
    assert child.exitcode == 0
    assert got == reference[1:]
    assert [b["times"].tolist() + b["inputs"].ravel()[:5].tolist() for b in it] == reference[1:]


def thread_count():
    return len(os.listdir("/proc/self/task"))


def test_a_corrupt_chunk_raises_naming_the_key_without_leaking_threads(tmp_path):
    data = make_store(tmp_path / "bad.zarr", 10)
    (tmp_path / "bad.zarr" / "u500" / "c" / "2" / "0" / "0").write_bytes(b"not zstd")
    loader = zfeed.Loader(tmp_path / "bad.zarr", inputs=NAMES, targets=NAMES, batch_size=4)
    next(iter(zfeed.Loader(tmp_path / "bad.zarr", inputs=["t2m"], batch_size=4)))  # start the pool
    before = thread_count()
    for _ in range(3):
        with pytest.raises(zfeed.ZarrError, match="u500/c/2/0/0"):
            for _ in loader:
                pass
    del loader
    assert thread_count() <= before
    assert data["t2m"].shape == (T, LAT, LON)


MEMORY_SCRIPT = textwrap.dedent("""
    import json, sys
    import zfeed

    def rss(kind):
        with open("/proc/self/status") as status:
            for line in status:
                if line.startswith(kind + ":"):
                    return int(line.split()[1]) * 1024

    path, budget = sys.argv[1], int(sys.argv[2])
    names = ["a", "b", "c", "d"]
    before = {kind: rss(kind) for kind in ("RssAnon", "RssFile")}
    loader = zfeed.Loader(path, inputs=names, targets=names, batch_size=4, cache_bytes=budget, seed=0)
    peak = dict(before)
    for epoch in range(2):
        for batch in loader:
            peak = {kind: max(peak[kind], rss(kind)) for kind in peak}
    print(json.dumps({"growth": peak["RssAnon"] - before["RssAnon"], "file_growth": peak["RssFile"] - before["RssFile"],
                      "bound": loader.memory_bound, "stats": loader.stats()}))
""")


def test_memory_stays_within_the_bound_on_a_store_larger_than_it(tmp_path):
    # 4 variables x 800 steps x 64 x 128 float32 = 105 MB decoded, chunks of 10 steps (328 KB);
    # a cache of 8 MB: the loader's peak resident growth stays within its stated bound, a
    # fraction of the store, over two epochs that decode all of it. Its own memory, that is: the
    # chunk files it reads stay mapped (the page cache's pages, RssFile), at most the files.
    root = zfeed.create_group(tmp_path / "big.zarr")
    rng = np.random.default_rng(0)
    for name in ["a", "b", "c", "d"]:
        values = rng.standard_normal((800, 64, 128)).astype("float32")
        root.create_array(name, shape=values.shape, chunks=(10, 64, 128), dtype="float32", compressor="zstd:1",
                          data=values)
    budget = 8 << 20
    out = subprocess.run([sys.executable, "-c", MEMORY_SCRIPT, str(tmp_path / "big.zarr"), str(budget)],
                         capture_output=True, text=True, check=True)
    result = json.loads(out.stdout)
    store_bytes = 4 * 800 * 64 * 128 * 4
    file_bytes = sum(f.stat().st_size for f in (tmp_path / "big.zarr").rglob("*") if f.is_file())
    print(f"memory: peak growth {result['growth'] / 2**20:.1f} MiB, bound {result['bound'] / 2**20:.1f} MiB, "
          f"store {store_bytes / 2**20:.0f} MiB; mapped files {result['file_growth'] / 2**20:.1f} MiB "
          f"of {file_bytes / 2**20:.1f} MiB on disk")
    assert result["bound"] < store_bytes / 2
    assert 0 < result["growth"] <= result["bound"]
    # The files, once kept and once more in each thread's range for first reads (8 MiB), and code paged in.
    assert result["file_growth"] <= file_bytes + (os.cpu_count() * 8 << 20) + (4 << 20)
    assert result["stats"]["cache_bytes"] <= budget
    assert result["stats"]["bytes_decoded"] >= store_bytes  # the whole store went through
