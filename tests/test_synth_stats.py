"""`zfeed synth era5` and `zfeed stats`: the synthetic store opens in xarray with CF time,
coordinates and attributes; the statistics written as attributes equal numpy's."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest

import zfeed_cli

xr = pytest.importorskip("xarray")
pytest.importorskip("zarr")

SIX = ["t2m", "u500", "v500", "t500", "z500", "q500"]


def run(*args, ok=True):
    return zfeed_cli.run(*args, ok=ok, timeout=300)


@pytest.fixture(scope="module")
def synth_store(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("synth") / "era5.zarr"
    run("synth", "era5", out, "--grid", "32x64", "--times", "24", "--step", "6h", "--seed", "3")
    return out


def test_synth_opens_in_xarray(synth_store):
    ds = xr.open_zarr(synth_store)
    assert sorted(ds.data_vars) == sorted(SIX)
    for name in SIX:
        assert ds[name].dims == ("time", "latitude", "longitude")
        assert ds[name].dtype == np.float32
        assert ds[name].attrs["units"] and ds[name].attrs["long_name"]
    assert ds.sizes == {"time": 24, "latitude": 32, "longitude": 64}
    assert ds.time.values[0] == np.datetime64("2000-01-01T00:00")
    assert ds.time.values[1] - ds.time.values[0] == np.timedelta64(6, "h")
    assert ds.latitude.values[0] > 0 > ds.latitude.values[-1]
    assert ds.latitude.attrs["units"] == "degrees_north"
    t2m = ds.t2m.values
    assert 200 < t2m.min() and t2m.max() < 320
    z = ds.z500.values
    assert 46000 < z.min() and z.max() < 59000
    assert np.abs(ds.u500.values).max() < 70
    q = ds.q500.values
    assert q.min() >= 0 and q.max() < 5e-3
    # Weather moves: consecutive steps differ, yet are close.
    diff = np.abs(np.diff(z, axis=0)).mean()
    assert 0 < diff < 0.05 * (z.max() - z.min())


def test_synth_is_deterministic_and_refuses_to_overwrite(tmp_path, synth_store):
    out = tmp_path / "again.zarr"
    run("synth", "era5", out, "--grid", "32x64", "--times", "24", "--step", "6h", "--seed", "3", "--codec", "none",
        "--shards", "time=8")
    a, b = xr.open_zarr(synth_store), xr.open_zarr(out)
    for name in SIX:
        np.testing.assert_array_equal(a[name].values, b[name].values)
    result = run("synth", "era5", out, "--grid", "8x16", "--times", "2", ok=False)
    assert result.returncode != 0 and "--overwrite" in result.stderr
    run("synth", "era5", out, "--grid", "8x16", "--times", "2", "--variables", "t2m,msl", "--overwrite")
    assert sorted(xr.open_zarr(out).data_vars) == ["msl", "t2m"]
    result = run("synth", "gfs", tmp_path / "gfs.zarr", ok=False)
    assert result.returncode != 0 and "unknown synthetic dataset" in result.stderr


def test_stats_equal_numpy(tmp_path, synth_store):
    store = tmp_path / "stats.zarr"
    shutil.copytree(synth_store, store)
    result = run("stats", store, "--time", "2:20")
    assert "t2m" in result.stdout and "mean" in result.stdout
    ds = xr.open_zarr(store)
    for name in SIX:
        stats = ds[name].attrs["zfeed_stats"]
        values = ds[name].values[2:20].astype(np.float64)
        assert stats["time_range"] == [2, 20]
        assert stats["count"] == values.size and stats["nan_count"] == 0
        np.testing.assert_allclose(stats["mean"], np.nanmean(values), rtol=1e-12, atol=1e-12 * np.abs(values).max())
        np.testing.assert_allclose(stats["std"], np.nanstd(values), rtol=1e-9)
        assert stats["min"] == np.nanmin(values) and stats["max"] == np.nanmax(values)


def test_stats_with_nans_and_levels(tmp_path):
    import zfeed

    rng = np.random.default_rng(0)
    data = (1e6 + rng.normal(size=(10, 3, 4, 5))).astype(np.float32)
    data[rng.random(data.shape) < 0.1] = np.nan
    group = zfeed.create_group(tmp_path / "levels.zarr")
    arr = group.create_array("t", shape=data.shape, chunks=(3, 1, 4, 5), dtype="float32", fill_value="nan",
                             dimension_names=["time", "level", "latitude", "longitude"])
    arr[...] = data
    group.consolidate()
    result = run("stats", tmp_path / "levels.zarr", "--variables", "t", "--json")
    printed = json.loads(result.stdout)["t"]
    stats = zfeed.open(tmp_path / "levels.zarr")["t"].attrs["zfeed_stats"]
    assert printed == stats
    assert stats["level_dim"] == "level"
    values = data.astype(np.float64)
    np.testing.assert_allclose(stats["mean"], np.nanmean(values, axis=(0, 2, 3)), rtol=1e-12)
    np.testing.assert_allclose(stats["std"], np.nanstd(values, axis=(0, 2, 3)), rtol=1e-6)
    np.testing.assert_array_equal(stats["min"], np.nanmin(values, axis=(0, 2, 3)))
    np.testing.assert_array_equal(stats["max"], np.nanmax(values, axis=(0, 2, 3)))
    assert stats["nan_count"] == np.isnan(values).sum(axis=(0, 2, 3)).tolist()
    assert stats["count"] == (~np.isnan(values)).sum(axis=(0, 2, 3)).tolist()
    result = run("stats", tmp_path / "levels.zarr", "--variables", "nope", ok=False)
    assert result.returncode != 0 and "nope" in result.stderr
    # A read-only URL is refused before the work, saying how to print the statistics only.
    result = run("stats", "http://127.0.0.1:9/levels.zarr", ok=False)
    assert result.returncode != 0
    assert "a http:// store is read-only here: add --no-write to print them only" in result.stderr
