"""`zfeed convert`: netCDF and Zarr inputs to Zarr v3, checked against xarray on the shared real data.

Runs the installed command (.venv/bin/zfeed, put there by `make python`) as a user would.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

zfeed = pytest.importorskip("zfeed")
xr = pytest.importorskip("xarray")
netCDF4 = pytest.importorskip("netCDF4")

# A build without netCDF (libnetcdf absent where it was built) refuses .nc inputs: skip those tests.
_BUILD = zfeed.build_info() if hasattr(zfeed, "build_info") else {"netcdf": True}
needs_netcdf = pytest.mark.skipif(not _BUILD["netcdf"], reason=_BUILD.get("netcdf_reason", ""))

# ZFEED_BIN runs another build of the command (the sanitized build/debug/zfeed, say).
ZFEED = Path(os.environ.get("ZFEED_BIN") or Path(sys.executable).parent / "zfeed")
PROGRESS = ".zfeed-convert-progress.json"


@pytest.fixture(scope="module")
def zfeed_cmd() -> str:
    if not ZFEED.exists():
        pytest.skip(f"{ZFEED} is absent (run `make python`)")
    return str(ZFEED)


def run(cmd: str, *args, env: dict | None = None, check: bool = True) -> subprocess.CompletedProcess:
    full_env = dict(os.environ, **(env or {}))
    proc = subprocess.run([cmd, "convert", *map(str, args)], capture_output=True, text=True, env=full_env)
    if check and proc.returncode != 0:
        raise AssertionError(f"zfeed convert failed ({proc.returncode}):\n{proc.stdout}\n{proc.stderr}")
    return proc


def same_attr(a, b) -> bool:
    if isinstance(a, str) or isinstance(b, str):
        return a == b
    return np.allclose(np.asarray(a, dtype=float), np.asarray(b, dtype=float), rtol=1e-6, equal_nan=True)


def assert_same_dataset(expected: xr.Dataset, actual: xr.Dataset, encoding_of: xr.Dataset | None = None) -> None:
    """Same variables, dims, values and attributes; time's CF encoding as in `encoding_of` (default: expected)."""
    assert set(expected.data_vars) == set(actual.data_vars)
    assert set(expected.coords) == set(actual.coords)
    assert dict(expected.sizes) == dict(actual.sizes)
    assert expected.attrs.keys() == actual.attrs.keys()
    for key, value in expected.attrs.items():
        assert same_attr(value, actual.attrs[key]), key
    for name, var in expected.variables.items():
        got = actual.variables[name]
        assert got.dims == var.dims, name
        assert var.attrs.keys() == got.attrs.keys(), (name, var.attrs, got.attrs)
        for key, value in var.attrs.items():
            assert same_attr(value, got.attrs[key]), (name, key)
        want, have = var.values, got.values
        if np.issubdtype(want.dtype, np.floating):
            np.testing.assert_allclose(have, want, rtol=1e-6, equal_nan=True, err_msg=name)
        else:
            np.testing.assert_array_equal(have, want, err_msg=name)
    # Time keeps its CF encoding.
    source = expected if encoding_of is None else encoding_of
    if "time" in source.variables and "units" in source["time"].encoding:
        assert actual["time"].encoding["units"] == source["time"].encoding["units"]
        assert actual["time"].encoding.get("calendar") == source["time"].encoding.get("calendar")


def tree(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


def split_in_time(source: Path, parts: list[tuple[int, int]], out_dir: Path) -> list[Path]:
    """Writes time slices of a netCDF file as separate netCDF-4 files, variables and attributes as they are."""
    paths = []
    with netCDF4.Dataset(source) as src:
        for k, (start, stop) in enumerate(parts):
            path = out_dir / f"part{k}.nc"
            with netCDF4.Dataset(path, "w", format="NETCDF4") as dst:
                dst.setncatts({a: src.getncattr(a) for a in src.ncattrs()})
                for name, dim in src.dimensions.items():
                    dst.createDimension(name, None if dim.isunlimited() else len(dim))
                for name, var in src.variables.items():
                    var.set_auto_maskandscale(False)
                    out = dst.createVariable(name, var.dtype, var.dimensions)
                    out.setncatts({a: var.getncattr(a) for a in var.ncattrs()})
                    out[...] = var[start:stop] if var.dimensions and var.dimensions[0] == "time" else var[...]
            paths.append(path)
    return paths


@needs_netcdf
def test_ecmwf_packed_netcdf(zfeed_cmd, shared, tmp_path):
    source = shared / "data/ecmwf-t-z-2007-01-01.nc"
    out = tmp_path / "ecmwf.zarr"
    proc = run(zfeed_cmd, source, out, "--chunks", "time=1,level=1", "--codec", "zstd:3")
    assert "converted 6 variables" in proc.stdout
    assert not (out / PROGRESS).exists()
    actual = xr.open_zarr(out)
    assert actual["t"].dtype == np.float32
    assert actual["t"].encoding["chunks"] == (1, 1, 181, 360)
    assert_same_dataset(xr.open_dataset(source), actual)


def test_ecmwf_zarr_v2_input(zfeed_cmd, shared, tmp_path):
    out = tmp_path / "from-v2.zarr"
    source = shared / "data/ecmwf-t-z-2007-01-01.zarr"
    run(zfeed_cmd, source, out, "--chunks", "latitude=91", "--codec", "blosc:lz4")
    actual = xr.open_zarr(out)
    assert actual["t"].encoding["chunks"] == (1, 2, 91, 360)
    # xarray wrote the v2 copy with its own time units; the values are those of the netCDF file.
    assert_same_dataset(xr.open_dataset(shared / "data/ecmwf-t-z-2007-01-01.nc"), actual, encoding_of=xr.open_zarr(source))


@needs_netcdf
def test_ccsm_sharded(zfeed_cmd, shared, tmp_path):
    source = shared / "data/ccsm-b003-TS-200-299.nc"
    out = tmp_path / "ccsm.zarr"
    run(zfeed_cmd, source, out, "--chunks", "time=1", "--shards", "time=10", "--codec", "gzip:6")
    actual = xr.open_zarr(out, decode_times=False)
    assert actual["TS"].encoding["shards"] == (10, 64, 128)
    assert_same_dataset(xr.open_dataset(source, decode_times=False), actual)


@needs_netcdf
def test_ccsm_joined_along_time(zfeed_cmd, shared, tmp_path):
    source = shared / "data/ccsm-b003-TS-200-299.nc"
    parts = split_in_time(source, [(0, 37), (37, 100)], tmp_path)
    out = tmp_path / "joined.zarr"
    run(zfeed_cmd, *parts, out, "--chunks", "time=4")
    assert_same_dataset(xr.open_dataset(source, decode_times=False), xr.open_zarr(out, decode_times=False))
    # --variables keeps the coordinates the variables use.
    only = tmp_path / "only-ts.zarr"
    run(zfeed_cmd, *parts, only, "--variables", "TS")
    assert set(xr.open_zarr(only, decode_times=False).variables) == {"TS", "time", "lat", "lon"}


@needs_netcdf
def test_resumes_after_interruption(zfeed_cmd, shared, tmp_path):
    source = shared / "data/ccsm-b003-TS-200-299.nc"
    args = ["--chunks", "time=1", "--shards", "time=5"]
    whole = tmp_path / "whole.zarr"
    run(zfeed_cmd, source, whole, *args)

    out = tmp_path / "resumed.zarr"
    proc = run(zfeed_cmd, source, out, *args, env={"ZFEED_CONVERT_STOP_AFTER": "7"}, check=False)
    assert proc.returncode == 75, proc.stderr
    assert (out / PROGRESS).exists()
    assert not (out / "zarr.json").exists()  # an unfinished output does not look like a store
    # Another run with other arguments is refused while the conversion is unfinished.
    other = run(zfeed_cmd, source, out, "--chunks", "time=2", check=False)
    assert other.returncode == 1 and "unfinished conversion" in other.stderr

    proc = run(zfeed_cmd, source, out, *args)
    assert "already done by an earlier run" in proc.stdout
    assert not (out / PROGRESS).exists()
    assert tree(out) == tree(whole)
    assert_same_dataset(xr.open_dataset(source, decode_times=False), xr.open_zarr(out, decode_times=False))


@needs_netcdf
def test_refuses_to_overwrite(zfeed_cmd, shared, tmp_path):
    source = shared / "data/ecmwf-t-z-2007-01-01.nc"
    out = tmp_path / "out.zarr"
    run(zfeed_cmd, source, out)
    before = tree(out)
    proc = run(zfeed_cmd, source, out, "--codec", "none", check=False)
    assert proc.returncode == 1
    assert "already exists" in proc.stderr and "--overwrite" in proc.stderr
    assert tree(out) == before
    run(zfeed_cmd, source, out, "--codec", "none", "--overwrite")
    assert tree(out) != before
    assert_same_dataset(xr.open_dataset(source), xr.open_zarr(out))


@needs_netcdf
def test_bad_arguments(zfeed_cmd, shared, tmp_path):
    source = shared / "data/ecmwf-t-z-2007-01-01.nc"
    proc = run(zfeed_cmd, source, tmp_path / "a.zarr", "--variables", "q", check=False)
    assert proc.returncode == 1 and "no variable 'q'" in proc.stderr
    proc = run(zfeed_cmd, source, tmp_path / "b.zarr", "--codec", "lzma", check=False)
    assert proc.returncode == 1 and "unknown codec" in proc.stderr
    (tmp_path / "c.bin").write_bytes(b"not a dataset")
    proc = run(zfeed_cmd, tmp_path / "c.bin", tmp_path / "c.zarr", check=False)
    assert proc.returncode == 1 and "not a netCDF or GRIB file" in proc.stderr
    proc = run(zfeed_cmd, source, shared / "data/ccsm-b003-TS-200-299.nc", tmp_path / "d.zarr", check=False)
    assert proc.returncode == 1 and "mismatched grids" in proc.stderr
    for name in "abcd":
        assert not (tmp_path / f"{name}.zarr").exists()


@needs_netcdf
def test_selects_levels_by_value_and_index(zfeed_cmd, shared, tmp_path):
    source = shared / "data/ecmwf-t-z-2007-01-01.nc"
    expected = xr.open_dataset(source)
    out = tmp_path / "sel.zarr"
    run(zfeed_cmd, source, out, "--sel", "level=850,500")
    actual = xr.open_zarr(out)
    assert list(actual["level"].values) == [850, 500]
    assert_same_dataset(expected.sel(level=[850, 500]), actual)
    out = tmp_path / "isel.zarr"
    run(zfeed_cmd, source, out, "--isel", "level=1", "--variables", "t")
    assert_same_dataset(expected[["t"]].isel(level=[1]), xr.open_zarr(out))
    proc = run(zfeed_cmd, source, tmp_path / "bad.zarr", "--sel", "level=700", check=False)
    assert proc.returncode == 1 and "level=700" in proc.stderr and "500, 850" in proc.stderr
    assert not (tmp_path / "bad.zarr").exists()


@needs_netcdf
def test_stack_as_anemoi_lays_it_out_with_per_channel_stats(zfeed_cmd, shared, tmp_path):
    source = shared / "data/ecmwf-t-z-2007-01-01.nc"
    expected = xr.open_dataset(source)
    out = tmp_path / "stack.zarr"
    run(zfeed_cmd, source, out, "--stack")
    ds = xr.open_zarr(out)
    data = ds["data"]
    assert data.dims == ("time", "variable", "latitude", "longitude")
    assert data.dtype == np.float32
    names = ["t_500", "t_850", "z_500", "z_850"]
    assert data.attrs["variables"] == names
    assert data.encoding["chunks"] == (1, 4, 181, 360)
    assert set(ds.coords) == {"time", "latitude", "longitude"}
    for k, name in enumerate(names):
        var, level = name.split("_")
        want = expected[var].sel(level=int(level)).values.astype(np.float32)
        np.testing.assert_allclose(data.values[:, k], want, rtol=1e-6, err_msg=name)
    # `zfeed stats` writes one entry per channel, as the loader reads them.
    subprocess.run([zfeed_cmd, "stats", str(out)], check=True, capture_output=True)
    stats = zfeed.open(str(out))["data"].attrs["zfeed_stats"]
    assert stats["level_dim"] == "variable"
    values = data.values.astype(np.float64)
    np.testing.assert_allclose(stats["mean"], values.mean(axis=(0, 2, 3)), rtol=1e-9)
    np.testing.assert_allclose(stats["std"], values.std(axis=(0, 2, 3)), rtol=1e-9)


@needs_netcdf
def test_progress_line_on_a_terminal_and_summary_otherwise(zfeed_cmd, shared, tmp_path):
    import pty

    source = shared / "data/ccsm-b003-TS-200-299.nc"
    leader, follower = pty.openpty()
    proc = subprocess.run([zfeed_cmd, "convert", str(source), str(tmp_path / "tty.zarr"), "--chunks", "time=1"],
                          stdout=subprocess.PIPE, stderr=follower, text=True)
    os.close(follower)
    shown = b""
    while True:
        try:
            chunk = os.read(leader, 65536)
        except OSError:
            break
        if not chunk:
            break
        shown += chunk
    os.close(leader)
    assert proc.returncode == 0
    line = shown.decode()
    assert "\r" in line and "%" in line and "MB/s" in line and "ETA" in line, line
    assert "100.0%" in line
    # Not a terminal: no progress line, one summary line.
    proc = run(zfeed_cmd, source, tmp_path / "pipe.zarr", "--chunks", "time=1")
    assert "\r" not in proc.stderr and "ETA" not in proc.stderr
    assert "converted" in proc.stdout and "MB/s" in proc.stdout


@needs_netcdf
def test_ccsm_statistics_equal_numpys(zfeed_cmd, shared, tmp_path):
    source = shared / "data/ccsm-b003-TS-200-299.nc"
    out = tmp_path / "ccsm.zarr"
    run(zfeed_cmd, source, out, "--chunks", "time=1")
    proc = subprocess.run([zfeed_cmd, "stats", str(out), "--json"], capture_output=True, text=True, check=True)
    stats = json.loads(proc.stdout)["TS"]
    values = xr.open_dataset(source, decode_times=False)["TS"].values.astype(np.float64)
    assert stats["count"] == values.size and stats["nan_count"] == 0
    np.testing.assert_allclose(stats["mean"], values.mean(), rtol=1e-12)
    np.testing.assert_allclose(stats["std"], values.std(), rtol=1e-10)
    assert stats["min"] == values.min() and stats["max"] == values.max()
    # Written as the attribute the loader normalizes with.
    attrs = xr.open_zarr(out, decode_times=False)["TS"].attrs["zfeed_stats"]
    np.testing.assert_allclose(attrs["mean"], values.mean(), rtol=1e-12)


def test_float16_variables_get_statistics_and_stack(zfeed_cmd, tmp_path):
    """float16 data (xarray writes it as is) gets statistics and is stacked as float32."""
    xr = pytest.importorskip("xarray")
    rng = np.random.default_rng(3)
    half = rng.normal(280, 5, (3, 4, 5)).astype(np.float16)
    full = rng.normal(0, 1, (3, 4, 5)).astype(np.float32)
    source = tmp_path / "half.zarr"
    xr.Dataset({"h": (("time", "lat", "lon"), half), "f": (("time", "lat", "lon"), full)},
               coords={"time": np.arange(3), "lat": np.arange(4.0), "lon": np.arange(5.0)}
               ).to_zarr(source, zarr_format=3)
    stats = subprocess.run([zfeed_cmd, "stats", str(source)], capture_output=True, text=True)
    assert stats.returncode == 0, stats.stderr
    mean = zfeed.open(source)["h"].attrs["zfeed_stats"]["mean"]
    assert mean == pytest.approx(float(half.astype(np.float64).mean()), rel=1e-6)
    out = tmp_path / "stacked.zarr"
    run(zfeed_cmd, source, out, "--stack")
    data = zfeed.open(out)["data"]
    names = data.attrs["variables"]
    np.testing.assert_array_equal(data[:, names.index("h")], half.astype(np.float32))
    np.testing.assert_array_equal(data[:, names.index("f")], full)


def test_inputs_whose_times_count_from_other_dates_are_refused(zfeed_cmd, tmp_path):
    """Files that each count time from their own start (MERRA-2's daily files) cannot be joined
    by their raw values: that would repeat the times. The error says so rather than write it."""
    xr = pytest.importorskip("xarray")
    parts = []
    for day in (1, 2):
        ds = xr.Dataset({"t": (("time", "lat"), np.full((24, 2), float(day), np.float32))},
                        coords={"time": np.arange(f"2020-01-0{day}", f"2020-01-0{day + 1}",
                                                  dtype="datetime64[h]").astype("datetime64[ns]"),
                                "lat": [0.0, 1.0]})
        path = tmp_path / f"d{day}.zarr"
        ds.to_zarr(path, zarr_format=3, encoding={"time": {"units": f"hours since 2020-01-0{day}",
                                                           "dtype": "int64"}})
        parts.append(path)
    proc = run(zfeed_cmd, *parts, tmp_path / "out.zarr", check=False)
    assert proc.returncode != 0
    assert ('time has units "hours since 2020-01-01" in' in proc.stderr
            and '"hours since 2020-01-02" in' in proc.stderr), proc.stderr
