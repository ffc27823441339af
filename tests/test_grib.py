"""`zfeed convert` of GRIB files, checked against ecCodes (message by message) and xarray + cfgrib.

Runs the installed command (.venv/bin/zfeed, put there by `make python`) on the shared real data:
744 hourly ERA5 2 m temperature fields, and an ERA5 ensemble (10 members, 2 pressure levels).
"""

from __future__ import annotations

import numpy as np
import pytest

import zfeed
import zfeed_cli

if hasattr(zfeed, "build_info") and not zfeed.build_info()["grib"]:
    pytest.skip(zfeed.build_info()["grib_reason"], allow_module_level=True)
xr = pytest.importorskip("xarray")
eccodes = pytest.importorskip("eccodes")
pytest.importorskip("cfgrib")

HOURLY = "data/era5-2mt-2019-03-uk.grib"
MEMBERS = "data/era5-levels-members.grib"


def convert(*args, ok=True):
    return zfeed_cli.run("convert", *args, ok=ok, timeout=600)


def messages(path):
    """Each message's keys and values (float32, as cfgrib gives them), decoded by ecCodes."""
    with open(path, "rb") as f:
        while (handle := eccodes.codes_grib_new_from_file(f)) is not None:
            try:
                keys = {k: eccodes.codes_get(handle, k) for k in ("shortName", "number", "dataDate", "dataTime", "level")}
                keys["offset"] = int(eccodes.codes_get(handle, "offset"))
                keys["bytes"] = eccodes.codes_get_message(handle)
                shape = (eccodes.codes_get(handle, "Nj"), eccodes.codes_get(handle, "Ni"))
                keys["values"] = eccodes.codes_get_values(handle).astype(np.float32).reshape(shape)
                yield keys
            finally:
                eccodes.codes_release(handle)


def open_cfgrib(path):
    return xr.open_dataset(path, engine="cfgrib", backend_kwargs={"indexpath": ""})


def as_comparable(variable):
    """Values to compare: datetimes and timedeltas as int64 nanoseconds."""
    values = np.asarray(variable.values)
    if np.issubdtype(values.dtype, np.datetime64):
        return values.astype("datetime64[ns]").astype(np.int64)
    if np.issubdtype(values.dtype, np.timedelta64):
        return values.astype("timedelta64[ns]").astype(np.int64)
    return values


def assert_matches_cfgrib(actual: xr.Dataset, expected: xr.Dataset) -> None:
    """Same data variables, coordinates, dims, values and CF attributes as xarray + cfgrib."""
    assert set(actual.data_vars) == set(expected.data_vars)
    assert set(actual.coords) == set(expected.coords)
    assert dict(actual.sizes) == dict(expected.sizes)
    for name, want in expected.variables.items():
        got = actual.variables[name]
        assert got.dims == want.dims, name
        assert got.dtype == want.dtype, name
        np.testing.assert_array_equal(as_comparable(got), as_comparable(want), err_msg=name)
        for key in ("units", "long_name", "standard_name", "positive", "stored_direction", "GRIB_shortName",
                    "GRIB_paramId", "GRIB_typeOfLevel", "GRIB_gridType", "GRIB_Nx", "GRIB_Ny"):
            if key in want.attrs:
                assert got.attrs.get(key) == want.attrs[key], (name, key)
    for key in ("GRIB_edition", "GRIB_centre", "Conventions", "institution"):
        assert actual.attrs[key] == expected.attrs[key], key


def test_era5_hourly_equals_eccodes_and_cfgrib(shared, tmp_path):
    source = shared / HOURLY
    out = tmp_path / "era5.zarr"
    proc = convert(source, out, "--chunks", "time=24", "--codec", "zstd:3")
    assert "converted 8 variables" in proc.stdout
    actual = xr.open_zarr(out)
    assert actual["t2m"].dims == ("time", "latitude", "longitude")
    assert actual["t2m"].encoding["chunks"] == (24, 33, 49)
    assert actual["time"].encoding["units"] == "seconds since 1970-01-01T00:00:00"
    assert_matches_cfgrib(actual, open_cfgrib(source))

    t2m = actual["t2m"].values
    times = actual["time"].values
    count = 0
    for i, message in enumerate(messages(source)):
        np.testing.assert_array_equal(t2m[i], message["values"], err_msg=f"message {i + 1}")
        hour = message["dataTime"] // 100
        assert times[i] == np.datetime64(f"{str(message['dataDate'])[:4]}-{str(message['dataDate'])[4:6]}-"
                                         f"{str(message['dataDate'])[6:]}T{hour:02d}:00", "ns"), i
        count += 1
    assert count == 744


def test_era5_members_keep_number_and_level(shared, tmp_path):
    source = shared / MEMBERS
    out = tmp_path / "members.zarr"
    convert(source, out, "--chunks", "number=1,time=1")
    actual = xr.open_zarr(out)
    for name in ("t", "z"):
        assert actual[name].dims == ("number", "time", "isobaricInhPa", "latitude", "longitude")
        assert actual[name].shape == (10, 4, 2, 61, 120)
    np.testing.assert_array_equal(actual["number"].values, np.arange(10))
    np.testing.assert_array_equal(actual["isobaricInhPa"].values, [850.0, 500.0])
    assert_matches_cfgrib(actual, open_cfgrib(source))

    times = [np.datetime64(t, "ns") for t in ("2017-01-01T00", "2017-01-01T12", "2017-01-02T00", "2017-01-02T12")]
    values = {name: actual[name].values for name in ("t", "z")}
    count = 0
    for message in messages(source):
        date = str(message["dataDate"])
        when = np.datetime64(f"{date[:4]}-{date[4:6]}-{date[6:]}T{message['dataTime'] // 100:02d}", "ns")
        field = values[message["shortName"]][message["number"], times.index(when), [850, 500].index(message["level"])]
        np.testing.assert_array_equal(field, message["values"], err_msg=str(message["offset"]))
        count += 1
    assert count == 160


def test_files_join_along_time(shared, tmp_path):
    source = shared / HOURLY
    all_messages = list(messages(source))
    first, second = tmp_path / "first.grib", tmp_path / "second.grib"
    first.write_bytes(b"".join(m["bytes"] for m in all_messages[:300]))
    second.write_bytes(b"".join(m["bytes"] for m in all_messages[300:]))
    whole, joined = tmp_path / "whole.zarr", tmp_path / "joined.zarr"
    convert(source, whole, "--chunks", "time=24")
    convert(first, second, joined, "--chunks", "time=24")
    a, b = xr.open_zarr(whole), xr.open_zarr(joined)
    for name in ("t2m", "time", "valid_time", "latitude", "longitude"):
        np.testing.assert_array_equal(as_comparable(a[name]), as_comparable(b[name]), err_msg=name)


def test_truncated_file_is_an_error_and_leaves_no_store(shared, tmp_path):
    data = (shared / HOURLY).read_bytes()
    truncated = tmp_path / "truncated.grib"
    offsets = [m["offset"] for m in messages(shared / HOURLY)]
    truncated.write_bytes(data[: offsets[5] + 1000])  # inside message 6
    out = tmp_path / "out.zarr"
    proc = convert(truncated, out, ok=False)
    assert proc.returncode == 1, proc.stderr
    assert str(truncated) in proc.stderr
    assert f"message 6 at byte {offsets[5]}" in proc.stderr
    assert not (out / "zarr.json").exists()
    assert not out.exists()


def test_different_grids_are_an_error(shared, tmp_path):
    out = tmp_path / "out.zarr"
    proc = convert(shared / HOURLY, shared / MEMBERS, out, ok=False)
    assert proc.returncode == 1 and "mismatched grids" in proc.stderr, proc.stderr
    assert not out.exists()

    # The same shape, moved one degree north.
    moved = tmp_path / "moved.grib"
    with open(shared / HOURLY, "rb") as f, open(moved, "wb") as dst:
        for _ in range(24):
            handle = eccodes.codes_grib_new_from_file(f)
            for key in ("latitudeOfFirstGridPointInDegrees", "latitudeOfLastGridPointInDegrees"):
                eccodes.codes_set(handle, key, eccodes.codes_get(handle, key) + 1.0)
            dst.write(eccodes.codes_get_message(handle))
            eccodes.codes_release(handle)
    proc = convert(shared / HOURLY, moved, out, ok=False)
    assert proc.returncode == 1 and "mismatched grids: coordinate latitude differs" in proc.stderr, proc.stderr
    assert not out.exists()


def test_missing_values_without_a_bitmap_are_nan(tmp_path):
    """Complex packing with missing value management (NCEP's products) marks missing points with
    no bitmap; they are NaN, as cfgrib reads them, not the coded missing value."""
    handle = eccodes.codes_grib_new_from_samples("regular_ll_sfc_grib2")
    for key, value in {"Ni": 4, "Nj": 3, "numberOfDataPoints": 12, "packingType": "grid_complex",
                       "missingValueManagementUsed": 1, "missingValue": 9999}.items():
        eccodes.codes_set(handle, key, value)
    values = np.arange(12, dtype=float) * 0.5 + 250
    values[[2, 9]] = 9999
    eccodes.codes_set_values(handle, values)
    assert eccodes.codes_get(handle, "bitmapPresent") == 0
    with open(tmp_path / "complex.grib2", "wb") as f:
        eccodes.codes_write(handle, f)
    eccodes.codes_release(handle)
    convert(tmp_path / "complex.grib2", tmp_path / "out.zarr")
    got = zfeed.open(tmp_path / "out.zarr")["t"][...].reshape(-1)
    expected = open_cfgrib(tmp_path / "complex.grib2")["t"].values.reshape(-1)
    assert np.isnan(got[[2, 9]]).all() and np.isnan(expected[[2, 9]]).all()
    np.testing.assert_allclose(got, expected, rtol=1e-6)
