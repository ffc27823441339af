"""`zfeed synth cam5`: the 16 CAM5 channels and the segmentation labels open in xarray and
zarr-python, with class frequencies near the published ones, features that look like what their
labels say, values that depend only on the seed, and the stacked layout holding the same values."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

import zfeed_cli

xr = pytest.importorskip("xarray")
zarr = pytest.importorskip("zarr")

CHANNELS = ["TMQ", "U850", "V850", "UBOT", "VBOT", "QREFHT", "PS", "PSL", "T200", "T500", "PRECT",
            "TS", "TREFHT", "Z1000", "Z200", "ZBOT"]
ARGS = ["--lat", "192", "--lon", "288", "--times", "8", "--seed", "5"]


def run(*args, ok=True):
    return zfeed_cli.run(*args, ok=ok, timeout=300)


@pytest.fixture(scope="module")
def cam5_store(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("cam5") / "cam5.zarr"
    run("synth", "cam5", out, *ARGS)
    return out


def test_opens_in_xarray_with_units_and_classes(cam5_store):
    ds = xr.open_zarr(cam5_store)
    assert sorted(ds.data_vars) == sorted(CHANNELS + ["labels"])
    assert ds.sizes == {"time": 8, "lat": 192, "lon": 288}
    for name in CHANNELS:
        assert ds[name].dims == ("time", "lat", "lon") and ds[name].dtype == np.float32
        assert ds[name].attrs["units"] and ds[name].attrs["long_name"]
    assert ds.labels.dtype == np.uint8 and ds.labels.dims == ("time", "lat", "lon")
    assert ds.labels.attrs["flag_meanings"] == "background tropical_cyclone atmospheric_river"
    assert ds.labels.attrs["classes"] == ["background", "tropical_cyclone", "atmospheric_river"]
    assert ds.time.values[1] - ds.time.values[0] == np.timedelta64(3, "h")
    assert ds.lat.values[0] == -90 and ds.lat.values[-1] == 90 and ds.lat.attrs["units"] == "degrees_north"
    # Plausible magnitudes.
    assert 0 <= ds.TMQ.values.min() and ds.TMQ.values.max() < 110
    assert 90000 < ds.PSL.values.min() and ds.PSL.values.max() < 106000
    assert 200 < ds.TS.values.min() and ds.TS.values.max() < 320
    assert 10000 < ds.Z200.values.min() and ds.Z200.values.max() < 13000
    assert ds.PRECT.values.min() >= 0 and ds.PRECT.values.max() < 1e-4
    # zarr-python reads it too.
    group = zarr.open_group(str(cam5_store), mode="r")
    np.testing.assert_array_equal(group["labels"][:], ds.labels.values)


def test_class_frequencies_and_features(cam5_store):
    ds = xr.open_zarr(cam5_store)
    labels = ds.labels.values
    frequency = np.bincount(labels.ravel(), minlength=3) / labels.size
    print(f"class frequencies: {frequency}")
    assert labels.max() <= 2
    assert 0 < frequency[1] < 0.002  # tropical cyclones: DeepCAM 0.046%
    assert 0.01 < frequency[2] < 0.03  # atmospheric rivers: SC18 1.7%, DeepCAM 1.3%
    background, cyclone, river = labels == 0, labels == 1, labels == 2
    psl, tmq = ds.PSL.values, ds.TMQ.values
    assert psl[cyclone].mean() < psl[background].mean() - 500
    assert tmq[cyclone].mean() > tmq[background].mean() + 10
    assert tmq[river].mean() > tmq[background].mean() + 10
    # Cyclones sit in the tropics and subtropics.
    lat = np.broadcast_to(ds.lat.values[None, :, None], labels.shape)
    assert np.abs(lat[cyclone]).max() < 45


def test_deterministic_and_stacked_layout(tmp_path, cam5_store):
    again = tmp_path / "again.zarr"
    run("synth", "cam5", again, *ARGS, "--codec", "none", "--shards", "time=4")
    a, b = xr.open_zarr(cam5_store), xr.open_zarr(again)
    for name in CHANNELS + ["labels"]:
        np.testing.assert_array_equal(a[name].values, b[name].values)
    other = tmp_path / "other.zarr"
    run("synth", "cam5", other, *ARGS[:-1], "6")
    assert not np.array_equal(xr.open_zarr(other).PSL.values, a.PSL.values)

    stacked = tmp_path / "stacked.zarr"
    run("synth", "cam5", stacked, *ARGS, "--stack")
    group = zarr.open_group(str(stacked), mode="r")
    data = group["data"]
    assert data.shape == (8, 16, 192, 288) and data.attrs["variables"] == CHANNELS
    assert group.attrs["variables"] == CHANNELS
    for k, name in enumerate(CHANNELS):
        np.testing.assert_array_equal(data[:, k], a[name].values)
    np.testing.assert_array_equal(group["labels"][:], a.labels.values)


def test_refuses_to_overwrite_and_bad_options(tmp_path, cam5_store):
    result = run("synth", "cam5", cam5_store, "--lat", "8", "--lon", "16", "--times", "1", ok=False)
    assert result.returncode != 0 and "--overwrite" in result.stderr
    small = tmp_path / "small.zarr"
    result = run("synth", "cam5", small, "--grid", "8y16", ok=False)
    assert result.returncode != 0 and "--grid" in result.stderr
    result = run("synth", "cam5", small, "--lat", "8", "--lon", "16", "--variables", "TMQ", ok=False)
    assert result.returncode != 0 and "--variables" in result.stderr
    result = run("synth", "era5", small, "--stack", ok=False)
    assert result.returncode != 0 and "--stack" in result.stderr
    result = run("synth", "cam6", small, ok=False)
    assert result.returncode != 0 and "cam6" in result.stderr
