"""The Python face of zfeed: open, create, NumPy indexing, attributes, groups, repr, overwrite."""

from __future__ import annotations

import json

import ml_dtypes
import numpy as np
import pytest

import zfeed

zarr = pytest.importorskip("zarr")


@pytest.fixture
def data(seed):
    rng = np.random.default_rng(seed)
    return rng.integers(-1000, 1000, size=(9, 11, 7)).astype("int32")


@pytest.fixture(params=["v3", "v3-sharded", "v2"])
def stored(request, tmp_path, data):
    """The same values in a v3 array, a sharded v3 array and a v2 array, with edge chunks."""
    path = tmp_path / "a.zarr"
    if request.param == "v3":
        arr = zfeed.create(path, shape=data.shape, chunks=(4, 3, 5), dtype="int32")
    elif request.param == "v3-sharded":
        arr = zfeed.create(path, shape=data.shape, chunks=(2, 3, 2), shards=(4, 6, 4), dtype="int32")
    else:
        arr = zfeed.create(path, shape=data.shape, chunks=(4, 3, 5), dtype="int32", zarr_format=2, compressor="blosc:lz4")
    arr[...] = data
    return path, data


INDEXES = [
    np.s_[...],
    np.s_[3],
    np.s_[-1],
    np.s_[-9],
    np.s_[2, 5, 6],
    np.s_[-1, -1, -1],
    np.s_[1:7],
    np.s_[:, 2:9],
    np.s_[..., 3],
    np.s_[..., -2:],
    np.s_[4, ...],
    np.s_[4, ..., 1],
    np.s_[::2, ::3, ::4],
    np.s_[1:8:3, 10:0:-2, :],
    np.s_[::-1],
    np.s_[::-1, ::-1, ::-1],
    np.s_[-3:, :-4, -6:-1:2],
    np.s_[8:1:-3, 3, ::-5],
    np.s_[5:5],  # empty
    np.s_[:, 7:2],  # empty
    np.s_[100:],  # clipped to empty, as NumPy does
    np.s_[-100:3],
    np.s_[2:3, 4:5, 6:7],
]


@pytest.mark.parametrize("index", INDEXES, ids=[repr(i) for i in INDEXES])
def test_getitem_matches_numpy(stored, index):
    path, data = stored
    arr = zfeed.open(path)
    assert isinstance(arr, zfeed.Array)
    got = arr[index]
    want = data[index]
    if np.ndim(want) == 0:
        assert np.ndim(got) == 0 and got == want
        assert np.asarray(got).dtype == want.dtype
    else:
        assert isinstance(got, np.ndarray)
        assert got.dtype == want.dtype
        assert got.shape == want.shape
        np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize("index", [np.s_[9], np.s_[-10], np.s_[0, 11], np.s_[0, 0, 0, 0]])
def test_getitem_out_of_bounds(stored, index):
    path, _ = stored
    with pytest.raises(IndexError):
        zfeed.open(path)[index]


def test_unsupported_index_kinds(stored):
    path, _ = stored
    arr = zfeed.open(path)
    with pytest.raises(IndexError, match="unsupported index 1.5"):
        arr[1.5]
    with pytest.raises(IndexError, match="unsupported index 'x'"):
        arr[0, "x"]
    with pytest.raises(IndexError):
        arr[None]
    with pytest.raises(IndexError):
        arr[..., ...]


SETS = [
    (np.s_[...], lambda shape, rng: rng.integers(0, 100, shape)),
    (np.s_[2], lambda shape, rng: 7),  # a scalar broadcasts
    (np.s_[1:8:2, ::-3], lambda shape, rng: rng.integers(0, 100, shape)),
    (np.s_[..., 4], lambda shape, rng: rng.integers(0, 100, shape[-1:])),  # a row broadcasts
    (np.s_[-1, -2, -3], lambda shape, rng: -5),
    (np.s_[::-1, 5:, :3], lambda shape, rng: rng.integers(0, 100, (1,) + shape[1:])),
]


@pytest.mark.parametrize("index,make", SETS, ids=[repr(s[0]) for s in SETS])
def test_setitem_matches_numpy(stored, index, make, seed):
    path, data = stored
    rng = np.random.default_rng(seed)
    expected = data.copy()
    shape = expected[index].shape
    values = make(shape, rng)
    expected[index] = values
    arr = zfeed.open(path)
    arr[index] = values
    np.testing.assert_array_equal(zfeed.open(path)[...], expected)
    np.testing.assert_array_equal(np.asarray(zarr.open_array(str(path), mode="r")[...]), expected)


def test_setitem_from_read_only_and_other_dtypes(tmp_path):
    arr = zfeed.create(tmp_path / "a", shape=(3, 4), chunks=(2, 2), dtype="float32")
    ro = np.arange(12, dtype="float32").reshape(3, 4)
    ro.flags.writeable = False
    arr[...] = ro
    np.testing.assert_array_equal(arr[...], ro)
    arr[0] = np.arange(4, dtype="int64")  # cast on write
    arr[1] = np.arange(4, dtype=">f4")  # big-endian input
    ints = zfeed.create(tmp_path / "u", shape=(3,), dtype="uint8")
    ints[...] = 7  # a Python int (int64 to NumPy) into unsigned
    ints[1:] = np.array([1, 2])
    np.testing.assert_array_equal(ints[...], [7, 1, 2])
    with pytest.raises(TypeError):
        ints[0] = 2.5  # float into int is refused, not truncated
    np.testing.assert_array_equal(arr[:2], [[0, 1, 2, 3], [0, 1, 2, 3]])
    with pytest.raises(ValueError):
        arr[0] = np.zeros(5)  # does not broadcast


def test_writes_cast_as_numpy_2(tmp_path):
    """A Python integer outside an integer dtype's range raises OverflowError (NumPy 2), never
    wraps around; NumPy integers cast as NumPy casts them; integers go into bool as nonzero."""
    u8 = zfeed.create(tmp_path / "u8", shape=(4,), dtype="uint8", data=np.array([1, 2, 3, 4]))
    i8 = zfeed.create(tmp_path / "i8", shape=(3,), dtype="int8")
    u64 = zfeed.create(tmp_path / "u64", shape=(2,), dtype="uint64")
    for arr, key, value in [(u8, 0, -1), (u8, 1, 300), (u8, slice(0, 2), [1, 300]), (u8, ..., -1),
                            (u8, [0, 2], [5, -2]), (i8, 0, 128), (i8, 0, -129), (u64, 0, -1), (u64, 0, 2**64),
                            (i8, 0, 2**70)]:
        want = np.zeros(arr.shape, arr.dtype)
        with pytest.raises(OverflowError) as numpy_error:
            want[key] = value
        before = arr[...]
        with pytest.raises(OverflowError, match=f"Python integer {value if np.isscalar(value) else ''}"):
            arr[key] = value
        np.testing.assert_array_equal(arr[...], before)
        assert "out of bounds" in str(numpy_error.value) or "too large" in str(numpy_error.value)
    u8[0], u8[1], u8[2:] = 255, 0, [0, 255]  # the ends of the range
    np.testing.assert_array_equal(u8[...], [255, 0, 0, 255])
    u8[0] = np.int64(-1)  # a NumPy integer: NumPy's cast (wraps)
    u8[1:3] = np.array([-1, 256])
    np.testing.assert_array_equal(u8[...], [255, 255, 0, 255])
    u64[...] = 2**64 - 1
    assert u64[0] == 2**64 - 1
    u64[...] = [2**64 - 1, 1]  # a list NumPy alone would make float64
    assert u64[...].tolist() == [2**64 - 1, 1]
    with pytest.raises(OverflowError):
        u64[...] = [2**64, 1]
    flags = zfeed.create(tmp_path / "b", shape=(4,), dtype="bool")
    flags[0] = 1
    np.testing.assert_array_equal(flags[...], [True, False, False, False])
    flags[:] = np.array([0, 2, 0, 1])
    np.testing.assert_array_equal(flags[...], [False, True, False, True])
    flags[[0, 1]] = [-3, 0]
    flags.oindex[[3]] = np.uint8(0)
    np.testing.assert_array_equal(flags[...], [True, False, False, False])
    with pytest.raises(TypeError):
        flags[0] = 0.5  # floats into bool: refused, as floats into integers


def test_assignment_drops_leading_length_one_axes_as_numpy(tmp_path):
    """NumPy takes values with extra leading length-1 axes (np.ones((1, 4)) into a row), in basic,
    orthogonal and points selections alike; a single element still takes a scalar only."""
    rng = np.random.default_rng(3)
    cases = [
        (np.s_[0], (1, 4)),
        (np.s_[0], (1, 1, 4)),
        (np.s_[0, 1:3], (1, 1, 2)),
        (np.s_[1:3], (1, 2, 4)),
        (np.s_[::-1, 2], (1, 3)),
        (np.s_[...], (1, 1, 3, 4)),
        (np.s_[[0, 2], :], (1, 2, 4)),
        (np.s_[:, [1, 3]], (1, 3, 2)),
        (np.s_[[1]], (1, 1, 1, 4)),
        (np.s_[[0, 2], [1, 3]], (1, 2)),
        (np.s_[[[0], [2]], [1, 3]], (1, 2, 2)),
        (np.s_[[0, 2], 1], (1, 1, 2)),
    ]
    for key, shape in cases:
        values = rng.integers(0, 100, shape).astype("float64")
        want = np.zeros((3, 4))
        want[key] = values
        arr = zfeed.create(tmp_path / f"a{len(list(tmp_path.iterdir()))}", shape=(3, 4), chunks=(2, 3), dtype="float64")
        arr[key] = values
        np.testing.assert_array_equal(arr[...], want, err_msg=f"arr[{key}] = values of shape {shape}")
    arr = zfeed.create(tmp_path / "o", shape=(3, 4), chunks=(2, 3), dtype="float64")
    arr.oindex[[0, 2], [1, 3]] = np.arange(4.0).reshape(1, 2, 2)
    want = np.zeros((3, 4))
    want[np.ix_([0, 2], [1, 3])] = np.arange(4.0).reshape(2, 2)
    np.testing.assert_array_equal(arr[...], want)
    arr.vindex[[0, 1], [0, 0]] = np.array([[5.0, 6.0]])
    want[[0, 1], [0, 0]] = [5.0, 6.0]
    np.testing.assert_array_equal(arr[...], want)
    with pytest.raises(ValueError):
        arr[0] = np.ones((2, 1, 4))  # a leading axis longer than 1 still does not broadcast
    with pytest.raises(ValueError):
        arr[0, 0] = np.ones((1, 1))  # NumPy: "setting an array element with a sequence"
    scalar = zfeed.create(tmp_path / "s", shape=(), dtype="float64")
    scalar[...] = np.full((1, 1), 2.5)
    assert scalar[()] == 2.5


@pytest.mark.parametrize("dtype", ["bool", "int8", "int16", "int32", "int64", "uint8", "uint16", "uint32", "uint64",
                                   "float16", "bfloat16", "float32", "float64", "complex64", "complex128"])
def test_dtypes_and_0d(tmp_path, dtype):
    np_dtype = np.dtype(ml_dtypes.bfloat16) if dtype == "bfloat16" else np.dtype(dtype)
    arr = zfeed.create(tmp_path / "a", shape=(5,), chunks=(2,), dtype=dtype)
    assert arr.dtype == np_dtype
    values = (np.arange(5) % 2).astype(np_dtype)
    arr[...] = values
    got = arr[...]
    assert got.dtype == np_dtype
    np.testing.assert_array_equal(got.astype(np.float64) if dtype == "bfloat16" else got, values.astype(np.float64) if dtype == "bfloat16" else values)
    # np dtype objects work as well as names
    same = zfeed.create(tmp_path / "b", shape=(), dtype=np_dtype)
    assert same.shape == () and same.ndim == 0 and same.size == 1
    same[...] = values[1]
    scalar = same[...]
    assert np.ndim(scalar) == 0 and np.asarray(scalar).dtype == np_dtype and scalar == values[1]
    assert same[()] == values[1]


def test_open_returns_group_or_array(tmp_path):
    root = zfeed.create_group(tmp_path / "g", attributes={"title": "t"})
    root.create_group("sub").create_array("inner", shape=(2,), dtype="uint8")
    root.create_array("top", shape=(3, 3), dtype="float64")
    assert isinstance(zfeed.open(tmp_path / "g"), zfeed.Group)
    assert isinstance(zfeed.open(tmp_path / "g", path="top"), zfeed.Array)
    assert isinstance(zfeed.open(tmp_path / "g", path="sub"), zfeed.Group)
    assert isinstance(zfeed.open(tmp_path / "g", path="sub/inner"), zfeed.Array)
    assert isinstance(zfeed.open(str(tmp_path / "g")), zfeed.Group)  # str paths too
    assert isinstance(zfeed.open_array(tmp_path / "g", "top"), zfeed.Array)
    assert isinstance(zfeed.open_group(tmp_path / "g", "sub"), zfeed.Group)
    with pytest.raises(zfeed.ZarrError):
        zfeed.open_array(tmp_path / "g", "sub")
    with pytest.raises(zfeed.ZarrError):
        zfeed.open(tmp_path / "nothing-here")
    with pytest.raises(zfeed.NodeNotFoundError):
        zfeed.open(tmp_path / "g", path="absent")


def test_create_arguments(tmp_path):
    arr = zfeed.create(
        tmp_path / "a", shape=(10, 12), chunks=(3, 5), shards=(6, 10), dtype="int16",
        compressor="gzip:4", fill_value=-7, dimension_names=["y", "x"], attributes={"units": "K"},
    )
    assert arr.shape == (10, 12) and arr.chunks == (3, 5) and arr.shards == (6, 10)
    assert arr.dtype == np.int16 and arr.fill_value == -7 and arr.zarr_format == 3
    assert arr.dimension_names == ("y", "x")
    assert arr.attrs == {"units": "K"}
    np.testing.assert_array_equal(arr[...], np.full((10, 12), -7, "int16"))  # nothing written yet: fill
    meta = json.loads((tmp_path / "a" / "zarr.json").read_text())
    assert meta["codecs"][0]["name"] == "sharding_indexed"
    assert [c["name"] for c in meta["codecs"][0]["configuration"]["codecs"]] == ["bytes", "gzip"]
    assert meta["dimension_names"] == ["y", "x"]
    # zarr-python agrees on everything
    z = zarr.open_array(str(tmp_path / "a"), mode="r")
    assert z.shape == (10, 12) and z.chunks == (3, 5) and z.shards == (6, 10) and z.fill_value == -7
    assert z.metadata.dimension_names == ("y", "x") and dict(z.attrs) == {"units": "K"}


def test_create_codecs_list(tmp_path):
    codecs = [
        {"name": "transpose", "configuration": {"order": [1, 0]}},
        {"name": "bytes", "configuration": {"endian": "big"}},
        {"name": "blosc", "configuration": {"cname": "zstd", "clevel": 3, "shuffle": "bitshuffle", "typesize": 8, "blocksize": 0}},
        {"name": "crc32c"},
    ]
    data = np.arange(30, dtype="float64").reshape(5, 6) / 7
    arr = zfeed.create(tmp_path / "a", shape=data.shape, chunks=(2, 4), dtype="float64", codecs=codecs, data=data)
    assert [c["name"] for c in arr.codecs] == ["transpose", "bytes", "blosc", "crc32c"]
    np.testing.assert_array_equal(arr[...], data)
    np.testing.assert_array_equal(np.asarray(zarr.open_array(str(tmp_path / "a"), mode="r")[...]), data)


@pytest.mark.parametrize("dtype,fill,why", [
    ("int32", 1.5, "not an integer"),
    ("int32", float("nan"), "not an integer"),
    ("int32", "3", "give an integer"),
    ("int8", 300, r"outside \[-128, 127\]"),
    ("uint8", -1, r"outside \[0, 255\]"),
    ("uint64", 2**64, "outside"),
    ("bool", "no", "give True or False"),
    ("bool", 2, "give True or False"),
    ("float32", 1e39, "beyond the range of float32"),
    ("float16", 70000.0, "beyond the range of float16"),
    ("complex64", complex(0, 1e39), "beyond the range of float32"),
])
@pytest.mark.parametrize("zarr_format", [2, 3])
def test_create_refuses_a_fill_value_the_dtype_cannot_hold(tmp_path, dtype, fill, why, zarr_format):
    """A fill value is stored as given or refused: never rounded (1.5 into int32 was 1), taken
    loosely ("no" as True) or made an infinity (1e39 into float32)."""
    with pytest.raises(zfeed.ZarrError, match=f"fill_value .* does not fit data type {dtype}: {why}"):
        zfeed.create(tmp_path / "a", shape=(2,), dtype=dtype, fill_value=fill, zarr_format=zarr_format)
    assert not (tmp_path / "a").exists()


@pytest.mark.parametrize("dtype,fill,stored", [
    ("int32", 2.0, 2),
    ("int16", np.int64(-5), -5),
    ("uint64", np.uint64(2**64 - 1), 2**64 - 1),
    ("int64", -2**63, -2**63),
    ("bool", np.True_, True),
    ("bool", 0, False),
    ("float16", 65504.0, 65504.0),
    ("float32", "-inf", -np.inf),
    ("float32", 1e-50, 0.0),  # rounds to zero, as any float rounds: in range
])
def test_create_takes_a_fill_value_the_dtype_holds(tmp_path, dtype, fill, stored):
    arr = zfeed.create(tmp_path / "a", shape=(2,), dtype=dtype, fill_value=fill)
    assert arr.fill_value == stored and type(arr[0].item()) is type(np.dtype(dtype).type(0).item())
    np.testing.assert_array_equal(arr[...], np.full(2, stored, dtype=dtype))


@pytest.mark.parametrize("zarr_format", [2, 3])
def test_create_takes_order_C_or_F_only(tmp_path, zarr_format):
    """order="X" (or "f") was taken as C order for Zarr v3; both formats now refuse it."""
    data = np.arange(6, dtype="int32").reshape(2, 3)
    for order in ("C", "F"):
        arr = zfeed.create(tmp_path / order, shape=(2, 3), dtype="int32", order=order, zarr_format=zarr_format,
                           data=data)
        np.testing.assert_array_equal(zfeed.open(tmp_path / order)[...], data)
    for order in ("X", "f", "c", None):
        with pytest.raises(zfeed.ZarrError, match=f"order must be 'C' or 'F', got {order!r}"):
            zfeed.create(tmp_path / f"bad-{order}", shape=(2, 3), dtype="int32", order=order, zarr_format=zarr_format)


def test_asarray_of_an_array(tmp_path):
    """np.asarray / np.array read the whole array: a 0-d Array gives a 0-d ndarray (not a NumPy
    scalar, which NumPy refuses from __array__), dtype converts, and NumPy 2's copy keyword is
    honoured (every read is a new array, so copy=False needs no copy)."""
    scalar = zfeed.create(tmp_path / "s", shape=(), dtype="float32", fill_value=2.5)
    for got in (np.asarray(scalar), np.array(scalar), np.asarray(scalar, copy=False), np.array(scalar, copy=True)):
        assert type(got) is np.ndarray and got.shape == () and got.dtype == np.float32 and got == 2.5
    as_float64 = np.asarray(scalar, dtype="float64")
    assert as_float64.shape == () and as_float64.dtype == np.float64 and as_float64 == 2.5
    data = np.arange(12, dtype="int16").reshape(3, 4)
    arr = zfeed.create(tmp_path / "a", shape=data.shape, chunks=(2, 3), dtype="int16", data=data)
    for got in (np.asarray(arr), np.asarray(arr, copy=False), np.array(arr, copy=True)):
        assert type(got) is np.ndarray and got.dtype == np.int16
        np.testing.assert_array_equal(got, data)
    got = np.asarray(arr, dtype="float32", copy=False)
    assert got.dtype == np.float32
    np.testing.assert_array_equal(got, data)
    first, second = np.asarray(arr), np.asarray(arr)
    first[0, 0] = 99  # each read is an array of its own
    assert second[0, 0] == 0 and arr[0, 0] == 0


@pytest.mark.filterwarnings("ignore:Numcodecs codecs are not in the Zarr")
@pytest.mark.parametrize("compressor", [None, "none", "zstd", "zstd:7", "gzip:2", "blosc", "blosc:zstd:3", "zlib", "lz4"])
@pytest.mark.parametrize("zarr_format", [2, 3])
def test_create_compressor(tmp_path, compressor, zarr_format):
    data = np.linspace(0, 1, 40, dtype="float32").reshape(5, 8)
    arr = zfeed.create(tmp_path / "a", shape=data.shape, chunks=(2, 3), dtype="float32", compressor=compressor,
                       zarr_format=zarr_format)
    arr[...] = data
    np.testing.assert_array_equal(zfeed.open(tmp_path / "a")[...], data)
    np.testing.assert_array_equal(np.asarray(zarr.open_array(str(tmp_path / "a"), mode="r")[...]), data)


def test_create_v2(tmp_path):
    arr = zfeed.create(tmp_path / "a", shape=(5, 7), chunks=(2, 3), dtype="float64", zarr_format=2,
                       compressor="zlib:3", order="F", fill_value=float("nan"), dimension_names=["a", "b"],
                       attributes={"k": [1, 2]}, chunk_key_encoding="/")
    zarray = json.loads((tmp_path / "a" / ".zarray").read_text())
    zattrs = json.loads((tmp_path / "a" / ".zattrs").read_text())
    assert zarray["zarr_format"] == 2 and zarray["order"] == "F" and zarray["dtype"] == "<f8"
    assert zarray["compressor"]["id"] == "zlib" and zarray["fill_value"] == "NaN"
    assert zarray["dimension_separator"] == "/" and zarray["filters"] is None
    assert zattrs == {"k": [1, 2], "_ARRAY_DIMENSIONS": ["a", "b"]}
    assert arr.zarr_format == 2 and np.isnan(arr.fill_value)
    assert arr.dimension_names == ("a", "b")
    assert np.isnan(arr[...]).all()
    arr[1:4, 2:6] = 1.5
    assert (tmp_path / "a" / "0" / "0").exists()  # "/" separator
    z = zarr.open_array(str(tmp_path / "a"), mode="r")
    expected = np.full((5, 7), np.nan)
    expected[1:4, 2:6] = 1.5
    np.testing.assert_array_equal(np.asarray(z[...]), expected)
    with pytest.raises(zfeed.ZarrError):
        zfeed.create(tmp_path / "b", shape=(4,), shards=(4,), zarr_format=2)
    with pytest.raises(zfeed.ZarrError):
        zfeed.create(tmp_path / "c", shape=(4,), dtype="bfloat16", zarr_format=2)


def test_repr_shows_the_layout(tmp_path):
    arr = zfeed.create(tmp_path / "a", shape=(10, 12), chunks=(3, 5), shards=(6, 10), dtype="int16",
                       compressor="zstd:3", dimension_names=["y", "x"])
    text = repr(arr)
    for part in ["(10, 12)", "int16", "(3, 5)", "shards=(6, 10)", "zstd", "bytes", "'y', 'x'"]:
        assert part in text, (part, text)
    plain = repr(zfeed.create(tmp_path / "b", shape=(4,), chunks=(2,), dtype="uint8", compressor="gzip:1"))
    assert "(4,)" in plain and "uint8" in plain and "(2,)" in plain and "gzip" in plain and "shards" not in plain
    v2 = repr(zfeed.create(tmp_path / "c", shape=(4,), chunks=(2,), dtype="uint8", compressor="blosc", zarr_format=2))
    assert "blosc" in v2 and "zarr_format=2" in v2
    group = zfeed.create_group(tmp_path / "g")
    group.create_array("t", shape=(1,))
    assert "t" in repr(group)


@pytest.mark.parametrize("zarr_format", [2, 3])
def test_attributes_read_write(tmp_path, zarr_format):
    arr = zfeed.create(tmp_path / "a", shape=(2,), dtype="int8", zarr_format=zarr_format, attributes={"x": 1})
    assert arr.attrs == {"x": 1}
    arr.attrs["units"] = "m s-1"
    arr.attrs.update({"scale": 0.5, "nested": {"list": [1, None, "s"]}})
    del arr.attrs["x"]
    reopened = zfeed.open(tmp_path / "a")
    assert reopened.attrs == {"units": "m s-1", "scale": 0.5, "nested": {"list": [1, None, "s"]}}
    assert dict(zarr.open_array(str(tmp_path / "a"), mode="r").attrs) == reopened.attrs
    reopened.attrs.put({"only": True})
    assert zfeed.open(tmp_path / "a").attrs == {"only": True}
    group = zfeed.create_group(tmp_path / "g", zarr_format=zarr_format, attributes={"title": "x"})
    group.attrs["history"] = "made by a test"
    assert zfeed.open(tmp_path / "g").attrs == {"title": "x", "history": "made by a test"}


@pytest.mark.parametrize("zarr_format", [2, 3])
def test_every_attribute_change_is_written(tmp_path, zarr_format):
    """pop, popitem, setdefault, clear and |= write the metadata as item assignment does; the
    attributes still compare, print and serialize as the dict they are."""
    arr = zfeed.create(tmp_path / "a", shape=(2,), dtype="int8", zarr_format=zarr_format,
                       attributes={"a": 1, "b": 2, "c": 3})

    def stored():
        return zfeed.open(tmp_path / "a").attrs

    attrs = arr.attrs
    assert attrs.pop("a") == 1 and stored() == {"b": 2, "c": 3}
    assert attrs.pop("absent", "default") == "default" and stored() == {"b": 2, "c": 3}
    with pytest.raises(KeyError):
        attrs.pop("absent")
    assert attrs.setdefault("d", [4]) == [4] and stored() == {"b": 2, "c": 3, "d": [4]}
    assert attrs.setdefault("b", 99) == 2 and stored()["b"] == 2
    assert attrs.popitem() == ("d", [4]) and stored() == {"b": 2, "c": 3}
    attrs |= {"e": {"f": None}}
    assert isinstance(attrs, zfeed.array.Attributes) and stored() == {"b": 2, "c": 3, "e": {"f": None}}
    attrs.update(g=1.5)
    assert stored() == {"b": 2, "c": 3, "e": {"f": None}, "g": 1.5}
    assert dict(zarr.open_array(str(tmp_path / "a"), mode="r").attrs) == stored()
    attrs.clear()
    assert stored() == {} and attrs == {}
    with pytest.raises(KeyError):
        attrs.popitem()
    # A value JSON cannot hold: an error, and neither the attributes nor the metadata change.
    attrs["kept"] = 1
    with pytest.raises(TypeError):
        attrs["bad"] = object()
    with pytest.raises(TypeError):
        attrs.update(bad={1, 2})
    assert attrs == {"kept": 1} and stored() == {"kept": 1}
    # Still a dict to its users.
    assert attrs == {"kept": 1} and {"kept": 1} == attrs and repr(attrs) == "{'kept': 1}"
    assert json.loads(json.dumps(attrs)) == {"kept": 1}
    # |= on the node's attribute, and assigning a whole dict.
    arr.attrs |= {"more": [1, 2]}
    assert stored() == {"kept": 1, "more": [1, 2]}
    arr.attrs = {"only": "this"}
    assert stored() == {"only": "this"}
    group = zfeed.create_group(tmp_path / "g", zarr_format=zarr_format, attributes={"title": "x", "n": 1})
    group.attrs.pop("n")
    group.attrs.setdefault("history", "made by a test")
    assert zfeed.open(tmp_path / "g").attrs == {"title": "x", "history": "made by a test"}
    group.attrs |= {"n": 2}
    assert zfeed.open(tmp_path / "g").attrs == {"title": "x", "history": "made by a test", "n": 2}


def test_open_modes(tmp_path):
    """mode="r" reads only; "r+" (the default) reads and writes an existing node; "a" opens or
    creates a group; "w" replaces with a new group; "w-" creates one where nothing is; any other
    mode is an error."""
    root = zfeed.create_group(tmp_path / "g", attributes={"title": "t"})
    data = np.arange(12, dtype="float32").reshape(3, 4)
    root.create_array("t", shape=(3, 4), chunks=(2, 2), dtype="float32", data=data, attributes={"units": "K"})
    read_only = zfeed.open(tmp_path / "g", mode="r")
    arr = read_only["t"]
    assert read_only.read_only and arr.read_only
    np.testing.assert_array_equal(arr[...], data)  # reads as ever
    writes = [
        lambda: arr.__setitem__(0, 1.0),
        lambda: arr.__setitem__(([0, 2], slice(None)), 1.0),
        lambda: arr.oindex.__setitem__(([0, 2], [1]), 1.0),
        lambda: arr.vindex.__setitem__(([0, 2], [1, 3]), 1.0),
        lambda: arr.vindex.__setitem__(np.s_[0, :], 1.0),
        lambda: arr.attrs.__setitem__("units", "C"),
        lambda: arr.attrs.pop("units"),
        lambda: arr.attrs.clear(),
        lambda: read_only.attrs.update(title="u"),
        lambda: setattr(read_only, "attrs", {}),
        lambda: read_only.create_array("new", shape=(2,)),
        lambda: read_only.create_group("new"),
        lambda: read_only.consolidate(),
        lambda: zfeed.open(tmp_path / "g", path="t", mode="r").__setitem__(..., 0.0),
        lambda: zfeed.open_array(tmp_path / "g", "t", mode="r").__setitem__(..., 0.0),
        lambda: zfeed.open_group(tmp_path / "g", mode="r")["t"].__setitem__(..., 0.0),
    ]
    for write in writes:
        with pytest.raises(zfeed.ZarrError, match="read-only .*mode='r'"):
            write()
    assert arr.attrs == {"units": "K"}  # unchanged, also locally
    assert arr.attrs.setdefault("units", "C") == "K"  # a no-op reads
    after = zfeed.open(tmp_path / "g")
    np.testing.assert_array_equal(after["t"][...], data)
    assert after.attrs == {"title": "t"} and after["t"].attrs == {"units": "K"} and list(after) == ["t"]
    # The default, "r+", writes as before; so do open_array and open_group.
    for writable in (zfeed.open(tmp_path / "g")["t"], zfeed.open(tmp_path / "g", path="t", mode="r+"),
                     zfeed.open_array(tmp_path / "g", "t"), zfeed.open_group(tmp_path / "g", mode="r+")["t"]):
        assert not writable.read_only
        writable[0, 0] = 7.0
        assert zfeed.open(tmp_path / "g", mode="r")["t"][0, 0] == 7.0
    with pytest.raises(zfeed.NodeNotFoundError):
        zfeed.open(tmp_path / "absent", mode="r+")
    assert not (tmp_path / "absent").exists()
    # "a": opens what is there, else creates a group.
    assert zfeed.open(tmp_path / "g", path="t", mode="a")[0, 0] == 7.0
    made = zfeed.open(tmp_path / "new.zarr", mode="a")
    assert isinstance(made, zfeed.Group) and len(made) == 0 and not made.read_only
    made.create_array("x", shape=(2,), dtype="int8")
    assert zfeed.open_group(tmp_path / "new.zarr", mode="a").keys() == ["x"]
    # "w-": a new group, never over a node; "w": a new group, replacing what was there.
    with pytest.raises(zfeed.ZarrError, match="mode='w-'.*already a Zarr group"):
        zfeed.open(tmp_path / "new.zarr", mode="w-")
    with pytest.raises(zfeed.ZarrError, match="mode='w-'.*already a Zarr array"):
        zfeed.open(tmp_path / "g", path="t", mode="w-")
    assert len(zfeed.open(tmp_path / "fresh.zarr", mode="w-")) == 0
    replaced = zfeed.open(tmp_path / "new.zarr", mode="w")
    assert isinstance(replaced, zfeed.Group) and len(replaced) == 0
    assert zfeed.open(tmp_path / "new.zarr").keys() == []
    with pytest.raises(zfeed.ZarrError, match="is an array, not a group"):
        zfeed.open_group(tmp_path / "g", "t", mode="a")
    for bad in ("x", "rw", "R", None):
        with pytest.raises(zfeed.ZarrError, match=r"open: mode must be one of 'r', 'r\+', 'a', 'w', 'w-', got"):
            zfeed.open(tmp_path / "g", mode=bad)
    with pytest.raises(zfeed.ZarrError, match=r"open_array: mode must be one of 'r', 'r\+', got 'w'"):
        zfeed.open_array(tmp_path / "g", "t", mode="w")
    np.testing.assert_array_equal(zfeed.open(tmp_path / "g")["t"][1:], data[1:])  # untouched by the errors


@pytest.mark.parametrize("zarr_format", [2, 3])
def test_group_members_and_consolidation(tmp_path, zarr_format):
    root = zfeed.create_group(tmp_path / "g", zarr_format=zarr_format)
    t = root.create_array("t", shape=(4, 5), chunks=(2, 5), dtype="float32", dimension_names=["lat", "lon"])
    t[...] = np.arange(20, dtype="float32").reshape(4, 5)
    sub = root.create_group("sub", attributes={"kind": "levels"})
    sub.create_array("z", shape=(3,), dtype="int64")
    assert sorted(root.keys()) == ["sub", "t"]
    assert "t" in root and "absent" not in root and len(root) == 2
    assert [n for n, _ in root.arrays()] == ["t"] and [n for n, _ in root.groups()] == ["sub"]
    assert isinstance(root["sub/z"], zfeed.Array) and root["sub/z"].path == "sub/z"
    with pytest.raises(KeyError):
        root["absent"]
    assert "t" in root.tree() and "z" in root.tree()

    root.consolidate()
    if zarr_format == 3:
        meta = json.loads((tmp_path / "g" / "zarr.json").read_text())
        assert set(meta["consolidated_metadata"]["metadata"]) >= {"t", "sub", "sub/z"}
    else:
        zmeta = json.loads((tmp_path / "g" / ".zmetadata").read_text())
        assert {"t/.zarray", "sub/.zgroup", "sub/z/.zarray"} <= set(zmeta["metadata"])
    reopened = zfeed.open(tmp_path / "g")
    assert reopened._core.is_consolidated
    assert sorted(reopened.keys()) == ["sub", "t"]
    np.testing.assert_array_equal(reopened["t"][...], np.arange(20, dtype="float32").reshape(4, 5))
    assert reopened["t"].dimension_names == ("lat", "lon")
    assert reopened["sub"].attrs == {"kind": "levels"}
    # The members are found from the consolidated metadata alone: drop a member's own metadata.
    (tmp_path / "g" / "sub" / "z" / ("zarr.json" if zarr_format == 3 else ".zarray")).unlink()
    assert zfeed.open(tmp_path / "g")["sub/z"].shape == (3,)
    # zarr-python reads zfeed's consolidated metadata
    zg = zarr.open_consolidated(str(tmp_path / "g"), zarr_format=zarr_format)
    assert sorted(zg.keys()) == ["sub", "t"]


def test_overwrite(tmp_path):
    arr = zfeed.create(tmp_path / "a", shape=(4,), dtype="int32", data=np.arange(4))
    with pytest.raises(zfeed.ZarrError, match="exists"):
        zfeed.create(tmp_path / "a", shape=(8,), dtype="int32")
    np.testing.assert_array_equal(zfeed.open(tmp_path / "a")[...], np.arange(4))  # untouched
    new = zfeed.create(tmp_path / "a", shape=(3, 3), dtype="float64", overwrite=True)
    assert new.shape == (3, 3) and (new[...] == 0).all()  # old chunks do not leak into the new array
    group = zfeed.create_group(tmp_path / "g")
    group.create_array("x", shape=(2,))
    with pytest.raises(zfeed.ZarrError, match="exists"):
        group.create_array("x", shape=(2,))
    zfeed.create_group(tmp_path / "g")  # a group over a group is kept, members and all
    assert "x" in zfeed.open(tmp_path / "g")
    with pytest.raises(zfeed.ZarrError, match="exists"):
        zfeed.create_group(tmp_path / "a")  # but not a group over an array
    with pytest.raises(zfeed.ZarrError, match="exists"):
        zfeed.create(tmp_path / "g", shape=(2,))  # nor an array over a group
    zfeed.create_group(tmp_path / "g", overwrite=True)
    assert "x" not in zfeed.open(tmp_path / "g")
    del arr


def test_info_and_properties(tmp_path):
    arr = zfeed.create(tmp_path / "a", shape=(8, 8), chunks=(4, 4), dtype="float32", compressor="zstd:1")
    arr[:4, :4] = 1.0
    info = arr.info()
    assert info["objects_present"] == 1 and info["objects_total"] == 4
    assert info["decoded_bytes"] == 8 * 8 * 4 and 0 < info["stored_bytes"] < 4 * 4 * 4
    assert arr.nbytes == 256 and len(arr) == 8 and arr.name == "/"
    np.testing.assert_array_equal(np.asarray(arr)[:4, :4], np.ones((4, 4)))


def test_memory_store():
    store = zfeed.memory_store()
    arr = zfeed.create(store, shape=(6,), chunks=(4,), dtype="uint16", data=np.arange(6))
    np.testing.assert_array_equal(zfeed.open(store)[...], np.arange(6))
    assert sorted(store.list()) == ["c/0", "c/1", "zarr.json"]
    del arr


def test_importing_after_eccodes_wheels_exits_cleanly():
    # ecCodes' wheels bundle their own OpenLDAP; zfeed's libnetcdf -> libcurl loads the system's.
    # Loaded in this order (as xarray does when it lists cfgrib's engine first) the process used to
    # crash at exit. zfeed binds its own dependencies then (see zfeed/__init__.py).
    pytest.importorskip("eccodes")
    import subprocess
    import sys
    result = subprocess.run([sys.executable, "-c", "import eccodes, zfeed; print('ok')"], capture_output=True,
                            text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "ok"

