"""The xarray backend: `xr.open_dataset(path, engine="zfeed")` gives what xarray's zarr engine
gives (dims, coordinates, attributes, CF decoding), lazily, on stores written by xarray's own
`to_zarr` (v2 and v3), by zfeed (sharded zstd v3, v2, single arrays) and on the shared real data."""

from __future__ import annotations

import shutil
import threading
import warnings
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest

import zfeed

xr = pytest.importorskip("xarray")
pytest.importorskip("zarr")
pd = pytest.importorskip("pandas")

from zfeed.xarray_backend import ZfeedBackendArray, ZfeedBackendEntrypoint  # noqa: E402

pytestmark = pytest.mark.filterwarnings(
    # zarr-python warns that consolidated metadata is not (yet) part of the v3 specification.
    "ignore:Consolidated metadata is currently not part:UserWarning",
)


def _zarr(path, **kwargs):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return xr.open_dataset(path, engine="zarr", **kwargs)


def _zfeed(path, **kwargs):
    return xr.open_dataset(path, engine="zfeed", **kwargs)


def _cf_dataset(seed: int) -> "xr.Dataset":
    """A small weather dataset with the CF encodings xarray writes: int16 packing with
    scale_factor/add_offset and _FillValue, float NaNs, CF times, a non-index coordinate, a 0-d
    coordinate, attributes on the variables and the dataset."""
    rng = np.random.default_rng(seed)
    time = pd.date_range("2000-01-01", periods=10, freq="6h")
    t2m = (rng.standard_normal((10, 5, 7)) * 10 + 280).astype("float32")
    t2m[0, 0, 0] = np.nan
    tp = rng.random((10, 5, 7)) * 0.01
    tp[3, 2, :] = np.nan
    ds = xr.Dataset(
        {
            "t2m": (("time", "lat", "lon"), t2m, {"units": "K", "long_name": "2 metre temperature"}),
            "tp": (("time", "lat", "lon"), tp, {"units": "m"}),
            "land": (("lat", "lon"), rng.integers(0, 3, (5, 7)).astype("int8"), {"flag_values": [0, 1, 2]}),
            "count": (("time",), np.arange(10, dtype="int32")),
        },
        coords={
            "time": time,
            "lat": ("lat", np.linspace(60, 50, 5), {"units": "degrees_north"}),
            "lon": ("lon", np.arange(7.0) * 1.5, {"units": "degrees_east"}),
            "step": ("time", np.arange(10) * np.timedelta64(6, "h")),
            "height": ((), 2.0, {"units": "m"}),
            "station": (("lat", "lon"), rng.integers(0, 100, (5, 7)).astype("int32")),
        },
        attrs={"title": "zfeed xarray backend test", "history": "made up", "count": 3},
    )
    ds["t2m"].encoding = {"dtype": "int16", "scale_factor": 0.01, "add_offset": 280.0, "_FillValue": -32768,
                          "chunks": (2, 5, 4)}
    ds["tp"].encoding = {"chunks": (3, 5, 7)}
    ds["time"].encoding = {"units": "hours since 2000-01-01", "calendar": "standard", "dtype": "int64"}
    return ds


@pytest.fixture(params=[2, 3], ids=["v2", "v3"])
def cf_store(request, tmp_path, seed):
    path = tmp_path / f"cf-v{request.param}.zarr"
    ds = _cf_dataset(seed)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        ds.to_zarr(path, mode="w", zarr_format=request.param, consolidated=True)
    return path, ds


def test_entry_point_is_registered():
    engines = xr.backends.list_engines()
    assert "zfeed" in engines
    assert isinstance(engines["zfeed"], ZfeedBackendEntrypoint)
    assert engines["zfeed"].description


def test_import_zfeed_does_not_import_xarray():
    import subprocess
    import sys

    code = "import sys, zfeed; print('xarray' in sys.modules, 'zfeed.xarray_backend' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.split() == ["False", "False"]


def test_equals_zarr_engine(cf_store):
    path, original = cf_store
    got = _zfeed(path)
    want = _zarr(path)
    xr.testing.assert_identical(got, want)
    assert set(got.coords) == {"time", "lat", "lon", "step", "height", "station"}
    assert got["time"].dtype.kind == "M" and got["step"].dtype.kind == "m"
    assert got["t2m"].encoding["scale_factor"] == 0.01 and got["t2m"].encoding["dtype"] == np.dtype("int16")
    assert np.isnan(got["t2m"].values[0, 0, 0]) and np.isnan(got["tp"].values[3, 2]).all()
    # And against what was written: int16 packing loses below 0.005 K.
    xr.testing.assert_allclose(got.load(), original, atol=0.006)
    for name in got.variables:
        assert got[name].encoding.get("chunks") == want[name].encoding.get("chunks"), name
        assert got[name].encoding.get("preferred_chunks") == want[name].encoding.get("preferred_chunks"), name
        assert got[name].encoding.get("shards") == want[name].encoding.get("shards"), name
        assert got[name].encoding.get("dtype") == want[name].encoding.get("dtype"), name


@pytest.mark.parametrize(
    "options",
    [
        {"decode_times": False},
        {"mask_and_scale": False},
        {"decode_coords": False},
        {"decode_timedelta": False},
        {"mask_and_scale": False, "decode_times": False, "decode_coords": False, "concat_characters": False},
        {"drop_variables": ["tp", "station"]},
        {"drop_variables": "land"},
        {"use_cftime": True},
    ],
    ids=lambda o: ",".join(f"{k}={v}" for k, v in o.items()),
)
def test_decode_options_equal_zarr_engine(cf_store, options):
    path, _ = cf_store
    kwargs = dict(options)
    if kwargs.get("use_cftime"):
        pytest.importorskip("cftime")
        kwargs.pop("use_cftime")
        coder = xr.coders.CFDatetimeCoder(use_cftime=True)
        kwargs["decode_times"] = coder
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        got = _zfeed(path, **kwargs)
        want = _zarr(path, **kwargs)
    xr.testing.assert_identical(got, want)


SELECTIONS = [
    {"time": 3},
    {"time": -1, "lat": 2},
    {"time": slice(1, 9, 3)},
    {"time": slice(None, None, -2), "lon": slice(6, 0, -3)},
    {"lat": slice(1, 4), "lon": slice(None, None, 2)},
    {"lon": [0, 3, 4, 6]},  # outer: zfeed reads those columns' chunks only
    {"time": [7, 2, 5], "lat": [4, 0]},
    {"time": xr.DataArray([1, 4, 8], dims="points"), "lon": xr.DataArray([0, 2, 6], dims="points")},  # vectorized
    {"time": xr.DataArray([1, 4, 8], dims="p"), "lat": slice(None, None, -2), "lon": xr.DataArray([6, 2, 6], dims="p")},
    {"lat": xr.DataArray([[0, 1], [4, 3]], dims=("a", "b")), "lon": xr.DataArray([[1, 1], [0, 6]], dims=("a", "b"))},
    {"time": slice(4, 4)},  # empty
]


@pytest.mark.parametrize("selection", SELECTIONS, ids=[repr(s) for s in SELECTIONS])
def test_isel_equals_zarr_engine(cf_store, selection):
    path, _ = cf_store
    xr.testing.assert_identical(_zfeed(path).isel(selection), _zarr(path).isel(selection))
    # Selected before loading and loaded whole, then selected: the same values.
    xr.testing.assert_identical(_zfeed(path).isel(selection).load(), _zfeed(path).load().isel(selection))


def test_sel_equals_zarr_engine(cf_store):
    path, _ = cf_store
    got, want = _zfeed(path), _zarr(path)
    for selection in [
        {"time": slice("2000-01-01T06", "2000-01-02T12")},
        {"time": "2000-01-02T00", "lat": 55.0},
        {"lat": slice(58, 51), "lon": slice(1.0, 7.0)},
        {"time": slice(None, None, 4)},
    ]:
        xr.testing.assert_identical(got.sel(selection), want.sel(selection))
    xr.testing.assert_identical(got.sel(lat=56.2, method="nearest"), want.sel(lat=56.2, method="nearest"))
    xr.testing.assert_identical(got.t2m.mean("time"), want.t2m.mean("time"))


class _CountingReads:
    """Records the selections every ZfeedBackendArray reads, by array path."""

    def __init__(self, monkeypatch):
        self.reads: list[tuple[str, tuple]] = []
        self._lock = threading.Lock()
        for method in ("_read", "_read_points"):
            monkeypatch.setattr(ZfeedBackendArray, method, self._counting(getattr(ZfeedBackendArray, method)))

    def _counting(self, original):
        def counting(backend_array, key):
            with self._lock:
                self.reads.append((backend_array.get_array().path, key))
            return original(backend_array, key)

        return counting

    def of(self, path):
        return [key for p, key in self.reads if p == path]


def test_opening_is_lazy(cf_store, monkeypatch):
    path, _ = cf_store
    counter = _CountingReads(monkeypatch)
    ds = _zfeed(path)
    # xarray loads the index coordinates (time, lat, lon) to build indexes; nothing else is read.
    assert {p for p, _ in counter.reads} <= {"time", "lat", "lon"}
    subset = ds["t2m"].isel(time=slice(2, 8, 2), lon=slice(1, 5))
    assert counter.of("t2m") == []
    values = subset.values
    assert values.shape == (3, 5, 4)
    # One read of exactly the selection, not of the whole array.
    (key,) = counter.of("t2m")
    shape = ds["t2m"].shape
    assert [range(*k.indices(n)) for k, n in zip(key, shape)] == [range(2, 8, 2), range(5), range(1, 5)]


def test_outer_selections_read_only_the_listed_indices(cf_store, monkeypatch):
    path, _ = cf_store
    counter = _CountingReads(monkeypatch)
    got = _zfeed(path)["t2m"].isel(time=[7, 0, 7], lon=[5, 1]).values
    # One read of the listed time steps and columns (zfeed reads each one's chunk once), not of
    # the slices spanning them.
    (key,) = counter.of("t2m")
    assert [list(np.atleast_1d(k)) if not isinstance(k, slice) else k for k in key] == [[7, 0, 7], slice(None), [5, 1]]
    np.testing.assert_array_equal(got, _zarr(path)["t2m"].isel(time=[7, 0, 7], lon=[5, 1]).values)


def test_vectorized_selections_read_the_points(cf_store, monkeypatch):
    """Stations picked by (lat, lon) pairs: one read of those points, not of the box or the outer
    product around them."""
    path, _ = cf_store
    counter = _CountingReads(monkeypatch)
    lat, lon = xr.DataArray([0, 4, 4], dims="station"), xr.DataArray([6, 1, 6], dims="station")
    got = _zfeed(path)["t2m"].isel(lat=lat, lon=lon).load()
    # xarray hands the points over with the time slice as indices of its own: (time, station).
    (key,) = counter.of("t2m")
    time, lats, lons = np.broadcast_arrays(*key)
    assert (time == np.arange(got.sizes["time"])[:, None]).all()
    assert (lats == [0, 4, 4]).all() and (lons == [6, 1, 6]).all()
    xr.testing.assert_identical(got, _zarr(path)["t2m"].isel(lat=lat, lon=lon))


def test_values_are_read_when_used_not_when_opened(tmp_path):
    """Opened, then the store changes on disk: the dataset sees the new values, so nothing of the
    data was read at opening."""
    path = tmp_path / "lazy.zarr"
    g = zfeed.create_group(path)
    g.create_array("x", shape=(3,), dtype="int32", dimension_names=["x"], data=np.arange(3))
    arr = g.create_array("v", shape=(3, 4), dtype="float32", chunks=(1, 4), fill_value="nan",
                         dimension_names=["x", "y"], data=np.ones((3, 4), "float32"))
    ds = _zfeed(path)
    arr[1] = 7.0
    shutil.rmtree(path / "v" / "c" / "2")  # a missing chunk reads as the fill value
    np.testing.assert_array_equal(ds["v"].values, [[1] * 4, [7] * 4, [np.nan] * 4])


def test_dask_chunks_follow_stored_chunks(cf_store):
    path, _ = cf_store
    ds = _zfeed(path, chunks={})
    assert ds["t2m"].chunks == ((2,) * 5, (5,), (4, 3))
    assert ds["tp"].chunks == ((3, 3, 3, 1), (5,), (7,))
    want = _zarr(path, chunks={})
    assert {k: v.chunks for k, v in ds.variables.items()} == {k: v.chunks for k, v in want.variables.items()}
    xr.testing.assert_identical(ds.compute(), want.compute())
    # dask's threaded scheduler reads the chunks from several threads at once; its processes
    # scheduler pickles the arrays into other processes, which read them there.
    xr.testing.assert_identical(ds.t2m.mean("time").compute(scheduler="threads"), want.t2m.mean("time").compute())
    xr.testing.assert_identical(ds.t2m.mean("time").compute(scheduler="processes", num_workers=2),
                                want.t2m.mean("time").compute())


def _sharded_store(path, seed):
    """A sharded, zstd-compressed Zarr v3 group written by zfeed, as `zfeed convert` writes them."""
    rng = np.random.default_rng(seed)
    g = zfeed.create_group(path, attributes={"title": "sharded", "Conventions": "CF-1.8"})
    g.create_array("time", shape=(48,), dtype="int64", dimension_names=["time"], data=np.arange(48) * 6,
                   attributes={"units": "hours since 2000-01-01", "calendar": "proleptic_gregorian"})
    g.create_array("latitude", shape=(33,), dtype="float32", dimension_names=["latitude"],
                   data=np.linspace(90, -90, 33), attributes={"units": "degrees_north"})
    g.create_array("longitude", shape=(49,), dtype="float32", dimension_names=["longitude"],
                   data=np.linspace(0, 360, 49, endpoint=False), attributes={"units": "degrees_east"})
    data = (rng.random((48, 33, 49)) * 90 + 220).astype("float32")
    data[5, :3, :3] = np.nan
    g.create_array("t2m", shape=data.shape, dtype="float32", chunks=(1, 33, 49), shards=(24, 33, 49),
                   compressor="zstd:3", fill_value="nan", dimension_names=["time", "latitude", "longitude"],
                   attributes={"units": "K", "long_name": "2 metre temperature"}, data=data)
    packed = rng.integers(-30000, 30000, size=(48, 33, 49)).astype("int16")
    packed[7] = -32767
    g.create_array("z", shape=packed.shape, dtype="int16", chunks=(4, 11, 49), shards=(8, 33, 49),
                   compressor="zstd:5", fill_value=-32767, dimension_names=["time", "latitude", "longitude"],
                   attributes={"scale_factor": 2.0, "add_offset": 50000.0, "_FillValue": -32767, "units": "m2 s-2"},
                   data=packed)
    g.consolidate()
    return data, packed


def test_zfeed_sharded_v3_store(tmp_path, seed, monkeypatch):
    path = tmp_path / "sharded.zarr"
    data, packed = _sharded_store(path, seed)
    got = _zfeed(path)
    want = _zarr(path)
    xr.testing.assert_identical(got, want)
    assert got["t2m"].encoding["chunks"] == (1, 33, 49)
    assert got["t2m"].encoding["shards"] == (24, 33, 49)
    assert got["t2m"].encoding["preferred_chunks"] == {"time": 1, "latitude": 33, "longitude": 49}
    assert got["time"].values[1] == np.datetime64("2000-01-01T06:00")
    np.testing.assert_array_equal(got["t2m"].values, data)
    z = got["z"].values
    assert np.isnan(z[7]).all()
    np.testing.assert_array_equal(z[8], packed[8] * 2.0 + 50000.0)
    for selection in SELECTIONS[:7]:
        selection = {{"lat": "latitude", "lon": "longitude"}.get(k, k): v for k, v in selection.items()}
        xr.testing.assert_identical(got.isel(selection), want.isel(selection))


def test_concurrent_reads(tmp_path, seed):
    path = tmp_path / "sharded.zarr"
    data, _ = _sharded_store(path, seed)
    t2m = _zfeed(path)["t2m"]
    keys = [(slice(i, i + 5), slice(i % 7, None, 2)) for i in range(40)]

    def read(key):
        return t2m[key].values

    with ThreadPoolExecutor(8) as pool:
        results = list(pool.map(read, keys))
    for key, result in zip(keys, results):
        np.testing.assert_array_equal(result, data[key])


def test_zfeed_v2_group_masks_fill_value(tmp_path):
    """On Zarr v2 the fill value means 'missing' (as in xarray's zarr engine); on v3 only
    _FillValue does, unless use_zarr_fill_value_as_mask=True."""
    for fmt in (2, 3):
        path = tmp_path / f"fill-v{fmt}.zarr"
        g = zfeed.create_group(path, zarr_format=fmt)
        g.create_array("v", shape=(4,), dtype="int16", fill_value=-9, dimension_names=["x"],
                       compressor="blosc:lz4", data=np.array([1, -9, 3, -9], "int16"))
        got = _zfeed(path)
        xr.testing.assert_identical(got, _zarr(path))
        if fmt == 2:
            np.testing.assert_array_equal(got["v"].values, [1, np.nan, 3, np.nan])
        else:
            np.testing.assert_array_equal(got["v"].values, [1, -9, 3, -9])
            assert got["v"].encoding["fill_value"] == -9
            masked = _zfeed(path, use_zarr_fill_value_as_mask=True)
            np.testing.assert_array_equal(masked["v"].values, [1, np.nan, 3, np.nan])


def test_single_array_store(tmp_path):
    data = np.arange(24, dtype="float64").reshape(4, 6)
    path = tmp_path / "temperature.zarr"
    zfeed.create(path, shape=data.shape, chunks=(2, 3), dtype="float64", dimension_names=["y", "x"],
                 attributes={"units": "K"}, data=data)
    ds = _zfeed(path)
    assert list(ds.data_vars) == ["temperature"]
    assert ds["temperature"].dims == ("y", "x") and ds["temperature"].attrs == {"units": "K"}
    np.testing.assert_array_equal(ds["temperature"].values, data)
    # xr.open_dataarray takes the lone variable.
    np.testing.assert_array_equal(xr.open_dataarray(path, engine="zfeed")[1:3, ::2].values, data[1:3, ::2])

    # Without dimension names a lone array gets xarray's dim_0, dim_1, ...
    bare = tmp_path / "bare.zarr"
    zfeed.create(bare, shape=(3, 2), dtype="int32", zarr_format=2, data=np.ones((3, 2), "int32"))
    ds = _zfeed(bare, mask_and_scale=False)
    assert ds["bare"].dims == ("dim_0", "dim_1")


def test_group_argument_and_missing_dimension_names(tmp_path):
    path = tmp_path / "nested.zarr"
    root = zfeed.create_group(path, attributes={"level": "root"})
    sub = root.create_group("analysis", attributes={"level": "analysis"})
    sub.create_array("t", shape=(5,), dtype="float32", dimension_names=["x"], data=np.arange(5))
    root.create_array("a", shape=(2,), dtype="float32", dimension_names=["y"], data=np.zeros(2))
    root.create_array("unnamed", shape=(3,), dtype="float32", data=np.zeros(3))
    with pytest.raises(KeyError, match="unnamed.*dimension names.*drop_variables"):
        _zfeed(path)
    ds = _zfeed(path, drop_variables=["unnamed"])
    assert list(ds.data_vars) == ["a"] and ds.attrs == {"level": "root"}  # subgroups are not variables
    for group in ("analysis", "/analysis"):
        ds = _zfeed(path, group=group)
        assert ds.attrs == {"level": "analysis"}
        np.testing.assert_array_equal(ds["t"].values, np.arange(5))
        xr.testing.assert_identical(ds, _zarr(path, group="analysis"))


@pytest.mark.parametrize("zarr_format", [2, 3])
def test_a_string_variable_is_named_with_the_way_around_it(tmp_path, zarr_format):
    """zfeed reads numbers only: a string variable stops the open with its name and the
    drop_variables that opens the rest, which then equals the zarr engine's."""
    path = tmp_path / "stations.zarr"
    ds = xr.Dataset({"t2m": (("station",), np.arange(3.0)), "name": (("station",), np.array(["a", "bb", "c"]))})
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        ds.to_zarr(path, mode="w", zarr_format=zarr_format, consolidated=False)
    with pytest.raises(zfeed.ZarrError, match=r"variable 'name': .*unsupported.*drop_variables=\['name'\]"):
        _zfeed(path)
    got = _zfeed(path, drop_variables=["name"])
    assert list(got.data_vars) == ["t2m"]
    xr.testing.assert_identical(got, _zarr(path, drop_variables=["name"]))
    xr.testing.assert_identical(_zfeed(path, drop_variables="name"), got)


def test_opens_read_only(cf_store):
    path, _ = cf_store
    array = _zfeed(path)["t2m"].variable._data
    while not isinstance(array, ZfeedBackendArray):
        array = array.array
    assert array.get_array().read_only


def test_shared_real_data_equals_zarr_engine(shared):
    path = shared / "data" / "ecmwf-t-z-2007-01-01.zarr"
    got = _zfeed(path)
    want = _zarr(path)
    xr.testing.assert_identical(got, want)
    assert set(got.data_vars) == {"t", "z"}
    assert got["t"].encoding["dtype"] == np.dtype("int16") and "scale_factor" in got["t"].encoding
    selection = {"level": 1, "latitude": slice(10, 100, 3), "longitude": slice(None, None, -7)}
    xr.testing.assert_identical(got.isel(selection), want.isel(selection))
    xr.testing.assert_identical(got.sel(level=500, latitude=slice(60, 30)), want.sel(level=500, latitude=slice(60, 30)))


def test_guess_can_open(tmp_path, cf_store):
    entry = ZfeedBackendEntrypoint()
    path, _ = cf_store
    assert entry.guess_can_open(path)
    assert entry.guess_can_open(str(path))
    assert entry.guess_can_open(f"file://{path}")
    assert entry.guess_can_open(zfeed.open(path))

    single = tmp_path / "single.zarr"
    zfeed.create(single, shape=(2,), dtype="int8", zarr_format=2)
    assert entry.guess_can_open(single)
    v3_array = tmp_path / "v3-array"
    zfeed.create(v3_array, shape=(2,), dtype="int8")
    assert entry.guess_can_open(v3_array)

    empty = tmp_path / "empty.zarr"
    empty.mkdir()
    assert not entry.guess_can_open(empty)
    assert not entry.guess_can_open(tmp_path / "absent.zarr")
    nc = tmp_path / "file.nc"
    nc.write_bytes(b"CDF\x01")
    assert not entry.guess_can_open(nc)
    assert not entry.guess_can_open("s3://bucket/store.zarr")
    assert not entry.guess_can_open(b"CDF\x01")
    with open(nc, "rb") as f:
        assert not entry.guess_can_open(f)


def test_a_dataset_opened_with_zfeed_pickles(cf_store):
    """dask's distributed and processes schedulers, and spawned workers, pickle datasets: the
    zfeed arrays pickle by their store's URL and path, and read the same values where unpickled."""
    import pickle

    cf_store, _ = cf_store
    ds = _zfeed(cf_store)
    again = pickle.loads(pickle.dumps(ds))
    xr.testing.assert_identical(again.load(), ds.load())
    array = zfeed.open(cf_store, mode="r")[next(iter(zfeed.open(cf_store).keys()))]
    copy = pickle.loads(pickle.dumps(array))
    assert copy.read_only and copy.path == array.path
    np.testing.assert_array_equal(copy[...], array[...])
    with pytest.raises(TypeError, match="memory store"):
        pickle.dumps(zfeed.create(zfeed.memory_store(), shape=(2,), dtype="float32"))
